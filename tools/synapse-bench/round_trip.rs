//! `round-trip`: A asks B, B replies, A sees and acknowledges the reply.
//!
//! Every call through the typed client over the broker's Unix socket, after a few untimed
//! warm-up rounds (`round_trip_*`).

use crate::common::{
    Agent, BenchDir, BrokerProcess, Options, Samples, SynapseEnv, ack_as, register_agent, reply_body, result,
};
use anyhow::{Context, Result, bail};
use std::time::{Duration, Instant};
use synapse::api::{self, SendRequest as SendBody};
use synapse::client::Client;

/// Timed round trips in `round-trip` (after a few untimed warm-up ones).
const ROUND_TRIPS: usize = 1000;
const ROUND_TRIP_WARMUP: usize = 10;

pub async fn run(options: &Options) -> Result<()> {
    let dir = BenchDir::new("round-trip")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env, dir.root.join("broker.log")).await?;
    let mut http = broker.connect().await?;
    let a = register_agent(&mut http).await?;
    let b = register_agent(&mut http).await?;
    println!("A = {} (port {}), B = {} (port {})", a.id, a.port, b.id, b.port);

    let mut durations = Vec::with_capacity(ROUND_TRIPS);
    let mut steps: [Vec<Duration>; 4] = Default::default();
    for round in 0..ROUND_TRIP_WARMUP + ROUND_TRIPS {
        let started = Instant::now();
        let step_times =
            one_round_trip(&mut http, &a, &b, round).await.with_context(|| format!("round trip {round}"))?;
        if round >= ROUND_TRIP_WARMUP {
            durations.push(started.elapsed());
            for (samples, time) in steps.iter_mut().zip(step_times) {
                samples.push(time);
            }
        }
    }
    drop(http);
    broker.stop()?;

    let samples = Samples::new(durations);
    println!(
        "send (reply expected) + reply + inbox long-poll + ack, {ROUND_TRIP_WARMUP} warm-up rounds not counted: {}",
        samples.summary()
    );
    let [send, reply, inbox, ack] = steps.map(Samples::new);
    println!(
        "step medians: POST /send {:.3} ms, POST /reply {:.3} ms, GET inbox {:.3} ms, POST ack {:.3} ms",
        send.median(),
        reply.median(),
        inbox.median(),
        ack.median()
    );
    result("round_trip_p50_ms", samples.median(), 3, "ms");
    result("round_trip_p99_ms", samples.percentile(99.0), 3, "ms");
    Ok(())
}

/// One round trip; returns how long each of its four requests took.
async fn one_round_trip(http: &mut Client, a: &Agent, b: &Agent, round: usize) -> Result<[Duration; 4]> {
    let mut step = Instant::now();
    let mut lap = || {
        let now = Instant::now();
        let elapsed = now - step;
        step = now;
        elapsed
    };
    let request = SendBody {
        from: Some(a.id.clone()),
        secret: Some(a.secret.clone()),
        response_expected: true,
        ..SendBody::new(b.id.clone(), format!("round trip {round}: what is the status of your task?"))
    };
    let sent = http.send(&request).await?;
    let sender_task = sent.sender_task.context("the send answer has no sender_task")?.id;
    let sent_time = lap();
    http.reply(&reply_body(b, format!("answer {round}: done"))).await?;
    let reply_time = lap();

    let waiting = Instant::now();
    let ticket = loop {
        let inbox = http.inbox(&a.id, 5000, None).await?;
        let found = inbox
            .tickets
            .iter()
            .find(|ticket| ticket.kind == api::TicketKind::Reply && ticket.task_id == sender_task)
            .map(|ticket| ticket.ticket);
        if let Some(ticket) = found {
            break ticket;
        }
        if waiting.elapsed() > Duration::from_secs(10) {
            bail!("the reply ticket for task {sender_task} did not reach {}'s inbox within 10 s: {inbox:?}", a.id);
        }
    };
    let inbox_time = lap();
    ack_as(http, a, ticket).await?;
    Ok([sent_time, reply_time, inbox_time, lap()])
}
