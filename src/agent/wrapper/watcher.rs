//! The watcher: follows the agent's inbox and writes each ticket into the CLI once it is ready
//! at its prompt — the start-up message first, then tickets by priority and arrival, a priority-5
//! ticket interrupting a busy CLI, and each acknowledged once the CLI has reacted to it.
//!
//! Exactly once: the watcher takes one ticket at a time, writes it, and acknowledges it (an
//! event) before taking the next; an acknowledgement that fails because the broker is down is
//! retried after reconnecting, never the write. If the wrapper itself dies, its CLI dies with
//! the PTY, so a ticket written but not acknowledged is written again into the new CLI (unless
//! its record and the terminal log show the CLI saw it: [`written_before_restart`]).
//!
//! Never written to or interrupted: a CLI that is starting or shows a dialog (the keys could
//! answer it), nor one whose user is typing. An acknowledgement waits while a READY seen before
//! the write is on its way, so that READY cannot land after it (`ReportOrder`).

use super::Shared;
use super::connection::{Backoff, connect, is_gone};
use super::terminal_log::{LogEnds, Place};
use crate::agent::profile::{self, InterruptStyle};
use crate::api::{self, InboxTicket};
use crate::client::Client;
use crate::event::{AgentStatus, Delivery};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages longer than this (characters) go to a file (`SYNAPSE_LONG_MESSAGE_THRESHOLD`).
const DEFAULT_LONG_MESSAGE_THRESHOLD: usize = 200;
/// While a ticket waits for the CLI, how often the inbox is asked again for a more urgent one.
const QUEUE_RECHECK: Duration = Duration::from_secs(1);
/// How long one inbox long-poll lasts.
const INBOX_WAIT_MS: u64 = 25_000;

/// The wrapper's record of the last ticket it wrote completely (`<agent>.delivered` beside the
/// log), before the acknowledgement: for a line-mode program (no settle delay) by the PTY writer
/// thread right after the submit key; for a real CLI once it took the message (its input box
/// emptied, see `resubmit_if_unsent`). A wrapper killed in between leaves it behind and its
/// successor acknowledges that ticket without writing it again, provided the terminal log shows
/// that the CLI saw it (see [`written_before_restart`]). A ticket not recorded is written again:
/// twice rather than never.
fn delivered_path(log: &std::path::Path) -> PathBuf {
    log.with_extension("delivered")
}

/// The record file, opened once by the watcher. Each record overwrites the one before in place:
/// one positioned write of a fixed width (wider than any record an earlier version wrote, so
/// nothing of an older one is left after it), one line read back. Truncating and rewriting the
/// file for every ticket took 0.2-1.3 ms here (median 0.45 ms, `perf trace` of the writer thread
/// during `tools/bench delivery`: ext4 frees the file's block, and starts writing back a file
/// that was truncated and written again when it is closed), and the acknowledgement waited for
/// it.
#[derive(Clone)]
pub(super) struct DeliveredRecord(Arc<std::fs::File>);

impl DeliveredRecord {
    /// Opens (or creates) the record beside `log` without truncating it: until this wrapper
    /// records a ticket of its own, the one its predecessor recorded stays for the next.
    pub(super) fn open(log: &std::path::Path) -> std::io::Result<DeliveredRecord> {
        crate::private_files::open_write(&delivered_path(log)).map(|file| DeliveredRecord(Arc::new(file)))
    }

    /// Records a ticket as written.
    pub(super) fn write(&self, written: WrittenTicket) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        // Three numbers of at most 20 digits and two spaces: 62 characters.
        let record = format!("{} {} {}", written.ticket, written.log_from.offset, written.log_from.inode);
        self.0.write_all_at(format!("{record:<62}\n").as_bytes(), 0)
    }
}

/// A ticket as its record keeps it: its number, and where the terminal log was when its writing
/// began (its echo can only come after that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WrittenTicket {
    pub ticket: u64,
    pub log_from: Place,
}

impl WrittenTicket {
    /// `ticket`, about to be written into the CLI whose terminal log is `log`.
    fn now(ticket: u64, log: &std::path::Path) -> WrittenTicket {
        // No log: just renamed at its bound, the new one not yet made, so where the renamed one
        // ends; or none at all (removed by hand), a place in no file, which no echo can follow.
        let log_from = Place::end_of(log)
            .or_else(|| Place::end_of(&super::terminal_log::rotated_path(log)))
            .unwrap_or(Place { inode: 0, offset: 0 });
        WrittenTicket { ticket, log_from }
    }
}

/// The last record as read: the ticket, where its writing began in the log (None in a record of
/// an earlier version, which kept the number alone) and in which file (None in a record of a
/// version that kept no rotated logs: the log then current).
type LastRecord = (u64, Option<(u64, Option<u64>)>);

/// The last record, from its first line (a record of an earlier version, shorter, leaves the
/// end of a longer one after its line).
fn last_delivered(log: &std::path::Path) -> Option<LastRecord> {
    let record = std::fs::read_to_string(delivered_path(log)).ok()?;
    let mut fields = record.lines().next()?.split_whitespace();
    let ticket = fields.next()?.parse().ok()?;
    let Some(offset) = fields.next() else { return Some((ticket, None)) };
    let offset = offset.parse().ok()?;
    match fields.next() {
        None => Some((ticket, Some((offset, None)))),
        Some(inode) => Some((ticket, Some((offset, Some(inode.parse().ok()?))))),
    }
}

/// How much of the end of the terminal log [`written_before_restart`] reads.
const LOG_TAIL_BYTES: u64 = 256 << 10;

/// What the wrapper before this one left, read when this one starts (before it writes any
/// record of its own): the last ticket it wrote, where the terminal log was when its writing
/// began, and where the log (and the one before it) then ended, held open.
pub(super) struct BeforeRestart {
    ticket: u64,
    log_from: Option<Place>,
    log_ends: LogEnds,
    /// This wrapper's count of new logs, and its value once the log was opened: once this
    /// wrapper has begun a new log of its own, the logs read are let go (their disk space with
    /// them), and a ticket recorded before the restart that comes only then is written again.
    rotations: Option<(Arc<std::sync::atomic::AtomicU64>, u64)>,
}

impl BeforeRestart {
    fn read(log: &std::path::Path) -> Option<BeforeRestart> {
        let (ticket, from) = last_delivered(log)?;
        let log_ends = LogEnds::read(log);
        let log_from = from.map(|(offset, inode)| Place {
            // A record from before rotation: a place in the log then current.
            inode: inode.or_else(|| log_ends.current().map(|current| current.inode)).unwrap_or(0),
            offset,
        });
        Some(BeforeRestart { ticket, log_from, log_ends, rotations: None })
    }

    /// Has this wrapper begun a new log since it opened the log?
    fn outdated(&self) -> bool {
        self.rotations
            .as_ref()
            .is_some_and(|(count, at_open)| count.load(std::sync::atomic::Ordering::SeqCst) != *at_open)
    }
}

