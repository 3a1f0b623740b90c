//! The agent's terminal log (`logs/<agent_id>.log`): everything its CLI printed, which
//! `synapse logs` shows and the watcher reads after a restart for the echo of a ticket written
//! before it (see `watcher::written_before_restart`).
//!
//! Kept within a bound: once the log reaches `SYNAPSE_TERMINAL_LOG_MB` (16; 0 for no bound) it
//! is renamed `<agent_id>.log.1`, replacing the one before, and a new log begins, so an agent
//! keeps at most about twice that. A CLI that redraws its screen writes megabytes an hour, and
//! an agent may run for days. A place in the log is its file's inode and an offset in that
//! file ([`Place`]), so that a place taken before a rotation is still found after it.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The bound in MB when `SYNAPSE_TERMINAL_LOG_MB` is unset.
const DEFAULT_MAX_MB: f64 = 16.0;
/// The smallest bound taken: the echo check reads up to this much of the end of the log, which
/// the log and the one before it always hold together.
pub(super) const MIN_MAX_BYTES: u64 = 256 << 10;

/// The terminal log before the current one (`<agent_id>.log.1`), kept once the log reached its
/// bound (`SYNAPSE_TERMINAL_LOG_MB`).
pub fn rotated_path(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// The bound the environment asks for (`SYNAPSE_TERMINAL_LOG_MB`, decimals taken, 0 for none),
/// or why the value is refused (the default then applies).
pub(super) fn max_bytes_from(value: Option<&str>) -> Result<Option<u64>, String> {
    let Some(value) = value.map(str::trim).filter(|value| !value.is_empty()) else {
        return Ok(Some(mb_to_bytes(DEFAULT_MAX_MB)));
    };
    match value.parse::<f64>() {
        Ok(mb) if mb == 0.0 && !value.starts_with('-') => Ok(None),
        Ok(mb) if mb.is_finite() && mb > 0.0 => Ok(Some(mb_to_bytes(mb))),
        _ => Err(format!(
            "SYNAPSE_TERMINAL_LOG_MB={} is not a size in MB (0 for no bound): the terminal log is kept within {DEFAULT_MAX_MB} MB",
            crate::escape::visible_line(value)
        )),
    }
}

fn mb_to_bytes(mb: f64) -> u64 {
    // `as` saturates: a huge value is no bound to speak of, never a wrapped one.
    ((mb * 1_048_576.0) as u64).max(MIN_MAX_BYTES)
}

/// The bound for this wrapper, read from its environment (a refused value is said once, in the
/// wrapper's log).
pub(super) fn max_bytes() -> Option<u64> {
    max_bytes_from(std::env::var("SYNAPSE_TERMINAL_LOG_MB").ok().as_deref()).unwrap_or_else(|refused| {
        tracing::warn!("{refused}");
        Some(mb_to_bytes(DEFAULT_MAX_MB))
    })
}

/// A place in the terminal log: the file (its inode) and how far into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    pub inode: u64,
    pub offset: u64,
}

impl Place {
    /// Where the log at `log` ends now (None when there is no log).
    pub fn end_of(log: &Path) -> Option<Place> {
        std::fs::metadata(log).ok().map(|meta| Place { inode: meta.ino(), offset: meta.len() })
    }
}

