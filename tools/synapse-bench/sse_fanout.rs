//! `sse-fanout`: many subscribers on /events while events are appended.
//!
//! Each event's lag is its receive time minus its time in the log, over every subscriber
//! (`sse_fanout_p99_ms`). Then its floor (issue 16): a bare axum SSE broadcast over a Unix socket,
//! from a process of its own, of as many events of [`FLOOR_EVENT_BYTES`] bytes, in the groups
//! and at the times the broker committed them, to as many subscribers, read by the same
//! subscriber code (`floor_sse_p99_ms`; see [`bare_broadcast`]).

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

/// What one subscriber saw: each event's lag (receive time minus the event's time, in ms) and,
/// when asked for, each event's time.
struct Seen {
    lags: Vec<f64>,
    times_ms: Vec<u64>,
}

/// One subscriber: reads `/events` from `after` until it has `wanted` events.
async fn subscriber(
    socket: PathBuf,
    after: u64,
    wanted: usize,
    keep_times: bool,
    ready: Arc<tokio::sync::Barrier>,
) -> Result<Seen> {
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
    let mut times_ms = Vec::with_capacity(if keep_times { wanted } else { 0 });
    // Where the search for the next event's end resumes (the bytes before it hold no "\n\n").
    let mut scanned = 0;
    while lags.len() < wanted {
        let Some(frame) = body.frame().await else { bail!("the stream ended after {} events", lags.len()) };
        let frame = frame?;
        let Some(data) = frame.data_ref() else { continue };
        buffer.extend_from_slice(data);
        // Only each event's time is needed: found in the bytes, without copying or parsing the
        // event (the subscribers share the machine's two cores with what they measure).
        let (mut start, received_ms) = (0, unix_ms());
        while let Some(end) = find(&buffer[scanned..], b"\n\n").map(|at| scanned + at) {
            let event = &buffer[start..end];
            scanned = end + 2;
            start = scanned;
            if event.starts_with(b":") {
                continue; // a keep-alive comment
            }
            let time_ms = event_time_ms(event).context("an event without a time_ms")?;
            lags.push((received_ms - time_ms as f64).max(0.0));
            if keep_times {
                times_ms.push(time_ms);
            }
        }
        buffer.drain(..start);
        scanned -= start;
        // A "\n" at the end may begin the next "\n\n".
        scanned = scanned.max(buffer.len().saturating_sub(1));
    }
    Ok(Seen { lags, times_ms })
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// The `"time_ms":` number of one server-sent event's bytes.
fn event_time_ms(event: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"time_ms\":";
    let at = find(event, KEY)? + KEY.len();
    let digits = event[at..].iter().take_while(|byte| byte.is_ascii_digit()).count();
    std::str::from_utf8(&event[at..at + digits]).ok()?.parse().ok()
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
        .map(|index| tokio::spawn(subscriber(socket.clone(), head, FANOUT_EVENTS, index == 0, ready.clone())))
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
    let mut times_ms = Vec::new();
    for subscriber in subscribers {
        let seen = subscriber.await??;
        lags.extend(seen.lags);
        if times_ms.is_empty() {
            times_ms = seen.times_ms;
        }
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
    let schedule = commit_schedule(&times_ms);
    println!("the broker committed them in {} groups (events of one commit share their time)", schedule.len());
    let floor = bare_broadcast(&schedule).await?;
    println!("bare SSE broadcast, same events, groups, times and subscribers: lag {}", floor.summary());
    result("floor_sse_p99_ms", floor.percentile(99.0), 3, "ms");
    Ok(())
}

/// The broker's commits as the events' times show them: (milliseconds after the first, events),
/// one entry per distinct time (a commit gives every event of it one time; two commits in one
/// millisecond count as one group, which can only make the floor lower).
fn commit_schedule(times_ms: &[u64]) -> Vec<(u64, usize)> {
    let first = times_ms.first().copied().unwrap_or(0);
    let mut schedule: Vec<(u64, usize)> = Vec::new();
    for &time in times_ms {
        let offset = time.saturating_sub(first);
        match schedule.last_mut() {
            Some((last, count)) if *last == offset => *count += 1,
            _ => schedule.push((offset, 1)),
        }
    }
    schedule
}

/// The floor of `sse-fanout`: the same events (as many, of [`FLOOR_EVENT_BYTES`] bytes), in the
/// broker's groups at the broker's times (`schedule`, see [`commit_schedule`]), broadcast by a
/// bare axum SSE server in a child process (see [`serve_floor`]) to [`FANOUT_SUBSCRIBERS`]
/// subscribers on a Unix socket, read by the same subscriber code; their lags.
///
/// Why this shape: a floor must be the cheapest way to move the same bytes as the scenario
/// does. With the server in this process (sharing the subscribers' runtime, no second process
/// competing for the cores) its p99 swung between 5 and 35 ms from run to run; with one write
/// per event instead of one per commit, it was slower than the broker itself.
async fn bare_broadcast(schedule: &[(u64, usize)]) -> Result<Samples> {
    use tokio::io::AsyncBufReadExt;
    let events: usize = schedule.iter().map(|(_, count)| count).sum();
    let dir = BenchDir::new("sse-floor")?;
    let socket = dir.uds().join("floor.sock");
    let schedule_file = dir.root.join("schedule");
    let lines: String = schedule.iter().map(|(offset, count)| format!("{offset} {count}\n")).collect();
    std::fs::write(&schedule_file, lines)?;
    let exe = std::env::current_exe().context("cannot find synapse-bench")?;
    let mut server = tokio::process::Command::new(exe)
        .arg(FLOOR_SERVER)
        .arg(&socket)
        .arg(&schedule_file)
        .arg(FANOUT_SUBSCRIBERS.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the bare SSE server")?;
    // It prints one line once it listens.
    let stdout = server.stdout.take().context("the bare SSE server has no stdout")?;
    let mut line = String::new();
    tokio::io::BufReader::new(stdout).read_line(&mut line).await?;
    if line.trim() != "listening" {
        bail!("the bare SSE server did not start (it said {line:?})");
    }
    let ready = Arc::new(tokio::sync::Barrier::new(FANOUT_SUBSCRIBERS + 1));
    let subscribers: Vec<_> = (0..FANOUT_SUBSCRIBERS)
        .map(|_| tokio::spawn(subscriber(socket.clone(), 0, events, false, ready.clone())))
        .collect();
    ready.wait().await;
    // Every subscriber reads its stream: the broadcast may begin (as the broker's appenders
    // begin only now).
    let mut go = server.stdin.take().context("the bare SSE server has no stdin")?;
    tokio::io::AsyncWriteExt::write_all(&mut go, b"go\n").await?;
    let mut lags = Vec::with_capacity(FANOUT_SUBSCRIBERS * events);
    for subscriber in subscribers {
        lags.extend(subscriber.await??.lags);
    }
    server.kill().await?;
    Ok(Samples::from_millis(lags))
}

/// The hidden argument that makes `synapse-bench` the bare SSE server of [`bare_broadcast`].
pub const FLOOR_SERVER: &str = "--sse-floor-server";

/// The bare SSE server (`synapse-bench --sse-floor-server SOCKET SCHEDULE SUBSCRIBERS`): serves
/// `/events` on SOCKET; once SUBSCRIBERS streams are open and a line arrives on its standard
/// input (the parent's word that every subscriber reads), a thread of its own (as the broker's
/// writer is) broadcasts the groups of SCHEDULE (lines `MS_AFTER_START EVENTS`), each group as
/// one message of that many events of [`FLOOR_EVENT_BYTES`] bytes (one commit's events); each
/// stream writes every message waiting in one chunk, as the broker's does. Runs until killed.
pub fn serve_floor(args: &[String]) -> Result<()> {
    let [socket, schedule, subscribers] = args else {
        bail!("usage: synapse-bench {FLOOR_SERVER} SOCKET SCHEDULE SUBSCRIBERS")
    };
    let schedule = std::fs::read_to_string(schedule).with_context(|| format!("cannot read {schedule}"))?;
    let schedule: Vec<(u64, usize)> = schedule
        .lines()
        .map(|line| {
            let (offset, count) = line.split_once(' ').context("a schedule line without a space")?;
            anyhow::Ok((offset.parse()?, count.parse()?))
        })
        .collect::<Result<_>>()?;
    let events: usize = schedule.iter().map(|(_, count)| count).sum();
    let subscribers: usize = subscribers.parse().context("SUBSCRIBERS")?;
    let (sender, _) = tokio::sync::broadcast::channel::<Arc<str>>(events + 16);
    let (all_connected, start) = std::sync::mpsc::channel::<()>();
    let connected = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler_sender = sender.clone();
    let app = axum::Router::new().route(
        "/events",
        axum::routing::get(move || {
            let mut receiver = handler_sender.subscribe();
            if connected.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == subscribers {
                let _ = all_connected.send(());
            }
            async move {
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
    let emitter = std::thread::spawn(move || {
        // Every stream open, then the parent's word that every subscriber reads its stream.
        let mut go = String::new();
        if start.recv().is_err() || std::io::stdin().read_line(&mut go).is_err() {
            return;
        }
        let started = Instant::now();
        let mut seq = 0;
        for (offset_ms, count) in schedule {
            let due = started + std::time::Duration::from_millis(offset_ms);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            // Whole milliseconds, cut as the broker's times are (not rounded up).
            let time_ms = unix_ms() as u64;
            let mut group = String::with_capacity(count * (FLOOR_EVENT_BYTES + 8));
            for _ in 0..count {
                if !group.is_empty() {
                    group.push_str("\n\ndata: ");
                }
                let head = format!("{{\"seq\":{seq},\"time_ms\":{time_ms},\"pad\":\"");
                group.push_str(&head);
                group.push_str(&"x".repeat(FLOOR_EVENT_BYTES.saturating_sub(head.len() + 2)));
                group.push_str("\"}");
                seq += 1;
            }
            // The broadcast's send fails only without receivers: the subscribers hold theirs.
            let _ = sender.send(Arc::from(group.as_str()));
        }
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::UnixListener::bind(socket)?;
        println!("listening");
        axum::serve(listener, app).await?;
        anyhow::Ok(())
    })?;
    emitter.join().map_err(|_| anyhow::anyhow!("the emitter panicked"))
}