/// Opens the terminal log for this run of the wrapper, having read first what the run before it
/// left there (the log may be rotated as it is opened, and the new CLI's output goes into it).
pub(super) fn open_log(
    log: &std::path::Path,
    max: Option<u64>,
) -> std::io::Result<(Option<BeforeRestart>, super::terminal_log::TerminalLog)> {
    let before = BeforeRestart::read(log);
    let output = super::terminal_log::TerminalLog::open(log, max)?;
    let rotations = output.rotations();
    let at_open = rotations.load(std::sync::atomic::Ordering::SeqCst);
    Ok((before.map(|before| BeforeRestart { rotations: Some((rotations, at_open)), ..before }), output))
}

/// Did the wrapper before this one write ticket `number` into its CLI before it died? Its
/// record says it wrote the submit key, and the terminal log shows the ticket's header
/// (`prefix`) after the point where its writing began, so the CLI echoed or drew it (a
/// follow-up shares its first message's header: that message's echo, earlier, does not count).
/// The log may have been rotated since that point: what followed it in the log before the
/// current one counts too. A record without that trace means the bytes may
/// have sat unread in the PTY when the wrapper (and with it the CLI) was killed, or that the
/// echo never reached the log: the ticket is written again, since nothing may be lost. Asked
/// of every ticket fetched until that one comes (a more urgent one may come first).
fn written_before_restart(before: &BeforeRestart, number: u64, prefix: &str) -> bool {
    if prefix.is_empty() || before.ticket != number || before.outdated() {
        return false;
    }
    // The end of the log as the wrapper before this one left it, from the ticket's writing on.
    let tail = before.log_ends.read_from(before.log_from, LOG_TAIL_BYTES);
    String::from_utf8_lossy(&tail).contains(prefix)
}

/// Interrupts the CLI as its profile says (never called while it is STARTING or WAITING:
/// interrupt keys could answer a dialog, nor while a Ctrl-C would end it: see
/// [`ctrl_c_would_end_it`]).
async fn interrupt(shared: &Shared) {
    match &shared.profile.interrupt {
        InterruptStyle::Signal => {
            let group = shared
                .master
                .lock()
                .ok()
                .and_then(|master| master.process_group_leader())
                .or_else(|| shared.child_pid.and_then(|pid| i32::try_from(pid).ok()));
            if let Some(group) = group {
                crate::process::signal(-group, libc::SIGINT);
            }
        }
        InterruptStyle::CtrlC => {
            let _ = shared.input.write(vec![0x03]).await;
        }
        InterruptStyle::Keys(keys) => {
            for (index, key) in keys.iter().enumerate() {
                if index > 0 {
                    tokio::time::sleep(profile::KEY_GAP).await;
                    if let Some(hint) = &shared.profile.interrupt_hint {
                        wait_for_screen(shared, hint, profile::INTERRUPT_HINT_WAIT).await;
                    }
                }
                // Checked when the profile was loaded.
                if let Ok(bytes) = profile::parse_key(key) {
                    let _ = shared.input.write(bytes).await;
                }
            }
        }
    }
}

/// Would a Ctrl-C interrupt end the CLI now? Most CLIs exit on a second Ctrl-C soon after
/// one (Gemini CLI within 3 s): for [`profile::CTRL_C_EXIT_WINDOW`] after the last Ctrl-C
/// written into it (this wrapper's or its user's), and after that while the rows by its input box say
/// a second one would (it may have read the first late, on a loaded machine), believed for
/// [`profile::EXIT_HINT_WAIT`] at most: such words in the model's text, with no Ctrl-C lately,
/// never hold an interrupt. Some(how long to wait before looking again), or None.
fn ctrl_c_would_end_it(shared: &Shared) -> Option<Duration> {
    let since = shared.input.last_ctrl_c().filter(|_| shared.profile.interrupt.writes_ctrl_c())?.elapsed();
    if since < profile::CTRL_C_EXIT_WINDOW {
        return Some(profile::CTRL_C_EXIT_WINDOW - since);
    }
    let hinted = || shared.screen.lock().shows_near_cursor(&profile::EXIT_HINTS, profile::EXIT_HINT_ROWS);
    (since < profile::CTRL_C_EXIT_WINDOW + profile::EXIT_HINT_WAIT && hinted()).then_some(Duration::from_millis(250))
}

