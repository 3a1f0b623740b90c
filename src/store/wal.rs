//! The write-ahead log: what makes a batch durable between two durable redb commits.
//!
//! A durable redb commit writes every page the batch changed (a send changes about fifteen, in
//! as many tables' trees, scattered over the file) and then fsyncs the file. On this kind of
//! disk an fsync costs about 30 µs more for every separate extent it writes: 135 µs for one
//! page, 560 µs for fifteen scattered ones, 150 µs for fifteen contiguous ones. So a batch's
//! events are appended here, in one write, and fsynced; the redb transaction is then committed
//! without an fsync (`Durability::None`: readers see it, and redb keeps the last durable state
//! intact on disk). Every few hundred batches, and when the writer is idle, a durable redb
//! commit (a checkpoint) makes everything durable in the database itself and the log starts
//! over.
//!
//! After a crash redb opens at its last durable commit; the events the log holds past it are
//! appended and applied again ([`super::Store::open`]), exactly as they were the first time.
//!
//! The file is a sequence of records, each `[salt u64][payload length u32][CRC-32 u32]` then the
//! payload: the batch's events, each `[seq u64][length u32][encoded envelope]`, all
//! little-endian. The salt is a random number the database keeps (one per database, made when
//! it is first opened by a build that writes salts); the checksum covers the salt and the
//! payload. A checkpoint does not shrink the file: records are written again from its start,
//! over older ones. Every record is followed by zeros (a header's worth at least), so that where
//! the log ends reads as its end, never as the older bytes there (a message's text among them,
//! which a sender chose). Reading stops at the first record that is cut short, fails its
//! checksum or does not continue the sequence (an older record left behind).
//!
//! Where reading stopped, the rest of the file is searched for the salt: a record of ours there
//! holding events the database does not have means the log was damaged in the middle (a length
//! changed, a block zeroed), and the open is refused rather than those acknowledged events
//! dropped without a word. A sender cannot forge such a record inside a message's text: the salt
//! never leaves this file and the database. Records older than the last checkpoint hold events
//! the database has, and are passed over.
//!
//! A log written before salts (`[payload length u32][CRC-32 of the payload u32]` headers) is
//! read once, the old way; the log then starts over in the new form.
//!
//! On Linux a record is written with direct I/O (`O_DIRECT`, a second descriptor) where the
//! file system allows it: the block holding the log's end is written again whole, its head
//! (the end of the record before) from a copy kept in memory and its rest zeros; the
//! `fdatasync` follows as before. On this machine's disk that took 8-10 % off an append
//! (779-byte records, alternated append by append with the page cache's way, 1,500 each, four
//! runs: medians 181-225 µs against 200-249 µs). Records larger than [`SEPARATE_WRITES_FROM`]
//! go through the page cache, and so does everything after a direct open or write failed
//! (a file system without direct I/O; a full disk fails the append instead).

use super::StoreError;
use super::fault::SimulatedDisk;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const RECORD_HEADER: usize = 16;
/// The header of a record written before salts: length and checksum.
const LEGACY_HEADER: usize = 8;
/// Zeros written after every record, so that where the log ends always reads as its end. Left
/// as they were, the bytes there may be an older record's (one from before the last checkpoint,
/// a message's text among them): a sender could have placed a header there that says "damaged,
/// and the next record starts here", with a well-formed record of its own at that place, and
/// after a crash every open was refused for it.
const ZEROS_AFTER: usize = RECORD_HEADER;
/// A batch larger than this is written after its header, rather than copied behind it first.
const SEPARATE_WRITES_FROM: usize = 64 << 10;
const EVENT_HEADER: usize = 12;
/// The file grows by this much at a time, written with zeros: an append inside the file's
/// length needs no metadata update, and its fsync is then that of the data alone (90-130 µs
/// here, against 190-330 µs for an append that grows the file). The store checkpoints once the
/// log holds 4 MiB (the batch that crosses it is logged whole), so after the first few
/// checkpoints the file grows only for a batch larger than any before (it never shrinks).
const GROW_BYTES: u64 = 1 << 20;
/// The size and alignment of a direct write: a page, which covers disks of 512-byte and of
/// 4 KiB sectors alike.
const BLOCK: usize = 4096;

pub(super) struct Wal {
    file: File,
    /// The log opened for direct I/O, when the file system takes it.
    direct: Option<Direct>,
    path: PathBuf,
    /// The database's salt: in every record written, and searched for where reading stops.
    salt: u64,
    /// Where the next record goes: the end of the records written since the last checkpoint.
    end: u64,
    /// Records written since the last checkpoint.
    records: u32,
    /// The file's length as last seen (`None`: ask the file), so that an append within it
    /// needs no `statx`.
    length: Option<u64>,
    /// Tests only: the file is "full" while the switch exists (see [`SimulatedDisk`]).
    simulated_disk: Option<SimulatedDisk>,
    /// Tests only: the next append's fsync fails (as a disk's I/O error would).
    #[cfg(test)]
    fail_next_sync: bool,
}

/// Appends by direct I/O: whole aligned blocks from an aligned buffer.
struct Direct {
    file: File,
    /// The bytes from the start of the block that holds the log's end up to the end (fewer
    /// than [`BLOCK`]): the next record's write begins with them.
    tail: Vec<u8>,
    /// Reused for every write; the aligned part is sliced out of it.
    buffer: Vec<u8>,
}

impl Direct {
    /// Opens `path` for direct I/O; None where the file system (or the system) has none.
    fn open(path: &Path) -> Option<Direct> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path);
            match file {
                Ok(file) => Some(Direct { file, tail: Vec::new(), buffer: Vec::new() }),
                Err(error) => {
                    tracing::debug!("{}: no direct I/O ({error}); records go through the page cache", path.display());
                    None
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = path;
            None
        }
    }

    /// Writes `header` and `payload` at `end` (where the log ends now, `tail` before it), in
    /// whole blocks padded with zeros, `zeros_after` of them at least. Does not sync, nor move
    /// `tail` (the caller does).
    fn write(&mut self, end: u64, header: &[u8], payload: &[u8], zeros_after: usize) -> io::Result<()> {
        let used = self.tail.len() + header.len() + payload.len();
        let length = (used + zeros_after).next_multiple_of(BLOCK);
        self.buffer.clear();
        self.buffer.resize(length + BLOCK, 0);
        let skip = self.buffer.as_ptr().align_offset(BLOCK);
        let block = skip
            .checked_add(length)
            .and_then(|block_end| self.buffer.get_mut(skip..block_end))
            .ok_or_else(|| io::Error::other("no aligned buffer"))?;
        let (head, rest) = block.split_at_mut(self.tail.len());
        head.copy_from_slice(&self.tail);
        let (record_header, rest) = rest.split_at_mut(header.len());
        record_header.copy_from_slice(header);
        rest[..payload.len()].copy_from_slice(payload);
        let start = end.checked_sub(self.tail.len() as u64).filter(|start| start.is_multiple_of(BLOCK as u64));
        let Some(start) = start else {
            // Some file systems would take an unaligned write, through their page cache.
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the copy of the log's last block is out of step"));
        };
        let written = self.file.write_at(block, start)?;
        if written != length {
            // A direct write cannot be continued from an unaligned place: the caller writes
            // the record through the page cache.
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("a direct write of {length} bytes wrote {written}"),
            ));
        }
        Ok(())
    }
}

/// The last `end % BLOCK` bytes of `parts` joined, which end at `end` (`parts` reach back at
/// least to the block's start).
fn tail_of(parts: &[&[u8]], end: u64) -> Vec<u8> {
    let kept = (end % BLOCK as u64) as usize;
    let total: usize = parts.iter().map(|part| part.len()).sum();
    let mut skip = total.saturating_sub(kept);
    let mut tail = Vec::with_capacity(kept);
    for part in parts {
        if skip >= part.len() {
            skip -= part.len();
            continue;
        }
        tail.extend_from_slice(&part[skip..]);
        skip = 0;
    }
    tail
}