/// The log as the reader thread writes it: appended to, and rotated once it reaches its bound.
pub(super) struct TerminalLog {
    path: PathBuf,
    file: std::fs::File,
    len: u64,
    max: Option<u64>,
    /// How much more is written before a rotation whose rename failed is tried again.
    retry_after: u64,
    /// Renamed, but the new log could not be made: made at the next write (until then the
    /// output goes on into the renamed one).
    detached: bool,
    /// Why the new log could not be made was said (once per rotation).
    said: bool,
    /// How many new logs this one began (a rotation at open too).
    rotations: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl TerminalLog {
    /// Opens (or creates) the log at `path` for appending; one already at its bound is rotated
    /// first.
    pub fn open(path: &Path, max: Option<u64>) -> std::io::Result<TerminalLog> {
        let file = crate::private_files::open_append(path)?;
        let len = file.metadata()?.len();
        let mut log = TerminalLog {
            path: path.to_path_buf(),
            file,
            len,
            max,
            retry_after: 0,
            detached: false,
            said: false,
            rotations: std::sync::Arc::default(),
        };
        log.rotate_if_full();
        Ok(log)
    }

    fn rotate_if_full(&mut self) {
        if self.detached {
            self.begin_new_log();
            return;
        }
        let Some(max) = self.max else { return };
        if self.len < max.saturating_add(self.retry_after) {
            return;
        }
        // The log becomes `<log>.1` (replacing the one before) and a new, empty one begins. A
        // reader following the log (`synapse logs --follow`) finds the new one by its inode.
        match std::fs::rename(&self.path, rotated_path(&self.path)) {
            // Removed (by hand): the new log is made all the same.
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                // Nothing is lost: the log goes on growing, and the rotation is tried again
                // once it has grown by its bound again.
                tracing::warn!("cannot rename the terminal log {}: {error}", self.path.display());
                self.retry_after = self.len;
            }
            _ => {
                self.retry_after = 0;
                self.detached = true;
                self.rotations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.begin_new_log();
            }
        }
    }

    /// How many new logs it began, counted on (a rotation at open included).
    pub fn rotations(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.rotations.clone()
    }

    /// Makes the new log once the old one is renamed. Until it can be made (no descriptor left,
    /// say), the output goes on into the renamed one, and it is tried again at every write.
    fn begin_new_log(&mut self) {
        let made = crate::private_files::open_append(&self.path).and_then(|file| Ok((file.metadata()?.len(), file)));
        match made {
            Ok((len, file)) => {
                (self.file, self.len, self.detached, self.said) = (file, len, false, false);
            }
            Err(error) if !self.said => {
                tracing::warn!("cannot begin a new terminal log at {}: {error}", self.path.display());
                self.said = true;
            }
            Err(_) => {}
        }
    }
}