/// Waits until the CLI's screen shows `text`, at most `limit`.
async fn wait_for_screen(shared: &Shared, text: &str, limit: std::time::Duration) {
    let mut changes = shared.screen.subscribe();
    let shows = || shared.screen.lock().shows(text);
    let shown = tokio::time::timeout(limit, async {
        while !shows() {
            if changes.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
    if shown.is_err() {
        tracing::warn!("the CLI did not show {text:?} within {limit:?}: the interrupt's next key goes anyway");
    }
}

fn long_message_threshold() -> usize {
    std::env::var("SYNAPSE_LONG_MESSAGE_THRESHOLD")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(DEFAULT_LONG_MESSAGE_THRESHOLD)
}

/// Instruction files for the start-up message (SPEC §1): `.synapse/*.md` of the working
/// directory, except `delegate.md` unless delegation is enabled and `file-safety.md` unless
/// file safety is on.
pub fn instruction_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let enabled =
        |name: &str| std::env::var(name).is_ok_and(|value| value == "1" || value.eq_ignore_ascii_case("true"));
    let Ok(entries) = std::fs::read_dir(dir.join(".synapse")) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .filter(|path| match path.file_name().and_then(|name| name.to_str()) {
            Some("delegate.md") => enabled("SYNAPSE_DELEGATION_ENABLED"),
            Some("file-safety.md") => enabled("SYNAPSE_FILE_SAFETY_ENABLED"),
            _ => true,
        })
        .collect();
    files.sort();
    files
}

/// The one start-up message written on the first READY when instruction files exist.
fn startup_message(shared: &Shared, files: &[PathBuf]) -> String {
    let list: Vec<String> = files.iter().map(|file| file.display().to_string()).collect();
    let answer = if shared.mcp_tools {
        "with the synapse `reply` tool (or `synapse reply \"...\"`); the synapse tools also send, list agents and lock files"
    } else {
        "with `synapse reply \"...\"`"
    };
    let instructions = if list.is_empty() {
        "Read your instructions in the .synapse directory of your working directory".to_string()
    } else {
        format!("Read your instructions in: {}", list.join(", "))
    };
    format!(
        "You are agent {} ({}). {instructions}. Messages from other agents arrive as [A2A:<id>:<sender>] lines; answer those marked :R {answer}.",
        shared.agent_id, shared.profile.name,
    )
}

/// What is typed for the start-up message: the message, or a reference to a file holding it
/// when it carries a dialog's furniture (an instruction file's name can: its echo would hold the
/// agent WAITING for good, furniture counting wherever it shows).
fn startup_text(shared: &Shared, files: &[PathBuf]) -> String {
    let message = startup_message(shared, files);
    if !crate::agent::readiness::Readiness::carries_furniture(&shared.profile.idle, &message) {
        return message;
    }
    let dir = shared.paths.home.join("messages").join(&shared.agent_id);
    let file = dir.join("start-up.txt");
    match crate::private_files::create_dir(&dir).and_then(|()| crate::private_files::write(&file, &message)) {
        Ok(()) => format!("[LONG MESSAGE - FILE ATTACHED] Path: {}", file.display()),
        Err(error) => {
            // Said without the files' names rather than not at all.
            tracing::warn!("cannot write {}: {error}", file.display());
            startup_message(shared, &[])
        }
    }
}

/// Acknowledges the tickets a hook handed over and could not acknowledge (`handed_over`), at
/// once, whatever the CLI is doing: a cancel that took one out of the inbox meanwhile is told to
/// the model, which has the message, by the acknowledgement's notice. False when the broker
/// cannot be asked (those left stay for the next try).
async fn acknowledge_handovers(client: &mut crate::client::Client, shared: &Shared) -> bool {
    let pending = std::mem::take(&mut *shared.unacknowledged_handovers());
    if pending.is_empty() {
        return true;
    }
    let mut numbers = pending.into_iter();
    while let Some(number) = numbers.next() {
        match client.ack(&shared.agent_id, number, Some(Delivery::HandedOver)).await {
            Ok(_) => tracing::info!("ticket {number}, handed over by a hook, acknowledged"),
            // Its acknowledgement had landed (its answer lost), or it was canceled long ago.
            Err(error) if is_gone(&error) => tracing::info!("ticket {number}, handed over by a hook: {error:#}"),
            Err(error) => {
                tracing::warn!("ticket {number}, handed over by a hook: its acknowledgement failed again ({error:#})");
                shared.unacknowledged_handovers().extend(std::iter::once(number).chain(numbers.by_ref()));
                return false;
            }
        }
    }
    shared.report_after_acknowledgement();
    true
}

/// Follows the agent's inbox and writes each ticket into the PTY once the CLI is ready.
pub(super) async fn watch_inbox(shared: Arc<Shared>, before_restart: Option<BeforeRestart>) {
    let files = std::env::current_dir()
        .map(|dir| {
            let mut files = instruction_files(&dir);
            if let Ok(settings) = crate::settings::Settings::load_current(&shared.paths.home) {
                files.extend(settings.instructions(&dir).into_iter().filter(|file| file.exists()));
            }
            files.dedup();
            files
        })
        .unwrap_or_default();
    // The last message written (the start-up message, then tickets), and when its writing
    // began: an interrupt may put it back into the CLI's input box (see `LastWritten::put_back`).
    let mut last_written: Option<LastWritten> = None;
    if !files.is_empty() {
        if !wait_until_ready(&shared).await {
            return;
        }
        let (began, spell) = (Instant::now(), shared.screen.lock().ready_spells(Instant::now()));
        match write_input(&shared, "[SYNAPSE]", &startup_text(&shared, &files), false, None).await {
            Ok(written) => {
                resubmit_if_unsent(&shared, &written).await;
                last_written = Some(LastWritten { written, began, spell });
            }
            Err(error) => {
                tracing::warn!("cannot write the start-up message: {error:#}");
                return;
            }
        }
    }
    let record = match DeliveredRecord::open(&shared.log) {
        Ok(record) => Some(record),
        Err(error) => {
            tracing::warn!(
                "cannot open {}: {error}; tickets are not recorded as written",
                delivered_path(&shared.log).display()
            );
            None
        }
    };
    let mut client = connect(&shared.paths, &shared.secret).await;
    let mut unacknowledged: Option<(u64, Delivery)> = None;
    // The ticket a previous wrapper wrote and died before acknowledging, if its records say so:
    // acknowledged without being written again when it comes.
    let mut before_restart = before_restart;
    // The priority-5 ticket last interrupted for: each is interrupted for once.
    let mut interrupted: Option<u64> = None;
    // The delivery lock (shared with the hooks), held from taking a ticket to write until its
    // acknowledgement, so a hook cannot hand the same ticket to the model meanwhile.
    let mut delivering: Option<tokio::sync::OwnedMutexGuard<std::collections::BTreeSet<u64>>> = None;
    let mut backoff = Backoff::default();
    // The inbox as the last acknowledgement's answer showed it: the next ticket comes from it
    // without another request (a message stored with that acknowledgement is written at once).
    let mut after_ack: Option<crate::api::Inbox> = None;
    loop {
        // Once this wrapper began a new log, the logs of the one before are let go (looked at
        // after every ticket and every wait on the inbox).
        before_restart.take_if(|before| before.outdated());
        if let Some((ticket, how)) = unacknowledged {
            // A READY seen before the write, still on its way, lands before this PROCESSING.
            shared.report_order.no_ready_from_before_the_last_write().await;
            match client.ack_then_inbox(&shared.agent_id, ticket, Some(how), 1).await {
                Ok(answer) => {
                    after_ack = Some(answer.inbox);
                    unacknowledged = None;
                    drop(delivering.take());
                    shared.report_after_acknowledgement();
                }
                Err(error) if is_gone(&error) => {
                    // Acknowledged already (an answer lost to a broker restart, or a hook's).
                    unacknowledged = None;
                    drop(delivering.take());
                    shared.report_after_acknowledgement();
                }
                Err(_) => {
                    backoff.wait().await;
                    client = connect(&shared.paths, &shared.secret).await;
                    continue;
                }
            }
        }
        if !acknowledge_handovers(&mut client, &shared).await {
            backoff.wait().await;
            client = connect(&shared.paths, &shared.secret).await;
            continue;
        }
        let fetched = match after_ack.take() {
            Some(inbox) if !inbox.tickets.is_empty() => Ok(inbox),
            // A hook's failed acknowledgements cut the wait short: they are made at once (on a
            // new connection: the one waiting is left with its request).
            _ => tokio::select! {
                fetched = client.inbox(&shared.agent_id, INBOX_WAIT_MS, Some(1)) => fetched,
                () = shared.handovers_waiting.notified() => {
                    client = connect(&shared.paths, &shared.secret).await;
                    continue;
                }
            },
        };
        let inbox = match fetched {
            Ok(answer) => {
                backoff.reset();
                answer
            }
            Err(_) => {
                backoff.wait().await;
                client = connect(&shared.paths, &shared.secret).await;
                continue;
            }
        };
        let Some(ticket) = inbox.tickets.into_iter().next() else {
            // Nothing waits: nothing to explain.
            shared.set_note(None);
            continue;
        };
        let number = ticket.ticket;
        if shared.stale_notice(&ticket) {
            tracing::info!("ticket {number} tells of a task canceled before this run of the agent; acknowledging it");
            unacknowledged = Some((number, Delivery::Unwritten));
            continue;
        }
        if let Some(before) = before_restart.take_if(|before| before.ticket == number)
            && written_before_restart(&before, number, &ticket.prefix)
        {
            tracing::info!("ticket {number} was written before a restart; acknowledging it");
            unacknowledged = Some((number, Delivery::Unwritten));
            continue;
        }
        let (status, typing, off_prompt) = {
            let mut readiness = shared.screen.lock();
            (readiness.status(Instant::now()).0, readiness.input_pending(), !readiness.cursor_at_prompt_line())
        };
        // The interrupt for this ticket made the CLI put the message before it back into its
        // input box: this one is written onto it, and the CLI takes both (the first one, never
        // answered, is not lost, and nothing waits for a user to clear the box).
        let onto_put_back =
            || interrupted == Some(number) && last_written.as_ref().is_some_and(|last| last.put_back(&shared).0);
        if status != AgentStatus::Ready && !onto_put_back() {
            // Priority 5 interrupts a CLI that is working, once per ticket. A CLI that is
            // starting or shows a dialog is never interrupted or written to (the keys could
            // answer the dialog), nor one whose user is typing (they would clear the input).
            // A key just typed may not be drawn yet: it counts as typing. With the cursor off
            // the prompt's line (a draft's second row), the user's keys tell whether their line
            // may hold text.
            let typing = typing || shared.held_keys.typed_within(USER_KEYS_SETTLE);
            let may_hold_a_draft = typing || (off_prompt && shared.held_keys.draft());
            // A cancel notice interrupts the work on the canceled task's message. When the CLI
            // went back to its prompt since and its user then sent a prompt of their own, it may
            // be working on theirs, which the broker cannot see: the notice then waits for the
            // prompt, as at priority 3.
            let users_prompt = ticket.cancel_notice
                && ticket.priority == 5
                && last_written.as_ref().is_some_and(|last| last.followed_by_users_prompt(&shared));
            if ticket.priority == 5
                && status == AgentStatus::Processing
                && !may_hold_a_draft
                && !users_prompt
                && interrupted != Some(number)
            {
                // A Ctrl-C now would end the CLI, not interrupt it: that moment is waited out,
                // then everything is looked at again (the ticket may be canceled meanwhile, the
                // CLI back at its prompt, its user typing).
                if let Some(wait) = ctrl_c_would_end_it(&shared) {
                    shared.set_note(Some(
                        "a priority-5 message waits a moment: a Ctrl-C now would end the CLI, not interrupt it".into(),
                    ));
                    // Or until the CLI is back at its prompt (its user's Ctrl-C, say): then the
                    // ticket is simply written.
                    tokio::select! {
                        ready = wait_until_ready(&shared) => if !ready { return },
                        () = tokio::time::sleep(wait) => {}
                    }
                    shared.set_note(None);
                    continue;
                }
                interrupted = Some(number);
                interrupt(&shared).await;
                let timeout = Duration::from_millis(shared.profile.interrupt_timeout_ms);
                let back = wait_until_ready_or_put_back(&shared, last_written.as_ref());
                if tokio::time::timeout(timeout, back).await.is_err() {
                    let note = format!(
                        "a priority-5 message waits: no prompt {} s after the interrupt (clear the input box or answer the CLI)",
                        shared.profile.interrupt_timeout_ms / 1000
                    );
                    tracing::warn!("ticket {number}: {note}");
                    shared.set_note(Some(note));
                }
            } else {
                match status {
                    AgentStatus::Waiting => {
                        shared.set_note(Some("a dialog is open: messages wait until it is answered".into()))
                    }
                    _ if typing => shared.set_note(Some(
                        "the CLI's input box holds typed text: messages wait until it is sent or cleared".into(),
                    )),
                    AgentStatus::Processing if users_prompt => shared.set_note(Some(
                        "a task was canceled: its notice waits for the prompt, not interrupting the prompt typed here since"
                            .into(),
                    )),
                    _ => {}
                }
                // Until READY, or a second passes: a more urgent ticket (priority 5) may have
                // arrived behind this one, and it must not wait for the CLI's whole task.
                tokio::select! {
                    ready = wait_until_ready(&shared) => if !ready { return },
                    () = tokio::time::sleep(QUEUE_RECHECK) => {}
                }
            }
            // Ask again: the most urgent ticket comes first.
            continue;
        }
        let mut guard = shared.delivery.clone().lock_owned().await;
        if guard.remove(&number) {
            // A hook handed it to the model after it was fetched: acknowledged, not written (if
            // the hook's own acknowledgement landed, this one is answered 404, and that is all).
            delivering = Some(guard);
            unacknowledged = Some((number, Delivery::HandedOver));
            continue;
        }
        // Looked at again: the lock may have waited behind a hook's acknowledgements, while the
        // CLI went on to work, opened a dialog or took the user's typing.
        let ready_now = shared.screen.lock().status(Instant::now()).0 == AgentStatus::Ready;
        let onto_put_back = !ready_now && onto_put_back();
        if !ready_now && !onto_put_back {
            continue;
        }
        // A key the user just typed may not be on the screen yet (the CLI redraws a moment
        // later): written now, the message would join it. Otherwise the user's keys are held
        // from here until the CLI has taken the message (`resubmit_if_unsent` passes them on),
        // so that none can reach the CLI in front of it or inside it.
        if !shared.held_keys.hold_unless_typed(USER_KEYS_SETTLE) {
            drop(guard);
            tokio::time::sleep(USER_KEYS_SETTLE).await;
            continue;
        }
        delivering = Some(guard);
        let bracketed = shared.screen.lock().bracketed_paste();
        let text = match ticket_text(&shared, &ticket, bracketed) {
            Ok(text) => text,
            Err(error) => {
                // The message cannot reach this CLI as a file: its task fails, visibly to the
                // sender, and the next tickets go on.
                let reason = format!("{error:#}");
                tracing::warn!("ticket {number}: {reason}");
                // The user's keys are not held through a request to the broker.
                shared.held_keys.hold(false, &shared.input);
                if fail_ticket(&mut client, &shared, &ticket, &reason).await {
                    unacknowledged = Some((number, Delivery::Unwritten));
                    continue;
                }
                // Its task cannot be failed (a reply's task is over already; the broker may be
                // refusing writes too): typed whole instead, rather than acknowledged unseen,
                // if the CLI is still ready for it after that request and no key came just now
                // (held again from here).
                let ready_again = onto_put_back || shared.screen.lock().status(Instant::now()).0 == AgentStatus::Ready;
                if !ready_again || !shared.held_keys.hold_unless_typed(USER_KEYS_SETTLE) {
                    drop(delivering.take());
                    continue;
                }
                tracing::warn!("ticket {number}: its task could not be marked failed; typed whole instead");
                ticket.text.clone()
            }
        };
        shared.set_note(None);
        let header = ticket.prefix.as_str();
        // The record that this ticket was written (a successor acknowledges it without writing
        // it again). A line-mode program takes a message with its return, which cannot be
        // swallowed: recorded with the submit key. A CLI that may swallow the key (it shows the
        // paste before the key is sent) is recorded once it took the message: killed before,
        // the successor writes it again (twice rather than never).
        let record_with_the_key = shared.profile.settle_ms == 0;
        let (began, spell) = (Instant::now(), shared.screen.lock().ready_spells(Instant::now()));
        let mark = WrittenTicket::now(number, &shared.log);
        let then_record = record.clone().filter(|_| record_with_the_key).map(|record| (record, mark));
        let written = match write_input(&shared, header, &text, onto_put_back, then_record).await {
            Ok(written) => written,
            Err(error) => {
                tracing::warn!("cannot write ticket {number}: {error:#}");
                return;
            }
        };
        // Acknowledged once the CLI has drawn something after it: a wrapper killed before that
        // leaves the ticket unacknowledged and its successor writes it again (the bytes died
        // unread with the PTY).
        wait_for_reaction(&shared).await;
        let taken = resubmit_if_unsent(&shared, &written).await;
        last_written = Some(LastWritten { written, began, spell });
        // Still in the input box (the resubmits gave up): not recorded, so a successor writes
        // it again rather than count it sent.
        if !record_with_the_key
            && taken
            && let Some(record) = &record
            && let Err(error) = record.write(mark)
        {
            tracing::warn!("cannot record ticket {number} as written: {error}");
        }
        unacknowledged = Some((number, Delivery::Typed));
    }
}

/// How long after the user's last keystroke reached the CLI a message waits: long enough for
/// the CLI to draw it (then the screen shows the typed input, and messages wait for it).
const USER_KEYS_SETTLE: Duration = Duration::from_millis(300);

/// Longest wait for a CLI to draw anything after a ticket was written, before acknowledging it
/// anyway (a CLI that draws nothing must not stop deliveries).
const REACTION_WAIT: Duration = Duration::from_secs(2);

async fn wait_for_reaction(shared: &Shared) {
    let mut changes = shared.screen.subscribe();
    let deadline = tokio::time::Instant::now() + REACTION_WAIT;
    loop {
        changes.borrow_and_update();
        if shared.screen.lock().reacted() {
            return;
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

/// How long the input box may hold a written message, with nothing drawn, before its submit key
/// counts as lost.
const UNSENT_QUIET: Duration = Duration::from_millis(1500);
/// Longest time the user's keys are held after a message's submit key while the wrapper
/// watches whether the CLI took it: two quiet spells, enough for the first submit key again.
const KEYS_HELD_AT_MOST: Duration = Duration::from_millis(3000);
/// How many times the submit key is sent again for one message.
const RESUBMITS: usize = 2;
/// How long the input box must stay without the message before the message counts as taken. A
/// CLI drawn by Ink erases every row of its frame and draws them again: halfway, the cursor sits
/// at the margin of an emptied row, as after a submit. A frame can reach the reader in two reads
/// (Gemini under load: its return taken as a new line in the box, the half-drawn frame read as
/// the message taken, no second submit key, and the model never got the message).
const TAKEN_STEADY: Duration = Duration::from_millis(300);

/// Sends the submit key again when the message still sits in the CLI's input box after a quiet
/// spell (seen with Gemini under heavy load: the paste shown, its Enter swallowed, the message
/// never sent). Returns once the box has stayed without the message for [`TAKEN_STEADY`], as it
/// does for a message taken: true then (or at once when a dialog opened after it), false when
/// the message still sits there.
///
/// Only for a CLI that needs a settle delay between the paste and its submit key (every real
/// CLI): that delay exists because such a CLI may take a return close behind a paste as part of
/// it. A line-mode program (the dummy: no settle delay) gets its line from the terminal, where a
/// return cannot be swallowed; watching its screen would only hold back the acknowledgement,
/// and with it the next message (0.6 → 0.9 ms `delivery_p50_ms`).
///
/// The user's keys, held since [`write_input`], are passed on when this returns, or after
/// [`KEYS_HELD_AT_MOST`] if that comes first: a key typed while the message waits in the box
/// would otherwise join it (and be sent with it by the next submit key, or make the box no
/// longer end with the message, which then counts as taken). The limit: a CLI that redraws
/// all the time (a clock, a spinner) never gives a quiet spell, and the user's keys, Ctrl-C and
/// Esc among them, must not wait for one.
async fn resubmit_if_unsent(shared: &Shared, written: &Written) -> bool {
    let taken = submit_again_while_unsent(shared, written).await;
    shared.held_keys.hold(false, &shared.input);
    taken
}

async fn submit_again_while_unsent(shared: &Shared, written: &Written) -> bool {
    if shared.profile.settle_ms == 0 {
        return true;
    }
    let mut changes = shared.screen.subscribe();
    let mut resubmits = 0;
    // The quiet spell is counted from the CLI's last drawing or our last key, whichever is later:
    // a key just sent has not been answered yet.
    let mut last_key = Instant::now();
    let mut keys_held_until = Some(last_key + KEYS_HELD_AT_MOST);
    // Since when the box has been seen without the message, look after look.
    let mut emptied_since: Option<Instant> = None;
    loop {
        if keys_held_until.is_some_and(|until| Instant::now() >= until) {
            keys_held_until = None;
            shared.held_keys.hold(false, &shared.input);
        }
        changes.borrow_and_update();
        let (unsent, dialog, last_output) = {
            let readiness = shared.screen.lock();
            (
                readiness.holds_unsent(&written.shown, written.pasted),
                readiness.furniture_on_screen(),
                readiness.last_output(),
            )
        };
        // A dialog that opened after the submit key is the user's to answer (a key now would);
        // its furniture says so (a question may be the last answer's, above the waiting text).
        if dialog {
            return true;
        }
        if !unsent {
            let steady_at = *emptied_since.get_or_insert_with(Instant::now) + TAKEN_STEADY;
            if Instant::now() >= steady_at {
                return true;
            }
            let wake = keys_held_until.map_or(steady_at, |until| until.min(steady_at));
            let _ = tokio::time::timeout_at(wake.into(), changes.changed()).await;
            continue;
        }
        emptied_since = None;
        let quiet_until = last_output.map_or(last_key, |at| at.max(last_key)) + UNSENT_QUIET;
        if Instant::now() < quiet_until {
            let wake = keys_held_until.map_or(quiet_until, |until| until.min(quiet_until));
            let _ = tokio::time::timeout_at(wake.into(), changes.changed()).await;
            continue;
        }
        if resubmits == RESUBMITS {
            tracing::warn!("the message still sits in the input box after {RESUBMITS} more submit keys");
            return false;
        }
        resubmits += 1;
        tracing::info!("the message still sits in the input box; sending the submit key again");
        last_key = shared.input_written();
        if shared.input.write(written.submit.clone()).await.is_err() {
            return false;
        }
    }
}

/// Waits until the screen model says READY (after output, or when a quiet period ends);
/// false when the wrapper is going away.
async fn wait_until_ready(shared: &Arc<Shared>) -> bool {
    let mut changes = shared.screen.subscribe();
    loop {
        changes.borrow_and_update();
        let (status, recheck) = shared.screen.lock().status(Instant::now());
        if status == AgentStatus::Ready {
            return true;
        }
        match recheck {
            Some(at) => {
                let _ = tokio::time::timeout_at(at.into(), changes.changed()).await;
            }
            None => {
                if changes.changed().await.is_err() {
                    return false;
                }
            }
        }
    }
}

/// The text written for a ticket after its header: the message, or a file reference when the
/// message is long, multi-line and the CLI cannot take a paste, or carries a dialog's furniture
/// (its echo would hold the agent WAITING: furniture counts wherever it shows).
pub(super) fn ticket_text(shared: &Shared, ticket: &InboxTicket, bracketed: bool) -> anyhow::Result<String> {
    let text = ticket.text.as_str();
    if text.chars().count() <= long_message_threshold()
        && (bracketed || !text.contains(['\n', '\r']))
        && !crate::agent::readiness::Readiness::carries_furniture(&shared.profile.idle, text)
    {
        return Ok(text.to_string());
    }
    let dir = shared.paths.home.join("messages").join(&shared.agent_id);
    crate::private_files::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let file = dir.join(format!("{}-{}.txt", ticket.ticket, crate::event::short_id(&ticket.task_id)));
    crate::private_files::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    Ok(format!("[LONG MESSAGE - FILE ATTACHED] Path: {}", file.display()))
}

/// Marks the task of a ticket that cannot be written as failed, with the reason; false when it
/// could not be (a reply's ticket belongs to a task that is already over, or the broker refused).
async fn fail_ticket(client: &mut Client, shared: &Shared, ticket: &InboxTicket, reason: &str) -> bool {
    let task_id = &ticket.task_id;
    let update = api::TaskUpdate {
        state: crate::event::TaskState::Failed,
        artifacts: Vec::new(),
        error: Some(format!("not delivered to {}: {reason}", shared.agent_id)),
        as_message: false,
    };
    match client.update_task(&shared.agent_id, task_id, &update).await {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!("cannot mark task {task_id} failed: {error:#}");
            false
        }
    }
}

/// Types `header` and `text` into the CLI like a paste (bracketed when the CLI enabled it), then
/// the submit key after the profile's settle delay (and, right after it, `then_record`). The
/// bytes are decided by [`crate::escape::keystrokes`]: nothing in the text acts as a control.
/// The user's keys are held from here; once written, [`resubmit_if_unsent`] passes them on.
async fn write_input(
    shared: &Arc<Shared>,
    header: &str,
    text: &str,
    onto_put_back: bool,
    then_record: Option<(DeliveredRecord, WrittenTicket)>,
) -> anyhow::Result<Written> {
    let bracketed = shared.screen.lock().bracketed_paste();
    shared.input_written();
    let mut keys = crate::escape::keystrokes(header, text, bracketed, &shared.profile.submit);
    if onto_put_back {
        // The message begins a line of its own after the one already in the box (a space where
        // a newline would submit).
        keys.join_onto_text(bracketed);
    }
    let shown = String::from_utf8_lossy(&keys.paste).replace("\x1b[200~", "").replace("\x1b[201~", "");
    shared.screen.lock().remember_input(&shown);
    shared.held_keys.hold(true, &shared.input);
    let written = async {
        shared.input.write(keys.paste).await?;
        if shared.profile.settle_ms > 0 {
            // The settle delay counts from the CLI drawing the paste, not from writing it: a CLI
            // starved of CPU reads the paste and the submit key together otherwise, and Gemini
            // takes a return that close behind a paste as a newline inside it.
            wait_for_reaction(shared).await;
            tokio::time::sleep(Duration::from_millis(shared.profile.settle_ms)).await;
        }
        shared.input.write_then_record(keys.submit.clone(), then_record).await
    }
    .await;
    if written.is_err() {
        shared.held_keys.hold(false, &shared.input);
    }
    // Otherwise the user's keys stay held until the CLI has taken the message
    // ([`resubmit_if_unsent`] passes them on).
    written.map(|()| Written { shown, submit: keys.submit, pasted: bracketed })
}

/// What [`write_input`] typed: the text as the CLI shows it, the submit key after it, and
/// whether it went in as a bracketed paste.
struct Written {
    shown: String,
    submit: Vec<u8>,
    pasted: bool,
}

/// The last message written into the CLI, and when its writing began.
struct LastWritten {
    written: Written,
    began: Instant,
    /// The CLI's READY spell when its writing began
    /// ([`crate::agent::readiness::Readiness::ready_spells`]).
    spell: u64,
}

impl LastWritten {
    /// Did the CLI go back to its prompt after this message (its user stopped the work with
    /// Ctrl-C, or the model ended its turn), and the user then send it a prompt of their own?
    /// The CLI may then work on theirs, not on this one. A prompt typed while the CLI still
    /// worked on the message (queued behind it, or steering it) does not count, nor a key that
    /// answered a dialog.
    fn followed_by_users_prompt(&self, shared: &Shared) -> bool {
        shared.held_keys.prompt_spell() > self.spell
    }

    /// Is this message back in the CLI's input box, the CLI idle around it (Claude puts a message
    /// back when it is interrupted before the model's first words)? Never once the user typed a
    /// key after the message was written: the box may then hold their text. The second value:
    /// when to look again.
    fn put_back(&self, shared: &Shared) -> (bool, Option<Instant>) {
        if shared.held_keys.typed_within(self.began.elapsed()) {
            return (false, None);
        }
        shared.screen.lock().holds_put_back(&self.written.shown, self.written.pasted, Instant::now())
    }
}

/// After an interrupt: until the CLI is READY, or idle with `last` put back into its input box
/// (see [`LastWritten::put_back`]); returns when the wrapper is going away too.
async fn wait_until_ready_or_put_back(shared: &Arc<Shared>, last: Option<&LastWritten>) {
    let mut changes = shared.screen.subscribe();
    loop {
        changes.borrow_and_update();
        let (status, ready_at) = shared.screen.lock().status(Instant::now());
        let (put_back, put_back_at) = last.map_or((false, None), |last| last.put_back(shared));
        if status == AgentStatus::Ready || put_back {
            return;
        }
        match ready_at.into_iter().chain(put_back_at).min() {
            Some(at) => {
                let _ = tokio::time::timeout_at(at.into(), changes.changed()).await;
            }
            None => {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_replaces_the_one_before_in_place_and_opening_keeps_the_predecessors() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("bob.log");
        let mark = |ticket, offset, inode| WrittenTicket { ticket, log_from: Place { inode, offset } };
        // The widest record an earlier version could have left (it wrote the bare number).
        std::fs::write(delivered_path(&log), u64::MAX.to_string()).unwrap();
        let record = DeliveredRecord::open(&log).unwrap();
        assert_eq!(last_delivered(&log), Some((u64::MAX, None)), "opening alone keeps the predecessor's record");
        record.write(mark(7, 0, 5)).unwrap();
        assert_eq!(
            last_delivered(&log),
            Some((7, Some((0, Some(5))))),
            "nothing of the longer record is left after it"
        );
        record.write(mark(u64::MAX, u64::MAX, u64::MAX)).unwrap();
        record.write(mark(8, 512, 6)).unwrap();
        assert_eq!(last_delivered(&log), Some((8, Some((512, Some(6))))));
        record.write(mark(u64::MAX, u64::MAX, u64::MAX)).unwrap();
        assert_eq!(last_delivered(&log), Some((u64::MAX, Some((u64::MAX, Some(u64::MAX))))));
        // A second handle (the next wrapper's) reads and writes the same file.
        drop(record);
        let next = DeliveredRecord::open(&log).unwrap();
        assert_eq!(last_delivered(&log), Some((u64::MAX, Some((u64::MAX, Some(u64::MAX))))));
        next.write(mark(9, 1, 2)).unwrap();
        assert_eq!(last_delivered(&log), Some((9, Some((1, Some(2))))));
        // The previous version's record (two numbers, 41 wide, and a new line) written over this
        // version's: its line is read, not the end of the longer one after it.
        next.write(mark(u64::MAX, u64::MAX, u64::MAX)).unwrap();
        std::os::unix::fs::FileExt::write_all_at(
            &*next.0,
            format!("{:<41}\n", format!("10 {}", u64::MAX)).as_bytes(),
            0,
        )
        .unwrap();
        assert_eq!(last_delivered(&log), Some((10, Some((u64::MAX, None)))));
        // Not a record: no ticket is taken for written.
        std::fs::write(delivered_path(&log), "9 x").unwrap();
        assert_eq!(last_delivered(&log), None);
        std::fs::write(delivered_path(&log), "9 1 x").unwrap();
        assert_eq!(last_delivered(&log), None);
    }

    #[test]
    fn a_ticket_counts_as_written_before_a_restart_only_with_its_record_and_its_echo() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("bob.log");
        let prefix = "[A2A:c54af1ff:alice:R]";
        std::fs::write(&log, format!("> {prefix} burst-024\r\n[DUMMY] You said: ...\r\n> ")).unwrap();
        assert!(BeforeRestart::read(&log).is_none(), "no record");
        std::fs::write(delivered_path(&log), "6").unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert!(!written_before_restart(&before, 7, prefix), "the record is of another ticket");
        std::fs::write(delivered_path(&log), "7").unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert!(written_before_restart(&before, 7, prefix));
        assert!(!written_before_restart(&before, 7, "[A2A:0000aaaa:alice:R]"), "recorded, but the CLI never showed it");
        assert!(!written_before_restart(&before, 7, ""));
        // This wrapper wrote a more urgent ticket first: its record and its log's end move on,
        // and ticket 7, fetched next, is still known for the one written before the restart.
        std::fs::write(delivered_path(&log), "9").unwrap();
        let later = "[A2A:0f0f0f0f:carol]";
        let mut file = crate::private_files::open_append(&log).unwrap();
        std::io::Write::write_all(&mut file, format!("{later} urgent\r\n> ").as_bytes()).unwrap();
        assert!(written_before_restart(&before, 7, prefix));
        // Only what the wrapper before this one left counts.
        std::fs::write(delivered_path(&log), "8").unwrap();
        let earlier = BeforeRestart { ticket: 8, log_from: None, ..before };
        assert!(!written_before_restart(&earlier, 8, later), "drawn after the restart");
        // Only the end of a long log is read: the ticket was the last thing written.
        let mut long = format!("> {prefix} early\r\n").into_bytes();
        long.resize(long.len() + 2 * LOG_TAIL_BYTES as usize, b'.');
        std::fs::write(&log, long).unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert!(!written_before_restart(&BeforeRestart { ticket: 7, ..before }, 7, prefix));
    }

    /// A follow-up (a later turn of the same task) has its first message's header: the first
    /// message's echo, before the follow-up's writing began, is no trace of the follow-up.
    #[test]
    fn only_the_log_after_a_tickets_writing_began_shows_it_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("bob.log");
        let prefix = "[A2A:c54af1ff:alice:R]";
        let first = format!("> {prefix} the first turn\r\n[DUMMY] You said: ...\r\n> ");
        std::fs::write(&log, &first).unwrap();
        let follow_up = WrittenTicket::now(12, &log);
        assert_eq!(follow_up.log_from.offset, first.len() as u64);
        DeliveredRecord::open(&log).unwrap().write(follow_up).unwrap();
        // Killed with the follow-up's bytes unread: the log shows only the first turn.
        let before = BeforeRestart::read(&log).unwrap();
        assert!(!written_before_restart(&before, 12, prefix), "only the first turn's echo");
        // Its echo came before the kill.
        let mut file = crate::private_files::open_append(&log).unwrap();
        std::io::Write::write_all(&mut file, format!("{prefix} the second turn\r\n").as_bytes()).unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert!(written_before_restart(&before, 12, prefix));
        // A record of the version before (no file named): a place in the current log.
        std::fs::write(delivered_path(&log), format!("12 {}", first.len())).unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert!(written_before_restart(&before, 12, prefix));
        std::fs::write(delivered_path(&log), format!("12 {}", first.len() + 10)).unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert!(!written_before_restart(&before, 12, prefix), "the place is past the echo");
        // A record of an earlier version (the number alone) reads the whole tail, as it did.
        std::fs::write(delivered_path(&log), "12").unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert_eq!(before.log_from, None);
        std::fs::write(&log, &first).unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert!(written_before_restart(&before, 12, prefix));
        // A log shorter than the record's start (replaced since, in place): nothing counts as
        // shown.
        let before = BeforeRestart {
            log_from: Some(Place { offset: first.len() as u64 + 10, ..before.log_ends.current().unwrap() }),
            ..before
        };
        assert!(!written_before_restart(&before, 12, prefix));
    }

    /// The terminal log rotated (it reached its bound) after a ticket's writing began: the echo
    /// in the new log counts, and the first turn's echo, in the old log before that place, still
    /// does not. A restart that itself rotates the log moves nothing.
    #[test]
    fn a_tickets_echo_is_found_after_the_log_was_rotated() {
        use super::super::terminal_log::{MIN_MAX_BYTES, TerminalLog, rotated_path};
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("bob.log");
        let prefix = "[A2A:c54af1ff:alice:R]";
        let mut output = TerminalLog::open(&log, Some(MIN_MAX_BYTES)).unwrap();
        output.write_all(format!("> {prefix} the first turn\r\n> ").as_bytes()).unwrap();
        let follow_up = WrittenTicket::now(12, &log);
        DeliveredRecord::open(&log).unwrap().write(follow_up).unwrap();
        // A redraw fills the log: it is rotated just after the follow-up's writing began.
        output.write_all(&vec![b' '; MIN_MAX_BYTES as usize]).unwrap();
        assert!(rotated_path(&log).exists());
        let before = BeforeRestart::read(&log).unwrap();
        assert!(!written_before_restart(&before, 12, prefix), "only the first turn's echo");
        // The echo, cut across the rotation.
        let echo = format!("{prefix} the second turn\r\n");
        let (head, rest) = echo.split_at(10);
        drop(output);
        std::fs::write(rotated_path(&log), [std::fs::read(rotated_path(&log)).unwrap(), head.into()].concat()).unwrap();
        let mut output = TerminalLog::open(&log, Some(MIN_MAX_BYTES)).unwrap();
        output.write_all(rest.as_bytes()).unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert!(written_before_restart(&before, 12, prefix));
        // The place taken between the rename and the new log: the renamed one's end.
        std::fs::rename(&log, dir.path().join("aside")).unwrap();
        assert_eq!(WrittenTicket::now(13, &log).log_from, Place::end_of(&rotated_path(&log)).unwrap());
        std::fs::rename(dir.path().join("aside"), &log).unwrap();
        // The next wrapper's CLI fills the log again before the ticket comes: the file is found
        // again where it went (and the one it replaced, gone, is skipped).
        output.write_all(echo.as_bytes()).unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        output.write_all(&vec![b' '; MIN_MAX_BYTES as usize]).unwrap();
        assert!(written_before_restart(&before, 12, prefix));
        // What the next CLI draws after the log's ends were read does not count.
        let place = WrittenTicket::now(14, &log);
        DeliveredRecord::open(&log).unwrap().write(place).unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        output.write_all(echo.as_bytes()).unwrap();
        assert!(!written_before_restart(&before, 14, prefix));
        let before = BeforeRestart::read(&log).unwrap();
        assert!(written_before_restart(&before, 14, prefix));
        // The home copied (every inode new), or two rotations since the place: no log holds
        // it, and an echo in the logs there are is no proof (it may be a first turn's).
        drop(output);
        // Both copies made before either original goes (a freed inode may be given again).
        let copies = [(log.clone(), dir.path().join("copy")), (rotated_path(&log), dir.path().join("copy.1"))];
        for (path, copy) in &copies {
            std::fs::copy(path, copy).unwrap();
        }
        for (path, copy) in &copies {
            std::fs::rename(copy, path).unwrap();
        }
        let before = BeforeRestart::read(&log).unwrap();
        assert!(String::from_utf8_lossy(&std::fs::read(&log).unwrap()).contains(prefix));
        assert!(!written_before_restart(&before, 14, prefix));
        // No log at all when the writing began (removed by hand): no proof either.
        let nowhere = WrittenTicket { ticket: 15, log_from: Place { inode: 0, offset: 0 } };
        DeliveredRecord::open(&log).unwrap().write(nowhere).unwrap();
        let before = BeforeRestart::read(&log).unwrap();
        assert!(!written_before_restart(&before, 15, prefix));
    }

    /// A record of the version before (an offset, no inode) left with a log at its bound: the
    /// log is read before this wrapper rotates it, so the place is in the right file.
    #[test]
    fn a_record_of_the_version_before_is_read_before_the_log_is_rotated_at_start() {
        use super::super::terminal_log::MIN_MAX_BYTES;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("bob.log");
        let prefix = "[A2A:c54af1ff:alice:R]";
        let mut old = vec![b' '; MIN_MAX_BYTES as usize];
        let from = old.len();
        old.extend_from_slice(format!("{prefix} the second turn\r\n").as_bytes());
        std::fs::write(&log, old).unwrap();
        std::fs::write(delivered_path(&log), format!("12 {from}")).unwrap();
        let (before, _output) = open_log(&log, Some(MIN_MAX_BYTES)).unwrap();
        let before = before.unwrap();
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0, "rotated at start");
        assert!(written_before_restart(&before, 12, prefix));
    }

    /// The logs the wrapper before left are read from the files as they were, held open: this
    /// wrapper's rotations (a freed inode given to its new log, whose output may redraw a first
    /// turn's header) change nothing. Once this wrapper began a log of its own, they are let go
    /// and a ticket recorded before the restart is written again.
    #[test]
    fn the_logs_left_before_a_restart_are_read_as_they_were_and_let_go_after_a_rotation() {
        use super::super::terminal_log::{MIN_MAX_BYTES, TerminalLog};
        use std::io::Write;
        let prefix = "[A2A:c54af1ff:alice:R]";
        let fill = vec![b' '; MIN_MAX_BYTES as usize];
        // A follow-up's place taken in a log already rotated once; its echo came (or not)
        // before the kill. The next wrapper's CLI redraws the conversation over two rotations.
        let restart = |echoed: bool| {
            let dir = tempfile::tempdir().unwrap();
            let log = dir.path().join("bob.log");
            let mut output = TerminalLog::open(&log, Some(MIN_MAX_BYTES)).unwrap();
            output.write_all(format!("> {prefix} the first turn\r\n").as_bytes()).unwrap();
            output.write_all(&fill).unwrap();
            output.write_all(b"> ").unwrap();
            DeliveredRecord::open(&log).unwrap().write(WrittenTicket::now(12, &log)).unwrap();
            if echoed {
                output.write_all(format!("{prefix} the second turn\r\n").as_bytes()).unwrap();
            }
            drop(output);
            let (before, mut output) = open_log(&log, Some(MIN_MAX_BYTES)).unwrap();
            let before = before.unwrap();
            assert!(!before.outdated());
            for _ in 0..2 {
                output.write_all(&fill).unwrap();
                output.write_all(format!("{prefix} the first turn\r\n").as_bytes()).unwrap();
            }
            assert!(before.outdated(), "this wrapper began logs of its own");
            assert!(!written_before_restart(&before, 12, prefix), "let go: written again");
            // Had the ticket come before: only what the logs held at the restart counts.
            written_before_restart(&BeforeRestart { rotations: None, ..before }, 12, prefix)
        };
        assert!(restart(true));
        assert!(!restart(false), "the new CLI's redraw is no proof");
    }
}