/// How the records of a log are written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    /// With this salt.
    Salted(u64),
    /// Before salts.
    Legacy,
}

impl Format {
    fn header_length(self) -> usize {
        match self {
            Format::Salted(_) => RECORD_HEADER,
            Format::Legacy => LEGACY_HEADER,
        }
    }
}

/// What the file holds at an offset.
enum Record {
    /// Nothing more: zeros (the start of the unused part), or a record cut short (`cut`) by the
    /// file's end.
    End {
        cut: bool,
    },
    /// A header without the log's salt: bytes left from before a checkpoint, or damaged.
    Other,
    /// A whole record whose checksum or contents are wrong; the next one would start at `end`.
    Damaged {
        end: u64,
    },
    Valid {
        end: u64,
        events: Vec<LoggedEvent>,
    },
}

/// One event as the log holds it: its sequence number and its encoded envelope.
pub(super) struct LoggedEvent {
    pub seq: u64,
    pub bytes: Vec<u8>,
}

impl Wal {
    /// Opens (or creates, 0600) the log at `path`, whose records carry `salt` (the database's;
    /// never 0).
    pub fn open(path: &Path, salt: u64, simulated_disk: Option<SimulatedDisk>) -> Result<Wal, StoreError> {
        let unreadable = |error: io::Error| StoreError::WalUnreadable {
            path: path.display().to_string(),
            reason: error.to_string(),
        };
        let existed = path.exists();
        let file = crate::private_files::open_read_write(path).map_err(unreadable)?;
        // A FIFO or a device opens, and then fails every write (and the broker with it).
        if !file.metadata().map_err(unreadable)?.is_file() {
            return Err(unreadable(io::Error::other("not a regular file")));
        }
        if !existed {
            // The file must outlive a crash before anything relies on it.
            file.sync_all().map_err(unreadable)?;
            if let Some(dir) = path.parent() {
                File::open(dir).and_then(|dir| dir.sync_all()).map_err(unreadable)?;
            }
        }
        let direct = Direct::open(path);
        Ok(Wal {
            file,
            direct,
            path: path.to_path_buf(),
            salt,
            end: 0,
            records: 0,
            length: None,
            simulated_disk,
            #[cfg(test)]
            fail_next_sync: false,
        })
    }

    /// Tests only: every record through the page cache.
    #[cfg(test)]
    fn without_direct_io(mut self) -> Wal {
        self.direct = None;
        self
    }

    /// Fills the direct writer's copy of the block before `end` from the file (after an open
    /// or an undo); without it, direct I/O is given up.
    fn reload_tail(&mut self) {
        let Some(direct) = &mut self.direct else { return };
        let kept = (self.end % BLOCK as u64) as usize;
        let mut tail = vec![0_u8; kept];
        match self.file.read_exact_at(&mut tail, self.end - kept as u64) {
            Ok(()) => direct.tail = tail,
            Err(error) => {
                tracing::warn!(
                    "{}: cannot read the log's last block ({error}); records go through the page cache",
                    self.path.display()
                );
                self.direct = None;
            }
        }
    }

    /// Every event of the records written since the last checkpoint, in order. Leaves the log
    /// positioned after them. `head`: the database's last event, which every record older than
    /// the last checkpoint is at or below.
    pub fn read(&mut self, head: u64) -> Result<Vec<LoggedEvent>, StoreError> {
        let length = self.file.metadata().map_err(|error| wal_error(&self.path, error))?.len();
        let format = self.format(length)?;
        let mut events: Vec<LoggedEvent> = Vec::new();
        let mut offset = 0_u64;
        let mut records = 0;
        // Why reading stopped, when not at zeros.
        let stopped_at = loop {
            match self.record_at(offset, length, format)? {
                Record::End { cut } => break cut.then_some("a record cut short"),
                Record::Other => break Some("bytes that are no record of this log"),
                Record::Damaged { end } => {
                    // A log written before salts has no salt to search for: only the record where
                    // the damaged one says it ends is looked at.
                    if format == Format::Legacy
                        && let Record::Valid { events: next, .. } = self.record_at(end, length, format)?
                        && let Some(first) = next
                            .first()
                            .filter(|first| first.seq > head && events.last().is_none_or(|last| first.seq > last.seq))
                    {
                        return Err(self.damaged_in_the_middle(offset, "a damaged record", end, first.seq));
                    }
                    break Some("a damaged record");
                }
                Record::Valid { end, events: batch } => {
                    // A record older than the one before it was left from before a checkpoint.
                    if let (Some(last), Some(first)) = (events.last(), batch.first())
                        && first.seq != last.seq + 1
                    {
                        break Some("a record out of sequence");
                    }
                    events.extend(batch);
                    offset = end;
                    records += 1;
                }
            }
        };
        if let Format::Salted(salt) = format {
            // Acknowledged events past the damage would be dropped without a word.
            let newest = events.last().map_or(head, |last| last.seq.max(head));
            let salts = if salt == self.salt { vec![salt] } else { vec![salt, self.salt] };
            if let Some((at, seq)) = self.later_record(offset, length, &salts, newest)? {
                let why = match stopped_at {
                    Some(why) => why,
                    // Zeros at the start are also how a checkpoint leaves the log: a database
                    // older than the log (a copy put back) lacks events it had checkpointed.
                    None if offset == 0 => {
                        "zeros, as a checkpoint leaves it; or is the database an older copy than this log?"
                    }
                    None => "zeros",
                };
                return Err(self.damaged_in_the_middle(offset, why, at, seq));
            }
        }
        if let Some(why) = stopped_at {
            tracing::warn!(
                "{}: what follows the last record, at byte {offset}, is {why} (a write a crash interrupted, never acknowledged, or bytes left from before a checkpoint); the log ends there",
                self.path.display()
            );
        }
        self.end = offset;
        self.records = records;
        self.reload_tail();
        Ok(events)
    }

    /// The refusal of a log whose reading stopped at `offset` (at `why`) with a record holding
    /// event `seq`, not in the database, at `at` after it.
    fn damaged_in_the_middle(&self, offset: u64, why: &str, at: u64, seq: u64) -> StoreError {
        let path = self.path.display();
        StoreError::Corrupt(format!(
            "{path}: the log cannot be read past byte {offset} ({why}), and a record holding event {seq} follows at \
             byte {at}: the events after the damage cannot be read in order. Keep a copy of the file; to open the \
             database with the events before byte {offset} and without those after it, cut the file there: \
             truncate -s {offset} '{path}'"
        ))
    }

    /// How the log's records are written: with the salt of its first record if that record is
    /// whole (the database's salt, unless the log is another database's), before salts if its
    /// first record is whole that way, else (the first record damaged, or none) with the
    /// database's salt.
    fn format(&self, length: u64) -> Result<Format, StoreError> {
        if length >= RECORD_HEADER as u64 {
            let mut first = [0_u8; 8];
            self.file.read_exact_at(&mut first, 0).map_err(|error| wal_error(&self.path, error))?;
            let salt = u64::from_le_bytes(first);
            if salt != 0 && matches!(self.record_at(0, length, Format::Salted(salt))?, Record::Valid { .. }) {
                return Ok(Format::Salted(salt));
            }
        }
        // Written before salts: whole, or damaged and followed by a whole record (which the
        // old way of reading refuses when it holds events the database lacks; read salted,
        // such a log stopped at once and its events were dropped without a word).
        match self.record_at(0, length, Format::Legacy)? {
            Record::Valid { .. } => return Ok(Format::Legacy),
            Record::Damaged { end } if matches!(self.record_at(end, length, Format::Legacy)?, Record::Valid { .. }) => {
                return Ok(Format::Legacy);
            }
            _ => {}
        }
        Ok(Format::Salted(self.salt))
    }