impl Write for TerminalLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.file.write(bytes)?;
        self.len += written as u64;
        self.rotate_if_full();
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The end of the terminal log as it was at a moment (a wrapper's start): the log before the
/// current one (if any) and the current one, each as its inode and length, oldest first, and
/// each held open: what they held then is read from them later, whatever was renamed, removed or
/// made since (a file removed keeps its inode while it is open, so no new log can take it).
#[derive(Debug)]
pub(super) struct LogEnds(Vec<(Place, std::fs::File)>);

impl LogEnds {
    pub fn read(log: &Path) -> LogEnds {
        let end = |path: &Path| {
            let file = crate::private_files::open_regular(path).ok()?;
            let meta = file.metadata().ok()?;
            Some((Place { inode: meta.ino(), offset: meta.len() }, file))
        };
        let current = end(log);
        let before = end(&rotated_path(log))
            .filter(|(before, _)| current.as_ref().is_none_or(|(current, _)| current.inode != before.inode));
        LogEnds(before.into_iter().chain(current).collect())
    }

    /// Where the current log ended.
    pub fn current(&self) -> Option<Place> {
        self.0.last().map(|(place, _)| *place)
    }

    /// The bytes of the logs as they ended then, from `from` on (a place in one of them; None:
    /// from the start of the older one), at most the last `limit` bytes. A place in neither
    /// file gives nothing: whether the logs hold only what came after it cannot be told (it was
    /// taken two rotations ago, or in a log removed by hand since, or the home was copied and
    /// every inode changed), and a ticket is written again rather than taken for seen on the
    /// strength of an earlier echo.
    pub fn read_from(&self, from: Option<Place>, limit: u64) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let start_index = match from {
            None => 0,
            Some(from) => match self.0.iter().position(|(end, _)| end.inode == from.inode) {
                Some(index) => index,
                None => return Vec::new(),
            },
        };
        let mut spans: Vec<(&std::fs::File, u64, u64)> = Vec::new();
        for (index, (end, file)) in self.0.iter().enumerate().skip(start_index) {
            let begin = match from {
                Some(from) if index == start_index => from.offset,
                _ => 0,
            };
            if begin < end.offset {
                spans.push((file, begin, end.offset));
            }
        }
        // Only the last `limit` bytes: trim the spans from the front.
        let mut excess = spans.iter().map(|(_, begin, end)| end - begin).sum::<u64>().saturating_sub(limit);
        for span in &mut spans {
            let cut = excess.min(span.2 - span.1);
            span.1 += cut;
            excess -= cut;
        }
        let mut bytes = Vec::new();
        for (file, begin, end) in spans.into_iter().filter(|(_, begin, end)| begin < end) {
            let mut chunk = vec![0; usize::try_from(end - begin).unwrap_or(0)];
            let mut read = 0;
            while read < chunk.len() {
                match file.read_at(&mut chunk[read..], begin + read as u64) {
                    Ok(0) | Err(_) => break,
                    Ok(count) => read += count,
                }
            }
            bytes.extend_from_slice(&chunk[..read]);
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_comes_from_the_environment_with_a_floor_and_a_way_to_turn_it_off() {
        let default = Some(16 << 20);
        assert_eq!(max_bytes_from(None), Ok(default));
        assert_eq!(max_bytes_from(Some(" ")), Ok(default));
        assert_eq!(max_bytes_from(Some("0")), Ok(None));
        assert_eq!(max_bytes_from(Some("2")), Ok(Some(2 << 20)));
        assert_eq!(max_bytes_from(Some("0.5")), Ok(Some(512 << 10)));
        assert_eq!(max_bytes_from(Some("0.01")), Ok(Some(MIN_MAX_BYTES)), "raised to the floor");
        assert_eq!(max_bytes_from(Some("1e30")), Ok(Some(u64::MAX)));
        for bad in ["-1", "-0", "ten", "NaN", "inf", "1\u{1b}[2J"] {
            let refused = max_bytes_from(Some(bad)).unwrap_err();
            assert!(refused.contains("not a size in MB") && !refused.contains('\u{1b}'), "{refused}");
        }
    }

    #[test]
    fn the_log_is_renamed_once_full_and_a_new_one_begins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bob.log");
        let max = MIN_MAX_BYTES;
        let mut log = TerminalLog::open(&path, Some(max)).unwrap();
        let chunk = vec![b'a'; 100 << 10];
        log.write_all(&chunk).unwrap();
        log.write_all(&chunk).unwrap();
        assert!(!rotated_path(&path).exists(), "below the bound");
        log.write_all(&chunk).unwrap();
        // The chunk that reached the bound ends the old log, whole.
        assert_eq!(std::fs::metadata(rotated_path(&path)).unwrap().len(), 300 << 10);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        log.write_all(b"next").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"next");
        for _ in 0..6 {
            log.write_all(&chunk).unwrap();
        }
        // Only one log is kept before the current one: the bound holds.
        let kept: u64 =
            std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().metadata().unwrap().len()).sum();
        assert!(kept <= 2 * (max + (100 << 10)), "{kept}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        // Opened again when already full (a wrapper started on a long log): rotated first.
        std::fs::write(&path, vec![b'b'; max as usize]).unwrap();
        let _log = TerminalLog::open(&path, Some(max)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert_eq!(std::fs::read(rotated_path(&path)).unwrap(), vec![b'b'; max as usize]);
        // No bound: never rotated.
        std::fs::write(&path, vec![b'c'; 2 * max as usize]).unwrap();
        let mut log = TerminalLog::open(&path, None).unwrap();
        log.write_all(b"more").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * max + 4);
    }

    /// A rotation that cannot be done (the directory made read-only, say) loses nothing: the
    /// log goes on growing and the rotation is tried again later.
    #[test]
    fn a_rotation_that_fails_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bob.log");
        let max = MIN_MAX_BYTES;
        let mut log = TerminalLog::open(&path, Some(max)).unwrap();
        // A directory where the old log should go: the rename fails.
        std::fs::create_dir(rotated_path(&path)).unwrap();
        std::fs::write(rotated_path(&path).join("x"), "x").unwrap();
        let chunk = vec![b'a'; 200 << 10];
        log.write_all(&chunk).unwrap();
        log.write_all(&chunk).unwrap();
        log.write_all(b"end").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), (400 << 10) + 3, "all of it kept");
        std::fs::remove_dir_all(rotated_path(&path)).unwrap();
        log.write_all(&chunk).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), (600 << 10) + 3, "not yet tried again");
        log.write_all(&chunk).unwrap();
        assert_eq!(std::fs::metadata(rotated_path(&path)).unwrap().len(), (800 << 10) + 3, "tried again");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }

    /// The log removed by hand: a new one begins at the bound, and the older log stays.
    #[test]
    fn a_log_removed_by_hand_is_begun_again_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bob.log");
        std::fs::write(rotated_path(&path), "older").unwrap();
        let mut log = TerminalLog::open(&path, Some(MIN_MAX_BYTES)).unwrap();
        std::fs::remove_file(&path).unwrap();
        log.write_all(&vec![b'a'; MIN_MAX_BYTES as usize]).unwrap();
        log.write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(std::fs::read(rotated_path(&path)).unwrap(), b"older");
    }

    /// A new log that cannot be made (its directory gone): the output goes on into the file it
    /// has, and the new log is made after the first write once it can be.
    #[test]
    fn a_new_log_that_cannot_be_made_is_made_after_the_first_write_that_can() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let path = logs.join("bob.log");
        let mut log = TerminalLog::open(&path, Some(MIN_MAX_BYTES)).unwrap();
        let rotations = log.rotations();
        log.write_all(b"kept ").unwrap();
        std::fs::remove_dir_all(&logs).unwrap();
        log.write_all(&vec![b'a'; MIN_MAX_BYTES as usize]).unwrap();
        assert!(log.detached, "renamed (already gone), no new log");
        log.write_all(b"still kept").unwrap();
        assert_eq!(log.len, MIN_MAX_BYTES + 15, "written into the file it has");
        std::fs::create_dir(&logs).unwrap();
        log.write_all(b"last in the old").unwrap();
        assert!(!log.detached, "made after that write");
        log.write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(rotations.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn the_end_of_the_log_is_read_across_a_rotation_from_a_place_taken_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bob.log");
        let mut log = TerminalLog::open(&path, Some(MIN_MAX_BYTES)).unwrap();
        log.write_all(b"before ").unwrap();
        let place = Place::end_of(&path).unwrap();
        log.write_all(b"HEAD").unwrap();
        log.write_all(&vec![b'.'; MIN_MAX_BYTES as usize]).unwrap();
        log.write_all(b"ER after").unwrap();
        let ends = LogEnds::read(&path);
        assert_eq!(ends.0.len(), 2);
        let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap().replace('.', "");
        // From the place on, through both files: a header cut by the rotation is whole.
        assert_eq!(text(ends.read_from(Some(place), u64::MAX)), "HEADER after");
        // From nowhere known: all of both.
        assert_eq!(text(ends.read_from(None, u64::MAX)), "before HEADER after");
        // The last bytes only.
        assert_eq!(ends.read_from(Some(place), 5), b"after");
        // A place in neither log (two rotations old, or the home copied): nothing to go by.
        let gone = Place { inode: u64::MAX, offset: 3 };
        assert!(ends.read_from(Some(gone), u64::MAX).is_empty());
        // Not a regular file (a FIFO planted as the older log): skipped, without waiting.
        let fifo = dir.path().join("fifo.log");
        std::fs::write(&fifo, "current").unwrap();
        assert!(std::process::Command::new("mkfifo").arg(rotated_path(&fifo)).status().unwrap().success());
        let fifo_ends = LogEnds::read(&fifo);
        assert_eq!(fifo_ends.read_from(None, u64::MAX), b"current");
        assert!(crate::private_files::open_regular(&rotated_path(&fifo)).is_err());
        // Rotated twice since the ends were read (a freed inode may be given to a new log): what
        // the logs held then is read from them, and nothing that came after.
        for _ in 0..2 {
            log.write_all(&vec![b'!'; MIN_MAX_BYTES as usize]).unwrap();
        }
        log.write_all(b"HEADER again").unwrap();
        assert_eq!(text(ends.read_from(Some(place), u64::MAX)), "HEADER after");
    }
}
