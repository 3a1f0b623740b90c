//! The CLI's PTY: spawning the CLI in it, and the threads that own its blocking I/O — one
//! writer (the only owner of the PTY's writer), one reader (output → terminal or log, and the
//! screen model), one waiter (reaps the child).
//!
//! The reader and writer threads take their ends as parameters (anything `Read` / `Write`), so
//! tests drive them with in-memory pipes and no terminal. Invariants: the writer's queue is
//! lossless (unbounded: a ticket or a keystroke is never dropped, and the async side never
//! blocks on a slow CLI); a write is answered only once its bytes are written and flushed, and
//! its record (if any) is written right after them on the same thread, with no task switch in
//! between; every output chunk reaches the sink before the screen model, and the model before
//! the change counter is bumped, so whoever wakes on the counter sees the chunk.

use super::watcher::{DeliveredRecord, WrittenTicket};
use crate::agent::readiness::Readiness;
use portable_pty::{CommandBuilder, MasterPty, PtySize};
use std::io::{Read, Write};
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::{oneshot, watch};

/// A CLI running in a PTY, as [`spawn`] leaves it: the ends of the PTY not yet handed to their
/// threads.
pub(super) struct SpawnedCli {
    pub master: Box<dyn MasterPty + Send>,
    pub child: Box<dyn portable_pty::Child + Send + Sync>,
    pub child_pid: Option<u32>,
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
}

/// Opens a PTY of `rows` × `cols` and starts `command` (the program `program`) in it.
pub(super) fn spawn(program: &str, command: CommandBuilder, (rows, cols): (u16, u16)) -> anyhow::Result<SpawnedCli> {
    let pty = portable_pty::native_pty_system()
        .openpty(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 })
        .map_err(|error| anyhow::anyhow!("cannot open a PTY: {error}"))?;
    let child =
        pty.slave.spawn_command(command).map_err(|error| anyhow::anyhow!("cannot start '{program}': {error}"))?;
    // The slave must go now, or the reader never sees end-of-file.
    drop(pty.slave);
    let child_pid = child.process_id();
    let reader = pty.master.try_clone_reader().map_err(|error| anyhow::anyhow!("PTY reader: {error}"))?;
    let writer = pty.master.take_writer().map_err(|error| anyhow::anyhow!("PTY writer: {error}"))?;
    Ok(SpawnedCli { master: pty.master, child, child_pid, reader, writer })
}

/// The screen model of the CLI's output, and the counter that announces a change.
pub(super) struct Screen {
    readiness: Mutex<Readiness>,
    /// Bumped on every output chunk and every input written: wakes the status reporter and
    /// anyone waiting for the CLI to react (a watch, so no wake-up is lost and many can wait).
    output_changed: watch::Sender<u64>,
}

