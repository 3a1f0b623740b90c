//! `sse-fanout`: many subscribers on /events while events are appended.
//!
//! Each event's lag is its receive time minus its time in the log, over every subscriber
//! (`sse_fanout_p99_ms`). Then its floor (issue 16): a bare axum SSE broadcast over a Unix socket
//! of as many events of [`FLOOR_EVENT_BYTES`] bytes, at the rate the broker appended them, to
//! as many subscribers, read by the same subscriber code (`floor_sse_p99_ms`).

use crate::common::{BenchDir, BrokerProcess, Http, Options, Samples, SynapseEnv, register_agent, result};
use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::HOST;
use hyper::{Method, Request};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use synapse::api::StatusUpdate;
use synapse::client::Client;
use synapse::event::AgentStatus;

/// `sse-fanout`: subscribers on `/events`, events appended, concurrent appenders.
const FANOUT_SUBSCRIBERS: usize = 1000;
const FANOUT_EVENTS: usize = 5000;
const FANOUT_APPENDERS: usize = 16;
/// Bytes of one event of the bare broadcast: about a status change's JSON.
const FLOOR_EVENT_BYTES: usize = 300;

fn unix_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

/// One subscriber: reads `/events` from `after` until it has `wanted` events; returns each
/// event's lag (receive time minus the event's time, in ms).
async fn subscriber(socket: PathBuf, after: u64, wanted: usize, ready: Arc<tokio::sync::Barrier>) -> Result<Vec<f64>> {
    let mut http = Http::unix(&socket).await?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(format!("/events?after={after}&follow=true"))
        .header(HOST, "localhost")
        .body(Full::new(Bytes::new()))?;
    http.sender.ready().await?;
    let response = http.sender.send_request(request).await?;
    ready.wait().await;
    let mut body = response.into_body();
    let mut buffer = Vec::new();
    let mut lags = Vec::with_capacity(wanted);
    while lags.len() < wanted {
        let Some(frame) = body.frame().await else { bail!("the stream ended after {} events", lags.len()) };
        let frame = frame?;
        let Some(data) = frame.data_ref() else { continue };
        buffer.extend_from_slice(data);
        while let Some(end) = buffer.windows(2).position(|pair| pair == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            // Only the time is needed: find it without parsing the whole event (the client
            // shares the machine's two cores with the broker it measures).
            if let Some(json) = text.lines().find_map(|line| line.strip_prefix("data:")) {
                let at = json.find("\"time_ms\":").context("an event without time_ms")? + "\"time_ms\":".len();
                let digits: String = json[at..].chars().take_while(char::is_ascii_digit).collect();
                let time_ms: f64 = digits.parse().context("a bad time_ms")?;
                lags.push((unix_ms() - time_ms).max(0.0));
            }
        }
    }
    Ok(lags)
}