    /// The first whole record at or after `from` that carries one of `salts` and holds events
    /// past `newest`: its offset and first event. Only records of this log carry a salt (no one
    /// else knows it), so however a message's text is made, the search reads the first event
    /// number of each record left in the file, and checksums only those past `newest` (memchr's
    /// search: the byte-by-byte loop took 0.9 s over 17 MB in a debug build, and every open and
    /// reopen searches).
    fn later_record(
        &self,
        from: u64,
        length: u64,
        salts: &[u64],
        newest: u64,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        const CHUNK: usize = 1 << 20;
        let patterns: Vec<[u8; 8]> = salts.iter().map(|salt| salt.to_le_bytes()).collect();
        let finders: Vec<memchr::memmem::Finder<'_>> =
            patterns.iter().map(|pattern| memchr::memmem::Finder::new(pattern.as_slice())).collect();
        let mut chunk = vec![0_u8; CHUNK];
        let mut at = from;
        while at + RECORD_HEADER as u64 <= length {
            let take = usize::try_from(length - at).map_or(CHUNK, |left| left.min(CHUNK));
            self.file.read_exact_at(&mut chunk[..take], at).map_err(|error| wal_error(&self.path, error))?;
            let mut hits: Vec<(usize, u64)> = Vec::new();
            for (finder, salt) in finders.iter().zip(salts) {
                hits.extend(finder.find_iter(&chunk[..take]).map(|index| (index, *salt)));
            }
            hits.sort_unstable();
            for (index, salt) in hits {
                let offset = at + index as u64;
                // A record's first event comes right after its header: one left from before a
                // checkpoint (at or below `newest`) is passed over without its checksum.
                let mut first_seq = [0_u8; 8];
                let seq_at = offset + RECORD_HEADER as u64;
                if seq_at + 8 > length
                    || self.file.read_exact_at(&mut first_seq, seq_at).is_err()
                    || u64::from_le_bytes(first_seq) <= newest
                {
                    continue;
                }
                if let Record::Valid { events, .. } = self.record_at(offset, length, Format::Salted(salt))?
                    && let Some(first) = events.first().filter(|first| first.seq > newest)
                {
                    return Ok(Some((offset, first.seq)));
                }
            }
            if take < CHUNK {
                break;
            }
            // The next chunk begins with the last seven bytes of this one: a salt across the
            // boundary is found whole there.
            at += (take - 7) as u64;
        }
        Ok(None)
    }

    /// The record at `offset` of a file of `length` bytes, written in `format`.
    fn record_at(&self, offset: u64, length: u64, format: Format) -> Result<Record, StoreError> {
        let io_error = |error: io::Error| wal_error(&self.path, error);
        let header_length = format.header_length();
        let start = offset + header_length as u64;
        if start > length {
            // Fewer bytes than a header: what is there, if anything, is no record.
            return Ok(Record::End { cut: false });
        }
        let mut header = [0_u8; RECORD_HEADER];
        let header = &mut header[..header_length];
        self.file.read_exact_at(header, offset).map_err(io_error)?;
        if header.iter().all(|byte| *byte == 0) {
            return Ok(Record::End { cut: false });
        }
        let word = |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
        let (salt, size, checksum) = match format {
            Format::Salted(salt) => {
                if header[..8] != salt.to_le_bytes() {
                    return Ok(Record::Other);
                }
                (Some(salt), word(8), word(12))
            }
            Format::Legacy => (None, word(0), word(4)),
        };
        let end = start + u64::from(size);
        if size == 0 || end > length {
            return Ok(Record::End { cut: true });
        }
        // The checksum first, read a piece at a time: a damaged length may claim most of a large
        // file, which is not to be held in memory for nothing.
        let mut crc = Crc32::new();
        if let Some(salt) = salt {
            crc.update(&salt.to_le_bytes());
        }
        let mut piece = vec![0_u8; usize::try_from(u64::from(size).min(1 << 20)).unwrap_or(1 << 20)];
        let mut at = start;
        while at < end {
            let take = usize::try_from(end - at).map_or(piece.len(), |left| left.min(piece.len()));
            self.file.read_exact_at(&mut piece[..take], at).map_err(io_error)?;
            crc.update(&piece[..take]);
            at += take as u64;
        }
        if crc.finish() != checksum {
            return Ok(Record::Damaged { end });
        }
        // A payload of one piece is in it already.
        let payload = if piece.len() as u64 == u64::from(size) {
            piece
        } else {
            let mut payload = vec![0_u8; size as usize];
            self.file.read_exact_at(&mut payload, start).map_err(io_error)?;
            payload
        };
        let events = parse_payload(&payload);
        Ok(match events {
            Some(events) => Record::Valid { end, events },
            None => Record::Damaged { end },
        })
    }

    /// Appends one batch's events (`payload`, built with [`push_event`]) and waits until they
    /// are on the disk. On failure nothing of it is left to be read back.
    pub fn append(&mut self, payload: &[u8]) -> Result<(), StoreError> {
        let header = record_header(self.salt, payload)?;
        let record_length = (RECORD_HEADER + payload.len()) as u64;
        let written = self.make_room(record_length + ZEROS_AFTER as u64).and_then(|()| {
            if !self.write_direct(&header, payload)? {
                self.write_cached(&header, payload)?;
            }
            if let Some(direct) = &mut self.direct {
                let old_tail = std::mem::take(&mut direct.tail);
                direct.tail = tail_of(&[&old_tail, &header, payload], self.end + record_length);
            }
            #[cfg(test)]
            if std::mem::take(&mut self.fail_next_sync) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            self.file.sync_data()
        });
        match written {
            Ok(()) => {
                self.end += record_length;
                self.records += 1;
                Ok(())
            }
            Err(error) => {
                self.forget_from(self.end);
                self.reload_tail();
                Err(wal_error(&self.path, error))
            }
        }
    }

    /// Writes a record at the log's end by direct I/O: false when it was not (a long record,
    /// no direct I/O, or a failed direct write, after which direct I/O is given up).
    fn write_direct(&mut self, header: &[u8], payload: &[u8]) -> io::Result<bool> {
        let Some(direct) = self.direct.as_mut().filter(|_| payload.len() <= SEPARATE_WRITES_FROM) else {
            return Ok(false);
        };
        match direct.write(self.end, header, payload, ZEROS_AFTER) {
            Ok(()) => Ok(true),
            // Written through the page cache, it would fail the same way.
            Err(error) if super::is_disk_full(&error) => Err(error),
            Err(error) => {
                // EINVAL or EOPNOTSUPP: this file system takes no direct I/O after all. Any
                // other failure: the page cache's write and fsync say whether the disk fails.
                tracing::warn!(
                    "{}: a direct write failed ({error}); records go through the page cache",
                    self.path.display()
                );
                self.direct = None;
                Ok(false)
            }
        }
    }

    /// Writes a record at the log's end through the page cache, and [`ZEROS_AFTER`] after it.
    fn write_cached(&self, header: &[u8], payload: &[u8]) -> io::Result<()> {
        if payload.len() <= SEPARATE_WRITES_FROM {
            let mut record = Vec::with_capacity(RECORD_HEADER + payload.len() + ZEROS_AFTER);
            record.extend_from_slice(header);
            record.extend_from_slice(payload);
            record.extend_from_slice(&[0; ZEROS_AFTER]);
            self.file.write_all_at(&record, self.end)
        } else {
            // A long message is not copied again for the sake of 16 bytes: three writes, one
            // fsync. The payload and the zeros after it first: until the header is written,
            // what lies at `end` is what was there before (zeros after a checkpoint or an undo,
            // or a record older than those before it), so a crash between the writes adds
            // nothing to the log and leaves no record that claims the new payload.
            let after = self.end + RECORD_HEADER as u64;
            self.file.write_all_at(payload, after)?;
            self.file.write_all_at(&[0; ZEROS_AFTER], after + payload.len() as u64)?;
            self.file.write_all_at(header, self.end)
        }
    }