impl Screen {
    pub fn new(readiness: Readiness) -> Screen {
        Screen { readiness: Mutex::new(readiness), output_changed: watch::channel(0).0 }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Readiness> {
        self.readiness.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes everyone following the counter.
    pub fn notify(&self) {
        self.output_changed.send_modify(|count| *count += 1);
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.output_changed.subscribe()
    }

    fn output(&self, bytes: &[u8], now: Instant) {
        self.lock().feed(bytes, now);
        self.notify();
    }
}

/// One write into the PTY; `done` is answered once the bytes are written.
struct PtyWrite {
    bytes: Vec<u8>,
    done: Option<oneshot::Sender<()>>,
    /// A ticket to record as written right after the bytes, on the writer thread (no task
    /// switch in between).
    then_record: Option<(DeliveredRecord, WrittenTicket)>,
}

/// The way to the writer thread. Its queue is lossless: unbounded, so neither a ticket nor a
/// keystroke is ever dropped and no caller blocks on a CLI slow to read.
#[derive(Clone)]
pub(super) struct PtyInput {
    queue: std::sync::mpsc::Sender<PtyWrite>,
    /// When a Ctrl-C (0x03) was last written into the CLI, by the wrapper or its user: a second
    /// one soon after ends most CLIs (see `profile::CTRL_C_EXIT_WINDOW`).
    last_ctrl_c: std::sync::Arc<Mutex<Option<Instant>>>,
}

impl PtyInput {
    /// When a Ctrl-C was last written into the CLI.
    pub fn last_ctrl_c(&self) -> Option<Instant> {
        *self.last_ctrl_c.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues bytes without waiting for them (the user's keystrokes); lost only with the PTY.
    pub fn send(&self, bytes: Vec<u8>) {
        let _ = self.queue.send(PtyWrite { bytes, done: None, then_record: None });
    }

    /// Writes bytes; returns once they are written.
    pub async fn write(&self, bytes: Vec<u8>) -> anyhow::Result<()> {
        self.write_then_record(bytes, None).await
    }

    /// Writes bytes, then records `then_record`'s ticket on the writer thread right after them;
    /// returns once both are done.
    pub async fn write_then_record(
        &self,
        bytes: Vec<u8>,
        then_record: Option<(DeliveredRecord, WrittenTicket)>,
    ) -> anyhow::Result<()> {
        let (done, written) = oneshot::channel();
        self.queue
            .send(PtyWrite { bytes, done: Some(done), then_record })
            .map_err(|_| anyhow::anyhow!("the PTY is closed"))?;
        written.await.map_err(|_| anyhow::anyhow!("the PTY is closed"))
    }
}

/// Do these bytes hold a Ctrl-C: 0x03, or as a terminal sends it once the CLI asked for the
/// kitty keyboard protocol (`CSI 99;5u`, with an event type `CSI 99;5:1u`) or xterm's
/// modifyOtherKeys (`CSI 27;5;99~`)?
fn is_ctrl_c(bytes: &[u8]) -> bool {
    let holds = |needle: &[u8]| bytes.windows(needle.len()).any(|window| window == needle);
    bytes.contains(&0x03) || holds(b"\x1b[99;5u") || holds(b"\x1b[99;5:") || holds(b"\x1b[27;5;99~")
}

/// Starts the writer thread: the one owner of the PTY writer (dropping it would send EOF to the
/// CLI), alive as long as a [`PtyInput`] is.
pub(super) fn spawn_writer(writer: Box<dyn Write + Send>) -> std::io::Result<PtyInput> {
    let (queue, pty_queue) = std::sync::mpsc::channel::<PtyWrite>();
    let last_ctrl_c = std::sync::Arc::new(Mutex::new(None));
    let ctrl_c_written = last_ctrl_c.clone();
    std::thread::Builder::new().name("pty-writer".into()).spawn(move || {
        let mut writer = writer;
        while let Ok(write) = pty_queue.recv() {
            let ok = writer.write_all(&write.bytes).and_then(|_| writer.flush()).is_ok();
            // A message's text never carries a control byte (`escape::keystrokes`): a Ctrl-C is
            // the wrapper's interrupt or its user's key.
            if ok && is_ctrl_c(&write.bytes) {
                *ctrl_c_written.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Instant::now());
            }
            if let (true, Some((record, written))) = (ok, &write.then_record)
                && let Err(error) = record.write(*written)
            {
                tracing::warn!("cannot record ticket {} as written: {error}", written.ticket);
            }
            if let Some(done) = write.done
                && ok
            {
                let _ = done.send(());
            }
        }
    })?;
    Ok(PtyInput { queue, last_ctrl_c })
}

/// Writes to the terminal and the log.
pub(super) struct Tee(pub std::io::Stdout, pub super::terminal_log::TerminalLog);

impl Write for Tee {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let _ = self.1.write_all(bytes);
        self.0.write_all(bytes)?;
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Starts the reader thread: the CLI's output to `sink` (the user's terminal and the log, or the
/// log alone) and to the screen model. The returned receiver fires when the output ends.
pub(super) fn spawn_reader(
    reader: Box<dyn Read + Send>,
    sink: Box<dyn Write + Send>,
    screen: std::sync::Arc<Screen>,
) -> std::io::Result<oneshot::Receiver<()>> {
    let (output_ended, output_done) = oneshot::channel::<()>();
    std::thread::Builder::new().name("pty-reader".into()).spawn(move || {
        let mut reader = reader;
        let mut sink = sink;
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            match reader.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(count) => {
                    let _ = sink.write_all(&buffer[..count]).and_then(|_| sink.flush());
                    screen.output(&buffer[..count], Instant::now());
                }
            }
        }
        let _ = output_ended.send(());
    })?;
    Ok(output_done)
}

/// Starts the waiter thread (nothing else reaps the child); the receiver gets its exit code.
pub(super) fn spawn_waiter(
    mut child: Box<dyn portable_pty::Child + Send + Sync>,
) -> std::io::Result<oneshot::Receiver<i32>> {
    let (exited, child_exit) = oneshot::channel::<i32>();
    std::thread::Builder::new().name("pty-waiter".into()).spawn(move || {
        let code = child.wait().map(|status| i32::try_from(status.exit_code()).unwrap_or(1)).unwrap_or(1);
        let _ = exited.send(code);
    })?;
    Ok(child_exit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::profile::builtin;
    use crate::event::AgentStatus;
    use std::sync::Arc;

    /// A `Write` whose bytes the test reads back afterwards (the user's terminal or the log).
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_ticket_written_through_the_writer_reaches_the_cli_as_one_paste_then_its_submit_key_then_its_record() {
        let (mut cli_side, wrapper_side) = std::io::pipe().unwrap();
        let input = spawn_writer(Box::new(wrapper_side)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("bob.log");
        let record = DeliveredRecord::open(&log).unwrap();
        let recorded = || std::fs::read_to_string(log.with_extension("delivered")).unwrap();
        let header = "[A2A:c54af1ff:alice:R]";
        let keys = crate::escape::keystrokes(header, "two lines\nof text", true, "\r");
        input.write(keys.paste.clone()).await.unwrap();
        assert_eq!(recorded(), "", "no record before the submit key");
        let log_from = super::super::terminal_log::Place { inode: 99, offset: 12 };
        let written = WrittenTicket { ticket: 7, log_from };
        input.write_then_record(keys.submit.clone(), Some((record, written))).await.unwrap();
        assert_eq!(recorded().trim(), "7 12 99", "recorded once the submit key is written");
        // The user's keystrokes queued after the ticket come after it, never inside it.
        input.send(b"ls".to_vec());
        drop(input);
        let mut received = Vec::new();
        cli_side.read_to_end(&mut received).unwrap();
        assert_eq!(received, [&b"\x1b[200~[A2A:c54af1ff:alice:R] two lines\nof text\x1b[201~\r"[..], b"ls"].concat());
    }

    /// A Ctrl-C written into the CLI (the user's key or an interrupt) is remembered: a second
    /// one soon after would end most CLIs.
    #[tokio::test]
    async fn the_last_ctrl_c_written_is_remembered() {
        let (mut cli_side, wrapper_side) = std::io::pipe().unwrap();
        let input = spawn_writer(Box::new(wrapper_side)).unwrap();
        input.write(b"[A2A:1:a] text\r".to_vec()).await.unwrap();
        assert_eq!(input.last_ctrl_c(), None);
        let before = Instant::now();
        input.write(vec![0x03]).await.unwrap();
        assert!(input.last_ctrl_c().is_some_and(|at| at >= before));
        // As a terminal in the kitty keyboard protocol or modifyOtherKeys sends it.
        for key in [&b"\x1b[99;5u"[..], b"\x1b[99;5:1u", b"\x1b[27;5;99~"] {
            let before = Instant::now();
            input.write(key.to_vec()).await.unwrap();
            assert!(input.last_ctrl_c().is_some_and(|at| at >= before), "{key:?}");
        }
        assert!(!is_ctrl_c(b"\x1b[99u") && !is_ctrl_c(b"\x1b[99;2u") && !is_ctrl_c(b"c"));
        drop(input);
        let mut received = Vec::new();
        cli_side.read_to_end(&mut received).unwrap();
        assert!(received.ends_with(b"\x1b[27;5;99~"));
    }

    #[tokio::test]
    async fn a_write_into_a_closed_pty_fails_instead_of_waiting_forever() {
        let (cli_side, wrapper_side) = std::io::pipe().unwrap();
        drop(cli_side);
        let input = spawn_writer(Box::new(wrapper_side)).unwrap();
        assert!(input.write(b"hello".to_vec()).await.is_err());
    }

    #[tokio::test]
    async fn cli_output_read_by_the_reader_reaches_the_sink_and_the_screen_model() {
        let (wrapper_side, mut cli_side) = std::io::pipe().unwrap();
        let screen = Arc::new(Screen::new(Readiness::new(builtin("dummy").unwrap().idle, 24, 80)));
        let mut changes = screen.subscribe();
        let sink = Captured::default();
        let ended = spawn_reader(Box::new(wrapper_side), Box::new(sink.clone()), screen.clone()).unwrap();
        assert_eq!(screen.lock().status(Instant::now()).0, AgentStatus::Starting);
        cli_side.write_all(b"Dummy agent ready.\r\n> ").unwrap();
        changes.changed().await.unwrap();
        drop(cli_side);
        ended.await.unwrap();
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"Dummy agent ready.\r\n> ");
        let mut readiness = screen.lock();
        assert!(readiness.last_output().is_some());
        assert_eq!(readiness.status(Instant::now()).0, AgentStatus::Ready, "the dummy's prompt is on screen");
    }
}