pub async fn run(options: &Options) -> Result<()> {
    let dir = BenchDir::new("sse-fanout")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env.clone(), dir.root.join("broker.log")).await?;
    let mut http = broker.connect().await?;
    let mut agents = Vec::new();
    for _ in 0..FANOUT_APPENDERS {
        agents.push(register_agent(&mut http).await?);
    }
    let head = http.health().await?.head;
    let ready = Arc::new(tokio::sync::Barrier::new(FANOUT_SUBSCRIBERS + 1));
    let socket = env.broker_socket();
    let subscribers: Vec<_> = (0..FANOUT_SUBSCRIBERS)
        .map(|_| tokio::spawn(subscriber(socket.clone(), head, FANOUT_EVENTS, ready.clone())))
        .collect();
    ready.wait().await;
    println!(
        "{FANOUT_SUBSCRIBERS} subscribers connected; appending {FANOUT_EVENTS} events from {FANOUT_APPENDERS} appenders"
    );
    let started = Instant::now();
    let per_appender = FANOUT_EVENTS / FANOUT_APPENDERS;
    let appenders: Vec<_> = agents
        .into_iter()
        .enumerate()
        .map(|(index, agent)| {
            let socket = socket.clone();
            let count = per_appender + usize::from(index < FANOUT_EVENTS % FANOUT_APPENDERS);
            tokio::spawn(async move {
                let mut http = Client::at_socket(&socket).await?;
                http.set_secret(agent.secret.clone());
                for round in 0..count {
                    let status = if round % 2 == 0 { AgentStatus::Ready } else { AgentStatus::Processing };
                    http.set_status(&agent.id, &StatusUpdate { status, note: None }).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for appender in appenders {
        appender.await??;
    }
    let appended = started.elapsed();
    let mut lags = Vec::with_capacity(FANOUT_SUBSCRIBERS * FANOUT_EVENTS);
    for subscriber in subscribers {
        lags.extend(subscriber.await??);
    }
    let all = started.elapsed();
    drop(http);
    broker.stop()?;
    let delivered = lags.len();
    let samples = Samples::from_millis(lags);
    println!(
        "{FANOUT_EVENTS} events appended in {:.2} s; all {delivered} deliveries done after {:.2} s; lag: {}",
        appended.as_secs_f64(),
        all.as_secs_f64(),
        samples.summary()
    );
    result("sse_fanout_p99_ms", samples.percentile(99.0), 3, "ms");
    let floor = bare_broadcast(FANOUT_EVENTS, appended).await?;
    println!("bare SSE broadcast, same events, rate and subscribers: lag {}", floor.summary());
    result("floor_sse_p99_ms", floor.percentile(99.0), 3, "ms");
    Ok(())
}

/// The floor of `sse-fanout`: `events` events spread evenly over `over`, broadcast by a bare
/// axum SSE handler to [`FANOUT_SUBSCRIBERS`] subscribers on a Unix socket; their lags.
async fn bare_broadcast(events: usize, over: std::time::Duration) -> Result<Samples> {
    let dir = BenchDir::new("sse-floor")?;
    let socket = dir.uds().join("floor.sock");
    // Room for every event: a subscriber never misses one, as on the broker.
    let (sender, _) = tokio::sync::broadcast::channel::<Arc<str>>(events + 16);
    let handler_sender = sender.clone();
    let app = axum::Router::new().route(
        "/events",
        axum::routing::get(move || {
            let mut receiver = handler_sender.subscribe();
            async move {
                // Each wake-up writes every event waiting, in one chunk, as the broker's stream
                // does: the floor is the cheapest way to move these bytes, not one write each.
                let stream = async_stream::stream! {
                    while let Ok(first) = receiver.recv().await {
                        let mut chunk = format!("data: {first}\n\n");
                        while let Ok(next) = receiver.try_recv() {
                            chunk.push_str(&format!("data: {next}\n\n"));
                        }
                        yield Ok::<_, std::convert::Infallible>(Bytes::from(chunk));
                    }
                };
                ([(hyper::header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(stream))
            }
        }),
    );
    let listener = tokio::net::UnixListener::bind(&socket)?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let ready = Arc::new(tokio::sync::Barrier::new(FANOUT_SUBSCRIBERS + 1));
    let subscribers: Vec<_> =
        (0..FANOUT_SUBSCRIBERS).map(|_| tokio::spawn(subscriber(socket.clone(), 0, events, ready.clone()))).collect();
    ready.wait().await;
    let started = Instant::now();
    for index in 0..events {
        let due = started + over.mul_f64(index as f64 / events as f64);
        tokio::time::sleep_until(due.into()).await;
        let head = format!("{{\"seq\":{index},\"time_ms\":{:.0},\"pad\":\"", unix_ms());
        let pad = "x".repeat(FLOOR_EVENT_BYTES.saturating_sub(head.len() + 2));
        // The broadcast's send fails only without receivers: the subscribers hold theirs.
        let _ = sender.send(Arc::from(format!("{head}{pad}\"}}").as_str()));
    }
    let mut lags = Vec::with_capacity(FANOUT_SUBSCRIBERS * events);
    for subscriber in subscribers {
        lags.extend(subscriber.await??);
    }
    server.abort();
    Ok(Samples::from_millis(lags))
}