    /// The salt this log's records are written with.
    pub fn salt(&self) -> u64 {
        self.salt
    }

    /// Where the log ends now (to undo a record with [`Wal::undo`]).
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Takes back the records written from `end` on: their batch was not stored after all.
    pub fn undo(&mut self, end: u64) {
        self.forget_from(end);
        self.end = end;
        self.records = self.records.saturating_sub(1);
        self.reload_tail();
    }

    /// Makes the bytes from `offset` on unreadable as a record (best effort: if this fails too,
    /// a record there would come back at the next open).
    fn forget_from(&self, offset: u64) {
        let cleared = self.file.write_all_at(&[0_u8; RECORD_HEADER], offset).and_then(|()| self.file.sync_data());
        if let Err(error) = cleared {
            tracing::error!("{}: cannot take back a record that was not stored: {error}", self.path.display());
        }
    }

    /// Records written since the last checkpoint, and their bytes.
    pub fn pending(&self) -> (u32, u64) {
        (self.records, self.end)
    }

    /// Starts over after a checkpoint (the database now holds every event logged here).
    pub fn reset(&mut self) -> Result<(), StoreError> {
        self.records = 0;
        self.end = 0;
        if let Some(direct) = &mut self.direct {
            direct.tail.clear();
        }
        // The first header is zeroed so that an open finds nothing to replay even before the
        // next record is written; older records after it are never read (see the module).
        let length = self.file.metadata().map_err(|error| wal_error(&self.path, error))?.len();
        if length == 0 {
            return Ok(());
        }
        // With direct I/O the first block is written directly too (a page left dirty in the
        // cache would be written out, and waited for, before the next record's direct write),
        // as it is: only the header zeroed. Zeros over the rest could reach the disk without
        // the header's sector, leaving a damaged first record followed by an intact older one,
        // which an open refuses.
        if let Some(direct) = &mut self.direct {
            let mut block = vec![0_u8; usize::try_from(length).map_or(BLOCK, |length| length.min(BLOCK))];
            let zeroed = self.file.read_exact_at(&mut block, 0).and_then(|()| {
                direct.write(0, &[0_u8; RECORD_HEADER], block.get(RECORD_HEADER..).unwrap_or_default(), 0)
            });
            if zeroed.is_ok() {
                return Ok(());
            }
        }
        self.file.write_all_at(&[0_u8; RECORD_HEADER], 0).map_err(|error| wal_error(&self.path, error))
    }

    /// Grows the file with zeros (by [`GROW_BYTES`] at least) when `bytes` more would not fit;
    /// the append's fsync makes the new length durable with the record.
    fn make_room(&mut self, bytes: u64) -> io::Result<()> {
        let length = match self.length {
            Some(length) => length,
            None => self.file.metadata()?.len(),
        };
        self.length = Some(length);
        let needed = self.end + bytes;
        if needed <= length {
            return Ok(());
        }
        // Tests only: a full disk gives no new blocks.
        if self.simulated_disk.as_ref().is_some_and(SimulatedDisk::is_full) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let grown = needed.max(length + GROW_BYTES);
        let zeros = vec![0_u8; usize::try_from(grown - length).unwrap_or(usize::MAX)];
        // A write cut short leaves the length unknown: the next append asks the file.
        self.length = None;
        self.file.write_all_at(&zeros, length)?;
        self.length = Some(grown);
        Ok(())
    }
}

fn wal_error(path: &Path, error: io::Error) -> StoreError {
    if super::is_disk_full(&error) {
        StoreError::DiskFull(format!("{}: {error}", path.display()))
    } else {
        StoreError::Io(format!("{}: {error}", path.display()))
    }
}

/// The header of a record holding `payload`: `salt`, the payload's length, and the checksum of
/// the salt and the payload.
fn record_header(salt: u64, payload: &[u8]) -> Result<[u8; RECORD_HEADER], StoreError> {
    let size = u32::try_from(payload.len())
        .map_err(|_| StoreError::Storage(format!("a batch of {} bytes is too large to log", payload.len())))?;
    let mut crc = Crc32::new();
    crc.update(&salt.to_le_bytes());
    crc.update(payload);
    let mut header = [0_u8; RECORD_HEADER];
    header[..8].copy_from_slice(&salt.to_le_bytes());
    header[8..12].copy_from_slice(&size.to_le_bytes());
    header[12..].copy_from_slice(&crc.finish().to_le_bytes());
    Ok(header)
}

/// Adds one event to a batch's payload.
pub(super) fn push_event(payload: &mut Vec<u8>, seq: u64, bytes: &[u8]) {
    payload.extend_from_slice(&seq.to_le_bytes());
    // An encoded event is far below 4 GiB (a message is at most 16 MB).
    payload.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
    payload.extend_from_slice(bytes);
}

/// The events of one record; None when it is malformed or its sequence numbers do not follow
/// one another.
fn parse_payload(mut payload: &[u8]) -> Option<Vec<LoggedEvent>> {
    let mut events: Vec<LoggedEvent> = Vec::new();
    while !payload.is_empty() {
        let (header, rest) = payload.split_at_checked(EVENT_HEADER)?;
        let seq = u64::from_le_bytes(header[..8].try_into().ok()?);
        let size = u32::from_le_bytes(header[8..].try_into().ok()?) as usize;
        let (bytes, rest) = rest.split_at_checked(size)?;
        if events.last().is_some_and(|last| last.seq + 1 != seq) {
            return None;
        }
        events.push(LoggedEvent { seq, bytes: bytes.to_vec() });
        payload = rest;
    }
    (!events.is_empty()).then_some(events)
}

/// CRC-32 (IEEE 802.3, reflected), as zlib computes it, eight bytes per step ("slicing by
/// eight"): the byte-at-a-time loop was about a tenth of a commit's time under a load of small
/// sends, and 30 ms for one 16 MB message (issue 16). `CRC_TABLES[0]` is the classic table;
/// table `k` advances a byte's remainder through `k` more zero bytes.
#[cfg(test)]
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = Crc32::new();
    crc.update(bytes);
    crc.finish()
}

/// CRC-32 of bytes given a piece at a time.
struct Crc32(u32);

impl Crc32 {
    fn new() -> Crc32 {
        Crc32(!0)
    }

    fn update(&mut self, bytes: &[u8]) {
        let mut crc = self.0;
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let low = u32::from_le_bytes([word[0], word[1], word[2], word[3]]) ^ crc;
            let high = u32::from_le_bytes([word[4], word[5], word[6], word[7]]);
            crc = CRC_TABLES[7][(low & 0xFF) as usize]
                ^ CRC_TABLES[6][((low >> 8) & 0xFF) as usize]
                ^ CRC_TABLES[5][((low >> 16) & 0xFF) as usize]
                ^ CRC_TABLES[4][(low >> 24) as usize]
                ^ CRC_TABLES[3][(high & 0xFF) as usize]
                ^ CRC_TABLES[2][((high >> 8) & 0xFF) as usize]
                ^ CRC_TABLES[1][((high >> 16) & 0xFF) as usize]
                ^ CRC_TABLES[0][(high >> 24) as usize];
        }
        for &byte in words.remainder() {
            crc = CRC_TABLES[0][((crc ^ u32::from(byte)) & 0xFF) as usize] ^ (crc >> 8);
        }
        self.0 = crc;
    }

    fn finish(&self) -> u32 {
        !self.0
    }
}

