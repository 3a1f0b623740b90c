//! The wrapper's side of `synapse hook` (see [`crate::agent::hook`]): a socket its CLI's hooks
//! ask for the messages that arrived while the CLI was busy.
//!
//! Exactly once: a hook is served under [`Shared::delivery`], the lock the watcher holds from
//! taking a ticket to write until its acknowledgement (a hook waits for it 1 s at most, then
//! hands nothing over). Under it the hook gets every waiting ticket but priority-5 ones (those
//! interrupt, typed by the watcher) and those handed over before; once the hook confirms it
//! printed them, their numbers are remembered, then each is acknowledged. A hook that dies first
//! (its CLI's time limit) leaves them queued, typed at the prompt later. The watcher
//! acknowledges without writing a ticket whose number is remembered (fetched before a hook took
//! it). Those whose acknowledgement by the hook failed (the broker restarting) it acknowledges
//! as soon as it reaches the broker, without waiting for the CLI's prompt: a cancel that takes
//! one out of the inbox meanwhile is then told to the model, which has the message. The numbers
//! live in this wrapper's memory: a wrapper killed between a hook's hand-over and its
//! acknowledgement leaves the ticket to its successor, which types it again.

use super::Shared;
use super::connection::connect;
use crate::agent::hook::{self, HookAnswer, HookRequest};
use crate::event::Delivery;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Longest request line a hook may send.
const MAX_REQUEST_BYTES: u64 = 4096;
/// How long a connected hook may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Most tickets handed to one hook.
const MAX_TICKETS: usize = 20;
/// How long a hook waits for the delivery lock before answering that nothing waits.
const LOCK_WAIT: Duration = Duration::from_secs(1);
/// The pause after a failed accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// How many handed-over ticket numbers the watcher is told of (see [`answer`]).
const REMEMBERED_HANDOVERS: usize = 256;

/// Listens for the CLI's hooks until the wrapper ends; the socket is removed on the way out
/// (best effort: a stale one is replaced by the next wrapper of this agent id).
pub(super) async fn serve(shared: Arc<Shared>) {
    let path = hook::socket_path(&shared.paths.uds_dir, &shared.agent_id);
    let _ = std::fs::remove_file(&path);
    let listener = match tokio::net::UnixListener::bind(&path) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::warn!("cannot listen for hooks at {}: {error}; busy messages wait for the prompt", path.display());
            return;
        }
    };
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(crate::private_files::FILE_MODE));
    }
    let _remove = RemoveOnDrop(path);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, say: asked again at once, it fails again at once.
                tracing::debug!("hook socket: {error}");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(error) = answer(&shared, stream).await {
                tracing::debug!("hook: {error}");
            }
        });
    }
}

struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn answer(shared: &Arc<Shared>, stream: tokio::net::UnixStream) -> std::io::Result<()> {
    let (reader, mut writer) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(reader.take(MAX_REQUEST_BYTES));
    tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::other("no request in time"))??;
    let request: HookRequest = serde_json::from_str(&line).map_err(std::io::Error::other)?;
    if !crate::secret::constant_time_eq(request.secret.as_bytes(), shared.secret.as_bytes()) {
        tracing::warn!("hook: a request without this agent's secret was refused");
        return send(&mut writer, &HookAnswer::default()).await;
    }
    // The watcher holds the lock from a write to its acknowledgement, which waits for a broker
    // that is down: a hook does not wait with it (its CLI would stall), the tickets stay queued.
    let Ok(mut delivered) = tokio::time::timeout(LOCK_WAIT, shared.delivery.clone().lock_owned()).await else {
        return send(&mut writer, &HookAnswer::default()).await;
    };
    let Some((mut client, tickets, text)) = waiting(shared, &delivered).await else {
        return send(&mut writer, &HookAnswer::default()).await;
    };
    send(&mut writer, &HookAnswer { text }).await?;
    if tickets.is_empty() {
        return Ok(());
    }
    // Acknowledged only once the hook says it printed them: a hook killed before that (its CLI's
    // time limit) leaves them queued, typed at the prompt later.
    line.clear();
    let confirmed = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await;
    if !matches!(confirmed, Ok(Ok(_)) if line.trim() == hook::PRINTED) {
        tracing::warn!("hook {}: no confirmation; {} message(s) stay queued", request.event, tickets.len());
        return Ok(());
    }
    // Handed over like a write: a READY seen before it and still on its way lands before the
    // acknowledgements' PROCESSING.
    shared.report_order.count_write(|| {});
    shared.report_order.no_ready_from_before_the_last_write().await;
    // Remembered as handed over before any acknowledgement: one that fails (the broker
    // restarting) leaves its ticket queued, and the watcher then acknowledges it without
    // typing it again. The newest numbers are enough (the watcher holds one fetched ticket).
    delivered.extend(tickets.iter().copied());
    while delivered.len() > REMEMBERED_HANDOVERS {
        delivered.pop_first();
    }
    let mut numbers = tickets.into_iter();
    while let Some(number) = numbers.next() {
        match client.ack(&shared.agent_id, number, Some(Delivery::HandedOver)).await {
            Ok(_) => tracing::info!("ticket {number} handed to the model by the {} hook", request.event),
            // Acknowledged already (by the watcher, after an answer lost to a broker restart):
            // the others are acknowledged all the same.
            Err(error) if super::connection::is_gone(&error) => {
                tracing::warn!("ticket {number} handed over by a hook was acknowledged already ({error:#})");
            }
            Err(error) => {
                tracing::warn!(
                    "ticket {number} handed over by a hook, its acknowledgement failed ({error:#}): the watcher acknowledges it and the rest"
                );
                shared.unacknowledged_handovers().extend(std::iter::once(number).chain(numbers.by_ref()));
                shared.handovers_waiting.notify_one();
                break;
            }
        }
    }
    shared.report_after_acknowledgement();
    // The hook ends once this is said: whoever ran it sees the messages recorded as delivered.
    writer.write_all(format!("{}\n", hook::RECORDED).as_bytes()).await
}

async fn send(writer: &mut tokio::net::unix::OwnedWriteHalf, answer: &HookAnswer) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(answer).map_err(std::io::Error::other)?;
    out.push(b'\n');
    writer.write_all(&out).await
}

/// The waiting tickets (priority 5 excepted, those interrupt; and those handed over already) as
/// typed text, one per line, with their numbers and the connection to acknowledge them on; None
/// when the broker cannot be asked.
async fn waiting(
    shared: &Arc<Shared>,
    handed_over: &std::collections::BTreeSet<u64>,
) -> Option<(crate::client::Client, Vec<u64>, String)> {
    let mut client = tokio::time::timeout(Duration::from_secs(2), connect(&shared.paths, &shared.secret)).await.ok()?;
    let inbox = client.inbox(&shared.agent_id, 0, Some(MAX_TICKETS)).await.ok()?;
    let mut numbers = Vec::new();
    let mut lines = Vec::new();
    // A ticket handed over before whose acknowledgement failed is the watcher's to acknowledge:
    // never handed over again.
    for ticket in inbox
        .tickets
        .into_iter()
        .filter(|ticket| ticket.priority < 5 && !handed_over.contains(&ticket.ticket) && !shared.stale_notice(ticket))
    {
        let Ok(text) = super::watcher::ticket_text(shared, &ticket, true) else { continue };
        let keys = crate::escape::keystrokes(&ticket.prefix, &text, true, "");
        let paste = &keys.paste[crate::escape::PASTE_START.len()..keys.paste.len() - crate::escape::PASTE_END.len()];
        lines.push(String::from_utf8_lossy(paste).into_owned());
        numbers.push(ticket.ticket);
    }
    Some((client, numbers, lines.join("\n")))
}