// A static, not a const: unoptimised builds would copy a const array at every index.
static CRC_TABLES: [[u32; 256]; 8] = {
    let mut tables = [[0_u32; 256]; 8];
    let mut index = 0;
    while index < 256 {
        let mut value = index as u32;
        let mut bit = 0;
        while bit < 8 {
            value = if value & 1 == 1 { (value >> 1) ^ 0xEDB8_8320 } else { value >> 1 };
            bit += 1;
        }
        tables[0][index] = value;
        index += 1;
    }
    let mut table = 1;
    while table < 8 {
        let mut index = 0;
        while index < 256 {
            let previous = tables[table - 1][index];
            tables[table][index] = (previous >> 8) ^ tables[0][(previous & 0xFF) as usize];
            index += 1;
        }
        table += 1;
    }
    tables
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The database's salt in these tests.
    const SALT: u64 = 0x5A17_0F7E_5700_0001;
    /// A salt a sender guessed.
    const GUESSED: u64 = 0x0BAD_9E55_0000_0002;

    fn batch(events: &[(u64, &str)]) -> Vec<u8> {
        let mut payload = Vec::new();
        for (seq, text) in events {
            push_event(&mut payload, *seq, text.as_bytes());
        }
        payload
    }

    fn fresh() -> (tempfile::TempDir, PathBuf, Wal) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("synapse.wal");
        let wal = Wal::open(&path, SALT, None).unwrap();
        (dir, path, wal)
    }

    /// A record as a build before salts wrote it.
    fn legacy_record(payload: &[u8]) -> Vec<u8> {
        let mut record = u32::try_from(payload.len()).unwrap().to_le_bytes().to_vec();
        record.extend_from_slice(&crc32(payload).to_le_bytes());
        record.extend_from_slice(payload);
        record
    }

    /// What an open of the file at `path` reads back.
    fn read_back(path: &Path) -> Vec<LoggedEvent> {
        read_back_at(path, 0)
    }

    /// What an open of the file at `path` reads back over a database whose last event is `head`
    /// (after a checkpoint: the last event logged before it).
    fn read_back_at(path: &Path, head: u64) -> Vec<LoggedEvent> {
        Wal::open(path, SALT, None).unwrap().read(head).unwrap()
    }

    fn seqs(events: &[LoggedEvent]) -> Vec<u64> {
        events.iter().map(|event| event.seq).collect()
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        // Longer than one eight-byte step, with a tail: zlib's value.
        assert_eq!(crc32(b"The quick brown fox jumps over the lazy dog"), 0x414F_A339);
    }

    /// Eight bytes per step give the byte-at-a-time result for every length and alignment.
    #[test]
    fn crc32_agrees_with_the_bitwise_definition() {
        fn bitwise(bytes: &[u8]) -> u32 {
            let mut crc = !0_u32;
            for &byte in bytes {
                crc ^= u32::from(byte);
                for _ in 0..8 {
                    crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
                }
            }
            !crc
        }
        let data: Vec<u8> = (0..600_u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for start in 0..9 {
            for length in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255, 511] {
                let slice = &data[start..start + length];
                assert_eq!(crc32(slice), bitwise(slice), "start {start}, length {length}");
            }
        }
    }

    /// A batch past `SEPARATE_WRITES_FROM` (header and payload written apart), one that grows
    /// the file, and small ones around them read back whole and in order.
    #[test]
    fn large_records_read_back_whole_between_small_ones() {
        let (_dir, path, mut wal) = fresh();
        let large = "l".repeat(SEPARATE_WRITES_FROM + 1);
        let larger = "m".repeat(3 << 20);
        wal.append(&batch(&[(1, "a")])).unwrap();
        wal.append(&batch(&[(2, large.as_str())])).unwrap();
        wal.append(&batch(&[(3, larger.as_str()), (4, "b")])).unwrap();
        wal.append(&batch(&[(5, "c")])).unwrap();
        let events = read_back(&path);
        assert_eq!(seqs(&events), [1, 2, 3, 4, 5]);
        assert_eq!(events[1].bytes, large.as_bytes());
        assert_eq!(events[2].bytes, larger.as_bytes());
        assert_eq!(events[4].bytes, b"c");
        assert!(std::fs::metadata(&path).unwrap().len() >= (3 << 20) + (1 << 20));
    }

    /// The checksum of bytes given a piece at a time is the checksum of them all.
    #[test]
    fn crc32_in_pieces_is_crc32_of_the_whole() {
        let data: Vec<u8> = (0..5_000_u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        for cut in [0, 1, 7, 8, 9, 1_000, 4_999, 5_000] {
            let mut crc = Crc32::new();
            crc.update(&data[..cut]);
            crc.update(&data[cut..]);
            assert_eq!(crc.finish(), crc32(&data), "cut at {cut}");
        }
    }

    /// A damaged record followed by one that continues the log refuses the open, naming where
    /// the log stops and the `truncate` that opens it with what comes before; cut there, it
    /// opens. (The advice had been to move the file aside, which lost the events before the
    /// damage too.)
    #[test]
    fn a_damaged_record_followed_by_the_log_is_refused_and_cutting_there_opens_it() {
        let (_dir, path, mut wal) = fresh();
        let mut starts = Vec::new();
        for seq in 1..=6 {
            starts.push(usize::try_from(wal.end()).unwrap());
            wal.append(&batch(&[(seq, format!("event {seq} {}", "x".repeat(300)).as_str())])).unwrap();
        }
        drop(wal);
        let mut damaged = std::fs::read(&path).unwrap();
        let third = starts[2];
        damaged[third + 40] ^= 0x40;
        std::fs::write(&path, &damaged).unwrap();
        let refused = Wal::open(&path, SALT, None).unwrap().read(0);
        let Err(StoreError::Corrupt(reason)) = refused else { panic!("{:?}", refused.map(|events| seqs(&events))) };
        assert!(reason.contains(&format!("past byte {third} (a damaged record)")), "{reason}");
        assert!(reason.contains("holding event 4 follows"), "{reason}");
        assert!(reason.contains(&format!("truncate -s {third} ")), "{reason}");
        std::fs::write(&path, &damaged[..third]).unwrap();
        assert_eq!(seqs(&read_back(&path)), [1, 2]);
    }

    /// Damage in the middle of the log that leaves no readable record right after it (a length
    /// changed, a header or a whole block zeroed, the salt changed, the first record damaged)
    /// had read as the log's end: the acknowledged events after it were dropped without a word.
    /// The rest of the file is searched for the salt, and the open is refused as for a damaged
    /// record; cut where the advice says, it opens.
    #[test]
    fn damage_in_the_middle_that_reads_as_an_end_is_refused() {
        let (_dir, path, mut wal) = fresh();
        let mut starts = Vec::new();
        for seq in 1..=8 {
            starts.push(usize::try_from(wal.end()).unwrap());
            wal.append(&batch(&[(seq, format!("event {seq} {}", "x".repeat(1_500)).as_str())])).unwrap();
        }
        drop(wal);
        let intact = std::fs::read(&path).unwrap();
        let third = starts[2];
        let block = third.next_multiple_of(BLOCK);
        // Reading stops at the record holding the block's first byte.
        let in_block = *starts.iter().rev().find(|start| **start <= block).unwrap();
        type Damage = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(&str, usize, Damage, &str)> = vec![
            ("a length made huge", third, Box::new(move |file| file[third + 11] = 0x40), "a record cut short"),
            ("a length made shorter", third, Box::new(move |file| file[third + 9] = 0), "a damaged record"),
            ("a header zeroed", third, Box::new(move |file| file[third..third + 16].fill(0)), "zeros"),
            ("the salt changed", third, Box::new(move |file| file[third + 2] ^= 0x08), "no record of this log"),
            ("the first record's salt changed", 0, Box::new(|file| file[1] ^= 0x08), "no record of this log"),
            ("a block zeroed", in_block, Box::new(move |file| file[block..block + BLOCK].fill(0)), "a damaged record"),
        ];
        for (what, stop, damage, why) in cases {
            let mut damaged = intact.clone();
            damage(&mut damaged);
            std::fs::write(&path, &damaged).unwrap();
            let refused = Wal::open(&path, SALT, None).unwrap().read(0);
            let Err(StoreError::Corrupt(reason)) = refused else {
                panic!("{what}: {:?}", refused.map(|events| seqs(&events)))
            };
            assert!(reason.contains(&format!("past byte {stop} (")), "{what}: {reason}");
            assert!(reason.contains(why), "{what}: {reason}");
            assert!(reason.contains(&format!("truncate -s {stop} ")), "{what}: {reason}");
            std::fs::write(&path, &damaged[..stop]).unwrap();
            let kept = starts.iter().filter(|start| **start < stop).count() as u64;
            assert_eq!(seqs(&read_back(&path)), (1..=kept).collect::<Vec<_>>(), "{what}");
        }
        // Over a database that has every event already (a checkpoint whose reset did not reach
        // the disk), the same damage is nothing lost: it opens.
        let mut damaged = intact.clone();
        damaged[third..third + 16].fill(0);
        std::fs::write(&path, &damaged).unwrap();
        assert_eq!(seqs(&read_back_at(&path, 8)), [1, 2]);
    }

    /// A log written by a build before salts is read once the old way (a damaged record
    /// followed by the log still refused); the log then starts over in the new form.
    #[test]
    fn a_log_written_before_salts_is_read_and_then_goes_on_salted() {
        let (_dir, path, wal) = fresh();
        drop(wal);
        let mut old = Vec::new();
        let mut starts = Vec::new();
        for seq in 1..=3 {
            starts.push(old.len());
            old.extend_from_slice(&legacy_record(&batch(&[(seq, format!("old {seq}").as_str())])));
        }
        old.resize(1 << 20, 0);
        std::fs::write(&path, &old).unwrap();
        let mut wal = Wal::open(&path, SALT, None).unwrap();
        let events = wal.read(0).unwrap();
        assert_eq!(seqs(&events), [1, 2, 3]);
        assert_eq!(events[2].bytes, b"old 3");
        wal.reset().unwrap();
        wal.append(&batch(&[(4, "new")])).unwrap();
        drop(wal);
        assert_eq!(std::fs::read(&path).unwrap()[..8], SALT.to_le_bytes());
        assert_eq!(seqs(&read_back_at(&path, 3)), [4]);

        // A damaged record followed by the log is refused, the first one too (read salted, a
        // log whose first record was damaged opened empty, its events dropped).
        for damaged_record in [1, 0] {
            let mut damaged = old.clone();
            damaged[starts[damaged_record] + 10] ^= 0x01;
            std::fs::write(&path, &damaged).unwrap();
            let refused = Wal::open(&path, SALT, None).unwrap().read(0);
            let what = format!("record {damaged_record} damaged");
            assert!(
                matches!(refused, Err(StoreError::Corrupt(_))),
                "{what}: {:?}",
                refused.map(|events| seqs(&events))
            );
        }
    }

    /// A message's text is in the log byte for byte: one that holds a well-formed record of
    /// later events, left in the file after a checkpoint, is never taken for the log's own (an
    /// open refused for it would keep the broker from starting, for one message).
    #[test]
    fn a_record_forged_inside_a_message_never_refuses_the_open() {
        let (_dir, path, mut wal) = fresh();
        let forged_payload = batch(&[(50, "x")]);
        // With a salt the sender guessed, and as a record written before salts.
        let mut text = "a".repeat(1_000).into_bytes();
        text.extend_from_slice(&record_header(GUESSED, &forged_payload).unwrap());
        text.extend_from_slice(&forged_payload);
        text.extend_from_slice(&legacy_record(&forged_payload));
        text.extend_from_slice(&[b'b'; 100]);
        let mut message = Vec::new();
        push_event(&mut message, 1, &text);
        wal.append(&message).unwrap();
        wal.append(&batch(&[(2, "two")])).unwrap();
        // A checkpoint (the database has events 1 and 2), then one short record.
        wal.reset().unwrap();
        wal.append(&batch(&[(3, "three")])).unwrap();
        drop(wal);
        assert_eq!(seqs(&read_back_at(&path, 2)), [3]);
        // Nor when the log stops short of them for damage: its end is searched for the salt.
        let mut damaged = std::fs::read(&path).unwrap();
        damaged[RECORD_HEADER + 3] ^= 0x01;
        std::fs::write(&path, &damaged).unwrap();
        assert!(read_back_at(&path, 2).is_empty());
        // And the first record after the checkpoint torn over the message's.
        let (_dir, path, mut wal) = fresh();
        wal.append(&message).unwrap();
        wal.reset().unwrap();
        let next = batch(&[(2, "y".repeat(text.len()).as_str())]);
        wal.file.write_all_at(&record_header(SALT, &next).unwrap(), 0).unwrap();
        drop(wal);
        assert!(read_back_at(&path, 1).is_empty());
    }

    /// Where the log ends always reads as its end: zeros follow every record, by direct I/O
    /// (a record ending on a block's edge) and through the page cache (a long one). Bytes left
    /// there from before a checkpoint (a message's text) had been read as a header: a sender's
    /// "damaged record" pointing at a well-formed record of its own made every open refuse.
    #[test]
    fn bytes_after_the_logs_end_are_never_read_as_a_record() {
        for (what, text_length) in [("a record ending on a block's edge", 4096 - 20), ("a long record", 70_000)] {
            let (_dir, path, mut wal) = fresh();
            // A message whose text holds, at `text_length`, a damaged header whose length
            // points at a well-formed record of a later event. (With the log's salt, which a
            // sender does not know: the zeros alone are tested.)
            let forged_payload = batch(&[(1000, "x")]);
            let mut text = vec![b'a'; text_length];
            text.extend_from_slice(&SALT.to_le_bytes());
            text.extend_from_slice(&32_u32.to_le_bytes());
            text.extend_from_slice(&0xDEAD_BEEF_u32.to_le_bytes());
            text.extend_from_slice(&[b'b'; 32]);
            text.extend_from_slice(&record_header(GUESSED, &forged_payload).unwrap());
            text.extend_from_slice(&forged_payload);
            text.extend_from_slice(&[b'c'; 100]);
            let mut message = Vec::new();
            push_event(&mut message, 1, &text);
            wal.append(&message).unwrap();
            // A checkpoint, then a record that ends exactly where the damaged header is.
            wal.reset().unwrap();
            let mut next = Vec::new();
            push_event(&mut next, 2, &vec![b'n'; text_length]);
            wal.append(&next).unwrap();
            assert_eq!(wal.end(), (RECORD_HEADER + EVENT_HEADER + text_length) as u64, "{what}");
            drop(wal);
            assert_eq!(seqs(&read_back_at(&path, 1)), [2], "{what}");
        }
    }

    /// A record that claims more than it holds (a length past the end of a sparse file) is not
    /// read into memory whole to be found wrong; the torn last record of a crash opens as before.
    #[test]
    fn a_huge_damaged_length_at_the_end_is_the_end_of_the_log() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "one")])).unwrap();
        let end = wal.end();
        drop(wal);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut huge = SALT.to_le_bytes().to_vec();
        huge.extend_from_slice(&[0, 0, 0, 0x10, 0, 0, 0, 0]);
        file.write_all_at(&huge, end).unwrap();
        file.set_len(300 << 20).unwrap();
        assert_eq!(seqs(&read_back(&path)), [1]);
    }

    /// A log that is not a regular file (a FIFO opens, then fails every write) is refused at
    /// open, saying that it holds events not yet in the database.
    #[test]
    fn a_log_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("synapse.wal");
        let made = std::process::Command::new("mkfifo").arg(&path).status().unwrap();
        assert!(made.success());
        let Err(StoreError::WalUnreadable { reason, .. }) = Wal::open(&path, SALT, None) else {
            panic!("a FIFO opened")
        };
        assert!(reason.contains("not a regular file"), "{reason}");
        let said = StoreError::WalUnreadable { path: "p".into(), reason }.to_string();
        assert!(said.contains("acknowledged since the database's last checkpoint"), "{said}");
    }

    #[test]
    fn records_read_back_in_order_across_reopens() {
        let (_dir, path, mut wal) = fresh();
        assert!(wal.read(0).unwrap().is_empty());
        wal.append(&batch(&[(1, "a"), (2, "bb")])).unwrap();
        wal.append(&batch(&[(3, "ccc")])).unwrap();
        assert_eq!(wal.pending().0, 2);
        drop(wal);
        let mut wal = Wal::open(&path, SALT, None).unwrap();
        let events = wal.read(0).unwrap();
        assert_eq!(seqs(&events), [1, 2, 3]);
        assert_eq!(events[2].bytes, b"ccc");
        // Appends continue after what was read.
        wal.append(&batch(&[(4, "d")])).unwrap();
        assert_eq!(seqs(&read_back(&path)), [1, 2, 3, 4]);
    }

    #[test]
    fn a_torn_or_damaged_tail_ends_the_log_and_is_written_over() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "first")])).unwrap();
        let first_end = wal.end();
        wal.append(&batch(&[(2, "second")])).unwrap();
        let second_end = usize::try_from(wal.end()).unwrap();
        let full = std::fs::read(&path).unwrap();
        assert!(full.len() >= 1 << 20, "the file grows by a whole step of zeros");

        // Cut short inside the second record.
        std::fs::write(&path, &full[..second_end - 3]).unwrap();
        let mut reopened = Wal::open(&path, SALT, None).unwrap();
        assert_eq!(seqs(&reopened.read(0).unwrap()), [1]);
        assert_eq!(reopened.end(), first_end);

        // One byte of the second record's payload flipped: its checksum fails.
        let mut damaged = full.clone();
        damaged[second_end - 1] ^= 0x40;
        std::fs::write(&path, &damaged).unwrap();
        let mut reopened = Wal::open(&path, SALT, None).unwrap();
        assert_eq!(seqs(&reopened.read(0).unwrap()), [1]);
        reopened.append(&batch(&[(2, "again")])).unwrap();
        let events = read_back(&path);
        assert_eq!(seqs(&events), [1, 2]);
        assert_eq!(events[1].bytes, b"again");
    }

    #[test]
    fn after_a_reset_older_records_are_not_read_again() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "one"), (2, "two")])).unwrap();
        wal.append(&batch(&[(3, "three")])).unwrap();
        wal.append(&batch(&[(4, "four")])).unwrap();
        wal.reset().unwrap();
        assert_eq!(wal.pending(), (0, 0));
        assert!(read_back_at(&path, 4).is_empty());
        // A shorter record written over the first: the old second record that follows it
        // does not continue the sequence.
        wal.append(&batch(&[(5, "five")])).unwrap();
        assert_eq!(seqs(&read_back_at(&path, 4)), [5]);
    }

    #[test]
    fn an_older_record_of_the_same_size_left_after_a_reset_does_not_continue_the_log() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "same")])).unwrap();
        wal.append(&batch(&[(2, "size")])).unwrap();
        wal.reset().unwrap();
        // Written over the first: the second, intact, starts exactly where it ends.
        wal.append(&batch(&[(3, "next")])).unwrap();
        assert_eq!(seqs(&read_back(&path)), [3]);
    }

    /// What a crash between the two writes of a long record leaves (`append` writes the payload
    /// first, then the header): after a checkpoint the header at the start is still zeroed, so
    /// the log reads as empty, even with an older record of the same size right behind. Had the
    /// header gone first, it would claim a payload that is not there; the intact older record
    /// after it is recognised as older only by the database's head (read here as 0, which
    /// refuses: see `a_torn_first_record_after_a_checkpoint_ends_the_log`).
    #[test]
    fn a_crash_between_the_two_writes_of_a_long_record_adds_nothing_and_opens() {
        let long = |letter: &str| letter.repeat(SEPARATE_WRITES_FROM + 1);
        // Two long records, then a checkpoint: the next record, the same size, goes over them.
        let checkpointed = || {
            let (dir, path, mut wal) = fresh();
            wal.append(&batch(&[(1, long("a").as_str())])).unwrap();
            wal.append(&batch(&[(2, long("b").as_str())])).unwrap();
            wal.reset().unwrap();
            (dir, path, wal)
        };
        let payload = batch(&[(3, long("c").as_str())]);

        // Cut after its payload.
        let (_dir, path, wal) = checkpointed();
        wal.file.write_all_at(&payload, RECORD_HEADER as u64).unwrap();
        assert!(read_back_at(&path, 2).is_empty());
        // The header written alone instead: refused (what the order avoids).
        let (_other_dir, other_path, other) = checkpointed();
        other.file.write_all_at(&record_header(SALT, &payload).unwrap(), 0).unwrap();
        assert!(matches!(Wal::open(&other_path, SALT, None).unwrap().read(0), Err(StoreError::Corrupt(_))));
    }

    /// After a checkpoint, a first record torn over an older one of the same size (its header
    /// written, its payload not) ends the log: the older record after it holds events the
    /// database has (at or below its head), so it continues nothing.
    #[test]
    fn a_torn_first_record_after_a_checkpoint_ends_the_log() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "same")])).unwrap();
        wal.append(&batch(&[(2, "size")])).unwrap();
        wal.reset().unwrap();
        let payload = batch(&[(3, "next")]);
        wal.file.write_all_at(&record_header(SALT, &payload).unwrap(), 0).unwrap();
        let mut reopened = Wal::open(&path, SALT, None).unwrap();
        assert!(reopened.read(2).unwrap().is_empty());
        assert_eq!(reopened.end(), 0);
        // Were the database behind that older record, it would continue the log: refused.
        assert!(matches!(Wal::open(&path, SALT, None).unwrap().read(1), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn a_damaged_record_followed_by_later_ones_is_refused_not_skipped() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "one")])).unwrap();
        let first_end = usize::try_from(wal.end()).unwrap();
        wal.append(&batch(&[(2, "two")])).unwrap();
        wal.append(&batch(&[(3, "three")])).unwrap();
        let mut damaged = std::fs::read(&path).unwrap();
        damaged[first_end + RECORD_HEADER + 2] ^= 0x01;
        std::fs::write(&path, &damaged).unwrap();
        let error = Wal::open(&path, SALT, None).unwrap().read(0).map(|_| ()).unwrap_err();
        assert!(matches!(error, StoreError::Corrupt(_)), "{error}");
        assert!(error.to_string().contains("damaged"), "{error}");
    }

    #[test]
    fn an_undone_record_is_not_read_back() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "kept")])).unwrap();
        let end = wal.end();
        wal.append(&batch(&[(2, "not stored")])).unwrap();
        wal.undo(end);
        assert_eq!(seqs(&read_back(&path)), [1]);
        wal.append(&batch(&[(2, "stored")])).unwrap();
        let events = read_back(&path);
        assert_eq!(seqs(&events), [1, 2]);
        assert_eq!(events[1].bytes, b"stored");
    }

    #[test]
    fn an_append_on_a_full_disk_fails_clearly_and_leaves_nothing_to_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("synapse.wal");
        let switch = dir.path().join("disk-full");
        let mut wal = Wal::open(&path, SALT, Some(SimulatedDisk::new(switch.clone()))).unwrap();
        std::fs::write(&switch, b"").unwrap();
        let error = wal.append(&batch(&[(1, "no room")])).unwrap_err();
        assert!(matches!(error, StoreError::DiskFull(_)), "{error}");
        assert_eq!(wal.pending(), (0, 0));
        assert!(read_back(&path).is_empty());
        std::fs::remove_file(&switch).unwrap();
        wal.append(&batch(&[(1, "room again")])).unwrap();
        let events = read_back(&path);
        assert_eq!(seqs(&events), [1]);
        assert_eq!(events[0].bytes, b"room again");
    }

    /// Direct I/O and the page cache leave the same log: records that cross blocks, fill one
    /// exactly, a long one written through the page cache in between, an undo, a reset, a
    /// reopen. (Where the file system takes no direct I/O, both runs use the page cache.)
    #[test]
    fn direct_writes_leave_the_log_that_the_page_cache_leaves() {
        fn append(wal: &mut Wal, seq: &mut u64, length: usize) {
            *seq += 1;
            let text: String = (0..length).map(|i| char::from(b'a' + ((*seq as usize + i) % 26) as u8)).collect();
            wal.append(&batch(&[(*seq, text.as_str())])).unwrap();
        }
        // The events read back, the file's bytes up to the log's end, and whether direct I/O
        // was used.
        type Outcome = (Vec<(u64, Vec<u8>)>, Vec<u8>, bool);
        let run = |direct: bool| -> Outcome {
            let (dir, path, wal) = fresh();
            let mut wal = if direct { wal } else { wal.without_direct_io() };
            let used_direct = wal.direct.is_some();
            let mut seq = 0;
            // Three records whose headers and texts fill the first block exactly.
            let third = 4096 - 3 * (RECORD_HEADER + EVENT_HEADER) - 10 - 4000;
            for length in [10, 4000, third, 5000, SEPARATE_WRITES_FROM + 100, 1, 3] {
                append(&mut wal, &mut seq, length);
            }
            let end = wal.end();
            append(&mut wal, &mut seq, 700);
            wal.undo(end);
            seq -= 1;
            append(&mut wal, &mut seq, 900);
            assert_eq!(wal.direct.is_some(), used_direct, "direct I/O was not given up on the way");
            drop(wal);
            let mut wal = Wal::open(&path, SALT, None).unwrap();
            if !direct {
                wal = wal.without_direct_io();
            }
            assert_eq!(wal.read(0).unwrap().len(), 8);
            for length in [2, 8000] {
                append(&mut wal, &mut seq, length);
            }
            let events = read_back(&path);
            let kept = std::fs::read(&path).unwrap()[..usize::try_from(wal.end()).unwrap()].to_vec();
            // After a checkpoint, shorter records over the longer ones.
            wal.reset().unwrap();
            for length in [5, 6] {
                append(&mut wal, &mut seq, length);
            }
            let after_reset = read_back(&path);
            assert_eq!(seqs(&after_reset), [11, 12]);
            assert_eq!(wal.direct.is_some(), used_direct, "direct I/O was not given up on the way");
            drop(dir);
            (events.into_iter().map(|event| (event.seq, event.bytes)).collect(), kept, used_direct)
        };
        let (direct_events, direct_bytes, used_direct) = run(true);
        let (cached_events, cached_bytes, _) = run(false);
        assert_eq!(direct_events.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>());
        assert_eq!(direct_events, cached_events);
        assert_eq!(direct_bytes, cached_bytes, "the same bytes up to the log's end");
        if !used_direct {
            eprintln!("this file system takes no direct I/O: both runs used the page cache");
        }
    }

    /// A direct write that fails with `EINVAL` (here: the copy of the last block out of step)
    /// is done through the page cache instead, and direct I/O is given up.
    #[test]
    fn a_refused_direct_write_goes_through_the_page_cache() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "one")])).unwrap();
        let Some(direct) = &mut wal.direct else {
            eprintln!("this file system takes no direct I/O: nothing to refuse");
            return;
        };
        direct.tail.push(b'?');
        wal.append(&batch(&[(2, "two")])).unwrap();
        assert!(wal.direct.is_none());
        wal.append(&batch(&[(3, "three")])).unwrap();
        let events = read_back(&path);
        assert_eq!(seqs(&events), [1, 2, 3]);
        assert_eq!(events[1].bytes, b"two");
    }

    /// A checkpoint's reset zeroes the first header and nothing else: zeros over the rest of
    /// the block could reach the disk without the header's sector.
    #[test]
    fn a_reset_zeroes_the_first_header_and_leaves_the_rest_of_the_file_as_it_was() {
        let (_dir, path, mut wal) = fresh();
        for seq in 1..=4 {
            wal.append(&batch(&[(seq, "x".repeat(1_500).as_str())])).unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        wal.reset().unwrap();
        let after = std::fs::read(&path).unwrap();
        assert_eq!(after[..RECORD_HEADER], [0_u8; RECORD_HEADER]);
        assert_eq!(after[RECORD_HEADER..], before[RECORD_HEADER..]);
        assert!(read_back_at(&path, 4).is_empty());
    }

    /// A direct write that fails for another reason than a full disk (here: a descriptor that
    /// cannot write) is done through the page cache, and direct I/O is given up.
    #[test]
    fn a_direct_write_that_fails_goes_through_the_page_cache() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "one")])).unwrap();
        let Some(direct) = &mut wal.direct else {
            eprintln!("this file system takes no direct I/O: nothing to fail");
            return;
        };
        direct.file = File::open(&path).unwrap();
        wal.append(&batch(&[(2, "two")])).unwrap();
        assert!(wal.direct.is_none());
        let events = read_back(&path);
        assert_eq!(seqs(&events), [1, 2]);
        assert_eq!(events[1].bytes, b"two");
    }

    /// An append whose fsync fails leaves nothing to read back, and the next append goes on
    /// from the log's end as it was, still by direct I/O (the copy of the last block is read
    /// again from the file, without the failed record).
    #[test]
    fn after_a_failed_fsync_the_next_append_goes_on_from_where_the_log_ended() {
        let (_dir, path, mut wal) = fresh();
        wal.append(&batch(&[(1, "one")])).unwrap();
        let used_direct = wal.direct.is_some();
        let end = wal.end();
        wal.fail_next_sync = true;
        let failed = wal.append(&batch(&[(2, "the failed one, longer than the next")]));
        assert!(failed.is_err());
        assert_eq!(wal.end(), end);
        assert_eq!(seqs(&read_back(&path)), [1]);
        wal.append(&batch(&[(2, "two")])).unwrap();
        wal.append(&batch(&[(3, "three")])).unwrap();
        assert_eq!(wal.direct.is_some(), used_direct, "direct I/O was not given up");
        let events = read_back(&path);
        assert_eq!(seqs(&events), [1, 2, 3]);
        assert_eq!(events[1].bytes, b"two");
        if !used_direct {
            eprintln!("this file system takes no direct I/O: the page cache was tested");
        }
    }

    #[test]
    fn malformed_payloads_are_refused() {
        assert!(parse_payload(&[]).is_none());
        assert!(parse_payload(&[1, 2, 3]).is_none());
        let mut gap = batch(&[(1, "a")]);
        push_event(&mut gap, 3, b"c");
        assert!(parse_payload(&gap).is_none());
        let mut short = batch(&[(1, "abc")]);
        short.pop();
        assert!(parse_payload(&short).is_none());
    }
}
