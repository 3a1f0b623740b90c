//! The store: one append-only redb log plus projection tables, updated in the same transaction.
//!
//! Synchronous code over redb; the broker's writer thread is the only writer of the log and the
//! projections (the history indexer and the delivery worker write their own tables, in
//! transactions of their own). Invariants:
//! - The `log` table maps sequence number → encoded [`Envelope`]; numbers start at 1 and have no
//!   gaps. Nothing is ever rewritten in it.
//! - Projection tables are a pure function of the log: [`Projections::apply`] never reads the
//!   clock or the environment, so [`Store::rebuild`] reproduces them exactly, and
//!   [`Store::verify`] can prove it.
//! - Indexes are projections too: `task_index` (each agent's owned, served and working tasks)
//!   is written by the same `apply` that writes the task rows, in the same transaction, so it is
//!   never behind them, a replay rebuilds it, and `verify` compares it like any table.
//! - Reads use short read transactions: a long one makes the file grow while writes go on.
//! - After a failed commit redb refuses every later read and write on that `Database`
//!   ("Previous I/O error occurred"). [`Store::reopen`] drops it and opens the file again: redb
//!   repairs it from the last committed transaction, so nothing committed is lost and nothing
//!   of the failed one is kept. Everyone reaches the database through [`Store::db`], which
//!   hands out the current one; while it is swapped, reads get [`StoreError::Reopening`].

pub mod failure;
pub mod fault;
pub mod history;
pub mod projection;
pub mod records;
pub mod search_index;
mod wal;

use crate::event::{DecodeError, Envelope, Event, SCHEMA_VERSION};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

pub use projection::{LIVE, ProjectionNames, Projections, SCRATCH, TaskIndexKind};
pub use records::*;

pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Projections that broker workers keep in memory (the delivery worker's webhook outbox and
/// external agents), saved by name now and then with the event they reflect, so that a start
/// replays only the log after it ([`Store::save_snapshot`]).
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("worker_snapshots");
const META_SCHEMA: &str = "schema_version";
const META_PROJECTIONS: &str = "projection_version";
/// The salt of the write-ahead log's records (see `wal.rs`).
const META_WAL_SALT: &str = "wal_salt";
/// The shape of the projection tables. When a build changes what they hold (version 2: task
/// records carry `created_seq`, which the history index needs; version 3: `departed_agents`, whose
/// queue an id holds; version 4: task rows refer to a long text in the log instead of holding
/// it: `message_seq`, `reply_seq`, `artifact_texts`; version 5: the `task_index` of each agent's
/// tasks; version 6: a canceled task's queued ticket leaves the inbox; version 7: task rows keep
/// their follow-up messages (`follow_ups`) and tickets the `turn` they write; version 8: each
/// agent's `inbox_depth`; version 9: `reply_tokens` of messages to external agents; version 10:
/// task and ticket rows leave out empty and usual values; version 11: agents' `since_seq`; version 12:
/// a task that ends takes the reply target its owner kept for it along; version 13: agents'
/// `last_written`; version 14: agents' `canceled_unwritten`; version 15: a request from a sender
/// already owed an answer becomes the reply target when its ticket is written), opening a
/// store written by another build replays the log into fresh projections: they are derived, the
/// log is not.
const PROJECTION_VERSION: u64 = 15;

/// How long a reopen waits for readers of the old database to let go of its file (its lock
/// admits one open `Database`; reads are short).
const REOPEN_WAIT: Duration = Duration::from_secs(2);

/// redb page cache (allocated as pages are used: an idle broker stays at a few MB). 16 MB:
/// the broker's RSS at 1M events was 95 MB with 64 MB and 58 MB with 32 MB; with 32 MB it
/// reached 64-70 MB at 10M events (`synapse-bench scale`), 44 MB with 16 MB. The operations
/// `scale` times measured the same with 16 and 32 MB, and http-send and round-trip the same
/// with 32 and 64 MB: the system's page cache holds the file too.
const CACHE_SIZE_BYTES: usize = 16 << 20;

/// A batch is made durable by the write-ahead log ([`wal`]). Once this many have been logged, or
/// this many bytes, since the last durable commit, the next batch is preceded by a durable commit
/// of the database itself (a checkpoint, holding no event of its own), and the log starts over.
/// The writer also checkpoints when it is idle ([`Store::checkpoint`]). A checkpoint holds the
/// next batch for its fsync (0.3-3 ms here): 4,096 records rather than 256 took
/// `round_trip_p99_ms` from ~7.2 to ~4.7 ms (`tools/bench round-trip`, where the log never goes
/// idle). A crash replays at most the log, whose size the byte count bounds as before.
const CHECKPOINT_RECORDS: u32 = 4_096;
const CHECKPOINT_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("another synapse broker already has the database {path} open (one broker per SYNAPSE_HOME)")]
    AlreadyOpen { path: String },
    #[error(
        "the database {path} cannot be opened: {reason}. It may be corrupt or not a Synapse database; move it aside to start with an empty log"
    )]
    Unreadable { path: String, reason: String },
    #[error(
        "the write-ahead log {path} cannot be opened: {reason}. It holds the events acknowledged since the database's last checkpoint: make it a readable regular file of this user again; moving it aside opens the database without those events"
    )]
    WalUnreadable { path: String, reason: String },
    #[error(
        "the log was written by a newer Synapse (schema {found}; this build understands up to {SCHEMA_VERSION}). Upgrade synapse to read it"
    )]
    NewerSchema { found: u32 },
    #[error("the disk is full: {0}. Free some space; nothing was written")]
    DiskFull(String),
    #[error("the database could not be read or written: {0}")]
    Io(String),
    /// The database is swapped out by [`Store::reopen`]; with the failure that made it reopen,
    /// when known.
    #[error(
        "the database is being reopened after a storage error{}; try again in a moment",
        .0.as_deref().map(|reason| format!(" ({reason})")).unwrap_or_default()
    )]
    Reopening(Option<String>),
    #[error("the database is corrupt: {0}")]
    Corrupt(String),
    /// redb's refusal of every write after a commit that failed other than by I/O (it has
    /// discarded its record of free pages) until the database is reopened.
    #[error("the database must be reopened: {0}")]
    MustReopen(String),
    #[error("storage error: {0}")]
    Storage(String),
}

impl From<DecodeError> for StoreError {
    fn from(error: DecodeError) -> Self {
        match error {
            DecodeError::NewerSchema { found } => StoreError::NewerSchema { found },
            DecodeError::Malformed(reason) => StoreError::Corrupt(reason),
        }
    }
}

/// redb's refusal of every transaction after a storage failure, until the database is reopened.
/// It does not say what failed: [`Store::explained`] puts the cause in its place ([`failure`]).
const EARLIER_WRITE_FAILED: &str = "an earlier write failed (Previous I/O error occurred)";

/// How redb says it has discarded its allocator state ("... reopen the database to repair it").
const REDB_ASKS_FOR_REOPEN: &str = "reopen the database";

fn is_disk_full(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::StorageFull || error.raw_os_error() == Some(libc::ENOSPC)
}

macro_rules! storage_error_from {
    ($($source:ty),*) => {$(
        impl From<$source> for StoreError {
            fn from(error: $source) -> Self {
                let error: redb::Error = error.into();
                match error {
                    redb::Error::Io(io) if is_disk_full(&io) => StoreError::DiskFull(io.to_string()),
                    redb::Error::Io(io) => StoreError::Io(io.to_string()),
                    redb::Error::PreviousIo => StoreError::Io(EARLIER_WRITE_FAILED.into()),
                    redb::Error::DatabaseClosed => StoreError::Reopening(None),
                    redb::Error::Corrupted(reason) if reason.contains(REDB_ASKS_FOR_REOPEN) => {
                        StoreError::MustReopen(reason)
                    }
                    redb::Error::Corrupted(reason) => StoreError::Corrupt(reason),
                    other => StoreError::Storage(other.to_string()),
                }
            }
        }
    )*};
}
storage_error_from!(
    redb::Error,
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::SetDurabilityError
);

impl StoreError {
    /// Did the storage itself fail (a full disk, an I/O error)? After such a failure in a
    /// write, redb refuses the database until it is reopened ([`Store::reopen`]).
    pub fn is_io_failure(&self) -> bool {
        matches!(self, StoreError::DiskFull(_) | StoreError::Io(_))
    }

    /// Does redb refuse the database after this failure until it is reopened? After a failed
    /// write to the storage, and after a commit that failed otherwise.
    pub fn refuses_until_reopened(&self) -> bool {
        self.is_io_failure() || matches!(self, StoreError::MustReopen(_))
    }
}

/// Where a store's file is, to open it again after a failure.
struct FileSource {
    path: PathBuf,
    /// Tests only: see [`fault::SimulatedDisk`].
    simulated_disk: Option<fault::SimulatedDisk>,
    /// The last storage failure its backends met (see [`failure`]).
    failure: failure::LastFailure,
}

fn open_database(source: &FileSource) -> Result<Database, StoreError> {
    let path = &source.path;
    let shown = path.display().to_string();
    let refused = |error: redb::DatabaseError| match error {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen { path: shown.clone() },
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) if is_disk_full(&io) => {
            StoreError::DiskFull(io.to_string())
        }
        other => StoreError::Unreadable { path: shown.clone(), reason: other.to_string() },
    };
    // Opened as redb's `Builder::create` opens it, with the backend wrapped; created readable
    // by the user only (the log holds every message).
    let file = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false),
        crate::private_files::FILE_MODE,
    )
    .open(path)
    .map_err(|error| match error {
        error if is_disk_full(&error) => StoreError::DiskFull(error.to_string()),
        error => StoreError::Unreadable { path: shown.clone(), reason: error.to_string() },
    })?;
    let file = redb::backends::FileBackend::new(file).map_err(refused)?;
    let backend = failure::Recording::new(file, source.simulated_disk.clone(), source.failure.clone())
        .map_err(|error| StoreError::Unreadable { path: shown.clone(), reason: error.to_string() })?;
    let mut builder = Database::builder();
    builder.set_cache_size(CACHE_SIZE_BYTES);
    builder.create_with_backend(backend).map_err(refused)
}

/// The event log and its projections.
pub struct Store {
    /// The open database; `None` only while [`Store::reopen`] swaps it.
    database: RwLock<Option<Arc<Database>>>,
    /// How to open it again (`None` for a store on a custom backend, which cannot be reopened).
    source: Option<FileSource>,
    /// One reopen at a time.
    reopening: Mutex<()>,
    /// The failure that made the last reopen happen: reads during a reopen say it.
    reopen_reason: Mutex<Option<String>>,
    /// Held by the history indexer for a whole step, and by a rebuild (which empties the index).
    index_lock: Mutex<()>,
    /// The write-ahead log of a store on a file (see [`wal`]). Taken after the write
    /// transaction has begun, never before, when both are needed; nothing else is waited for
    /// while it is held.
    wal: Option<Mutex<wal::Wal>>,
    /// A history index step was committed without an fsync since the last durable commit (see
    /// `search_index`): the next checkpoint is due even when the write-ahead log is empty.
    index_unsynced: std::sync::atomic::AtomicBool,
    /// The broker is stopping: a history index step under way gives up between tasks without
    /// committing (see [`Store::stop_indexing`]).
    index_stopped: std::sync::atomic::AtomicBool,
}

/// What a rebuild did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RebuildReport {
    pub events: u64,
    pub elapsed_ms: f64,
}

/// The differences `verify` found between live projections and a fresh replay.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct VerifyReport {
    pub events: u64,
    pub differences: Vec<String>,
}

impl Store {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with_disk_full_switch(path, None)
    }

    /// Opens (or creates) the store at `path`; for fault-injection tests, the file behaves as
    /// on a full disk while `disk_full_switch` exists ([`fault::SimulatedDisk`]).
    pub fn open_with_disk_full_switch(path: &Path, disk_full_switch: Option<&Path>) -> Result<Store, StoreError> {
        let source = FileSource {
            path: path.to_path_buf(),
            simulated_disk: disk_full_switch.map(|switch| fault::SimulatedDisk::new(switch.to_path_buf())),
            failure: failure::LastFailure::default(),
        };
        let db = open_database(&source)?;
        let salt = stored_wal_salt(&db)?.unwrap_or_else(new_wal_salt);
        let mut wal = wal::Wal::open(&path.with_extension("wal"), salt, source.simulated_disk.clone())?;
        let logged = wal.read(durable_head(&db)?)?;
        Store::initialise(db, Some(source), Some((wal, logged)))
    }

    /// Opens a store on any redb backend (tests use an in-memory or fault-injecting one).
    pub fn open_with_backend(backend: impl redb::StorageBackend) -> Result<Store, StoreError> {
        let db = Database::builder()
            .set_cache_size(CACHE_SIZE_BYTES)
            .create_with_backend(backend)
            .map_err(|error| StoreError::Unreadable { path: "<backend>".into(), reason: error.to_string() })?;
        Store::initialise(db, None, None)
    }

    /// Checks the schema, appends what the write-ahead log holds past the database's last
    /// durable commit, and replays the projections when their shape changed.
    fn initialise(
        db: Database,
        source: Option<FileSource>,
        wal: Option<(wal::Wal, Vec<wal::LoggedEvent>)>,
    ) -> Result<Store, StoreError> {
        let txn = db.begin_write()?;
        let mut replayed = None;
        {
            let mut meta = txn.open_table(META)?;
            let stored = meta.get(META_SCHEMA)?.map(|v| v.value());
            match stored {
                Some(found) if found > u64::from(SCHEMA_VERSION) => {
                    return Err(StoreError::NewerSchema { found: u32::try_from(found).unwrap_or(u32::MAX) });
                }
                Some(found) if found == u64::from(SCHEMA_VERSION) => {}
                _ => {
                    meta.insert(META_SCHEMA, u64::from(SCHEMA_VERSION))?;
                }
            }
            let stale = meta.get(META_PROJECTIONS)?.map(|v| v.value()) != Some(PROJECTION_VERSION);
            if let Some((wal, logged)) = &wal {
                // Kept before any record carries it (this commit is durable, and the log starts
                // over after it).
                if meta.get(META_WAL_SALT)?.map(|v| v.value()) != Some(wal.salt()) {
                    meta.insert(META_WAL_SALT, wal.salt())?;
                }
                // Projections of an older shape are replayed below, from the whole log.
                let recovered = recover_logged(&txn, logged, !stale)?;
                if recovered > 0 {
                    tracing::info!("{recovered} events recovered from the write-ahead log");
                }
            }
            let replay = stale && !txn.open_table(LOG)?.is_empty()?;
            Projections::open(&txn, &LIVE)?;
            search_index::create_tables(&txn)?;
            txn.open_table(SNAPSHOTS)?;
            if replay {
                let (events, rows) = replay_into(&txn, &LIVE)?;
                replayed = Some(rows);
                search_index::clear(&txn)?;
                tracing::info!("projections rebuilt from {events} events (their shape changed with this build)");
            }
            if stale {
                meta.insert(META_PROJECTIONS, PROJECTION_VERSION)?;
            }
        }
        txn.commit()?;
        if let Some(rows) = replayed {
            free_in_background(rows);
        }
        let wal = match wal {
            Some((mut wal, _)) => {
                start_over(&mut wal);
                Some(Mutex::new(wal))
            }
            None => None,
        };
        Ok(Store {
            database: RwLock::new(Some(Arc::new(db))),
            source,
            reopening: Mutex::new(()),
            reopen_reason: Mutex::new(None),
            index_lock: Mutex::new(()),
            wal,
            index_unsynced: std::sync::atomic::AtomicBool::new(false),
            index_stopped: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The database as it is now. Hold it only for one transaction: a reopen waits until the
    /// old one is let go of.
    pub(crate) fn db(&self) -> Result<Arc<Database>, StoreError> {
        if let Some(db) = self.database.read().unwrap_or_else(PoisonError::into_inner).clone() {
            return Ok(db);
        }
        Err(StoreError::Reopening(self.reopen_reason.lock().unwrap_or_else(PoisonError::into_inner).clone()))
    }

    /// Drops the database and opens the file again, after a failed commit made redb refuse it.
    /// redb repairs the file from its last committed transaction. The schema and projections
    /// were checked when the store was first opened and are not checked again.
    ///
    /// Fails when the file cannot be opened (the caller tries again later); until it succeeds,
    /// every read and write gets [`StoreError::Reopening`].
    ///
    /// `reason` is the failure that calls for it; reads in the meantime are refused with it.
    pub fn reopen(&self, reason: &str) -> Result<(), StoreError> {
        let Some(source) = &self.source else {
            return Err(StoreError::Storage("a store on a custom backend cannot be reopened".into()));
        };
        let _one_at_a_time = self.reopening.lock().unwrap_or_else(PoisonError::into_inner);
        *self.reopen_reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason.to_string());
        // Out of the slot first, and the lock released at once: readers are not held up while
        // the file is repaired, they get `Reopening`.
        let old = self.database.write().unwrap_or_else(PoisonError::into_inner).take();
        // Dropping a failed redb database may panic on its poisoned state; its file is closed
        // either way, which is all a reopen needs.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(old))).is_err() {
            tracing::warn!("the failed database panicked while closing");
        }
        let deadline = Instant::now() + REOPEN_WAIT;
        let db = loop {
            // Before every attempt: the old database may close only now (a write transaction
            // of another thread deferred it), and its closing commit's pages, should their
            // fsync have failed, are clean in the page cache but not on the disk.
            forget_cached_pages(&source.path);
            match open_database(source) {
                Ok(db) => break db,
                // A reader still holds the old database (its file lock); it lets go within
                // milliseconds.
                Err(StoreError::AlreadyOpen { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(error) => return Err(error),
            }
        };
        // The old database is closed (its file lock is gone): its failure is behind us. One the
        // new database meets from here on is noted afresh.
        source.failure.clear();
        // redb opened at its last durable commit: the batches logged since come back.
        if let Some(wal) = &self.wal {
            // The write transaction first, then the log's lock, as everywhere.
            let txn = db.begin_write()?;
            let mut wal = wal.lock().unwrap_or_else(PoisonError::into_inner);
            let logged = wal.read(last_seq(&txn.open_table(LOG)?)?)?;
            let recovered = recover_logged(&txn, &logged, true)?;
            if recovered > 0 {
                txn.commit()?;
                tracing::info!("{recovered} events recovered from the write-ahead log");
            } else {
                // Its rollback may write; a failure leaves the new database refused too.
                txn.abort()?;
            }
            if !logged.is_empty() {
                start_over(&mut wal);
            }
        }
        *self.database.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(db));
        Ok(())
    }

    /// Has a batch been made durable only by the write-ahead log, or a history index step been
    /// committed without an fsync, since the last durable commit?
    pub fn checkpoint_pending(&self) -> bool {
        self.wal.as_ref().is_some_and(|wal| {
            self.index_unsynced.load(std::sync::atomic::Ordering::SeqCst)
                || wal.lock().unwrap_or_else(PoisonError::into_inner).pending().0 > 0
        })
    }

    /// Commits durably in the database everything the write-ahead log holds (and any history
    /// index step committed without an fsync), and starts the log over (the writer does this
    /// when it is idle).
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        let Some(wal) = &self.wal else { return Ok(()) };
        self.explaining(|| {
            let txn = self.db()?.begin_write()?;
            let mut wal = wal.lock().unwrap_or_else(PoisonError::into_inner);
            // Taken inside the write transaction: an index step committed after this one is
            // marked again once it has committed.
            let index_unsynced = self.index_unsynced.swap(false, std::sync::atomic::Ordering::SeqCst);
            if wal.pending().0 == 0 && !index_unsynced {
                let _ = txn.abort();
                return Ok(());
            }
            if let Err(error) = txn.commit() {
                self.index_unsynced.fetch_or(index_unsynced, std::sync::atomic::Ordering::SeqCst);
                return Err(error.into());
            }
            start_over(&mut wal);
            Ok(())
        })
    }

    /// Has the write-ahead log grown enough for a checkpoint before the next batch?
    fn checkpoint_due(&self) -> bool {
        self.wal.as_ref().is_some_and(|wal| {
            let (records, bytes) = wal.lock().unwrap_or_else(PoisonError::into_inner).pending();
            records >= CHECKPOINT_RECORDS || bytes >= CHECKPOINT_BYTES
        })
    }

    /// Saves `bytes` as the snapshot `name` (a worker's in-memory projection, which says itself
    /// how far it has read the log), in a durable transaction of its own (the events it
    /// reflects were committed before the worker read them).
    pub fn save_snapshot(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.explaining(|| {
            let txn = self.db()?.begin_write()?;
            txn.open_table(SNAPSHOTS)?.insert(name, bytes)?;
            txn.commit()?;
            Ok(())
        })
    }

    /// The snapshot `name` last saved, if any. A rebuild leaves it: it replays the projections
    /// of this store, and a worker's snapshot is of the worker's, which a running broker holds
    /// in memory (a new rule for them comes with a new build, which sets older snapshots aside).
    pub fn snapshot(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.reading(|txn| Ok(txn.open_table(SNAPSHOTS)?.get(name)?.map(|bytes| bytes.value().to_vec())))
    }

    /// The sequence number of the last event (0 when the log is empty).
    pub fn head(&self) -> Result<u64, StoreError> {
        self.reading(|txn| last_seq(&txn.open_table(LOG)?))
    }

    /// Up to `limit` events after `after`, in order.
    pub fn read_after(&self, after: u64, limit: usize) -> Result<Vec<Envelope>, StoreError> {
        self.read_after_within(after, limit, usize::MAX)
    }

    /// Up to `limit` events after `after`, in order, ending with the one that brings their
    /// texts ([`Event::text_bytes`](crate::event::Event::text_bytes)) to `max_text_bytes` or
    /// more: at least one event, however long. A tail far behind a log of long messages reads
    /// them a few at a time instead of a thousand at once.
    pub fn read_after_within(
        &self,
        after: u64,
        limit: usize,
        max_text_bytes: usize,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.reading(|txn| {
            let log = txn.open_table(LOG)?;
            read_within(txn, log.range(after.saturating_add(1)..)?.take(limit), max_text_bytes)
        })
    }

    /// The events from `first` up to `before` (excluded), the newest first, ending with the one
    /// that brings their texts to `max_text_bytes` or more (at least one event): a page of the
    /// log read backwards that holds a bounded amount of text however long the messages are.
    pub fn read_back_within(
        &self,
        first: u64,
        before: u64,
        max_text_bytes: usize,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.reading(|txn| {
            if first >= before {
                return Ok(Vec::new());
            }
            let log = txn.open_table(LOG)?;
            read_within(txn, log.range(first..before)?.rev(), max_text_bytes)
        })
    }

    /// Runs `read` against the live projections in one short read transaction.
    pub fn read<T>(
        &self,
        read: impl FnOnce(&projection::ReadProjections) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.reading(|txn| read(&projection::ReadProjections::open(txn, &LIVE)?))
    }

    /// Runs `read` in one read transaction of the database as it is now. A reopen that closes
    /// the database under the transaction makes redb answer "closed"; the error then gives the
    /// failure that called for the reopen, as a read that starts during the reopen does.
    pub(crate) fn reading<T>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.explaining(|| {
            // The database itself is let go of at the end of this statement, before the read:
            // a reopen closes it under the transaction instead of waiting for it.
            let txn = self.db()?.begin_read()?;
            read(&txn)
        })
    }

    /// Runs `work` (a transaction of this store) and gives its error [`explained`](Self::explained).
    fn explaining<T>(&self, work: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        work().map_err(|error| self.explained(error))
    }

    /// An error of a transaction, with the causes redb does not give. A "being reopened" without
    /// its reason (redb's answer to a transaction whose database a reopen closed) gets the failure
    /// that called for the reopen. "An earlier write failed" gets the storage failure behind it,
    /// noted by the backend before redb saw it ([`failure`]): a full disk stays a full disk.
    pub(crate) fn explained(&self, error: StoreError) -> StoreError {
        match error {
            StoreError::Reopening(None) => {
                let reason = self.reopen_reason.lock().unwrap_or_else(PoisonError::into_inner).clone();
                StoreError::Reopening(reason)
            }
            StoreError::Io(reason) if reason == EARLIER_WRITE_FAILED => {
                match self.source.as_ref().and_then(|source| source.failure.get()) {
                    Some(failure::Cause::DiskFull(cause)) => StoreError::DiskFull(cause),
                    Some(failure::Cause::Io(cause)) => StoreError::Io(format!("an earlier write failed: {cause}")),
                    None => StoreError::Io(reason),
                }
            }
            other => other,
        }
    }

    /// Runs one write transaction: `work` appends events through the [`Appender`]; everything is
    /// committed durably (fsync) when it returns `Ok`, and nothing is kept when it returns `Err`
    /// or the commit fails.
    pub fn transact<T>(
        &self,
        time_ms: u64,
        work: impl FnOnce(&mut Appender<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.explaining(|| self.transact_once(time_ms, work))
    }

    fn transact_once<T>(
        &self,
        time_ms: u64,
        work: impl FnOnce(&mut Appender<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // A due checkpoint is a commit of its own, before the batch: a durable commit that
        // fails may have reached the disk all the same (redb says so), which is harmless for one
        // that holds no event, but a batch in it would be stored after its callers heard it was
        // not, and stored twice when they try again. So every batch goes through the log.
        if self.checkpoint_due() {
            self.checkpoint()?;
        }
        let txn = self.db()?.begin_write()?;
        let (result, logged) = {
            let log = txn.open_table(LOG)?;
            let next_seq = last_seq(&log)? + 1;
            let mut projections = Projections::open(&txn, &LIVE)?;
            projections.log = Some(log);
            let logged = self.wal.as_ref().map(|_| Vec::new());
            let mut appender = Appender { projections, next_seq, time_ms, logged };
            let result = work(&mut appender);
            (result, appender.logged.take())
        };
        match result {
            Ok(value) => {
                self.commit(txn, logged.unwrap_or_default())?;
                Ok(value)
            }
            Err(error) => {
                let _ = txn.abort();
                Err(error)
            }
        }
    }

    /// Commits a batch whose events are `logged` (for the write-ahead log, see [`wal`]): they
    /// are durable in the log before the database shows them to anyone.
    fn commit(&self, mut txn: WriteTransaction, logged: Vec<u8>) -> Result<(), StoreError> {
        let Some(wal) = &self.wal else {
            txn.commit()?;
            return Ok(());
        };
        let mut wal = wal.lock().unwrap_or_else(PoisonError::into_inner);
        txn.set_durability(Durability::None)?;
        if logged.is_empty() {
            // No event: nothing to make durable.
            txn.commit()?;
            return Ok(());
        }
        let end = wal.end();
        if let Err(error) = wal.append(&logged) {
            let _ = txn.abort();
            return Err(error);
        }
        // redb may panic after a failed write: the record is taken back either way, so that
        // a batch its callers hear was not stored never comes back at the next open.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| txn.commit())) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                wal.undo(end);
                Err(error.into())
            }
            Err(panic) => {
                wal.undo(end);
                drop(wal);
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// Drops every projection and replays the whole log into fresh ones. The history index is
    /// emptied too; the indexer builds it again from the first event.
    pub fn rebuild(&self) -> Result<RebuildReport, StoreError> {
        let started = Instant::now();
        let _indexer = self.index_lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.explaining(|| {
            let txn = self.db()?.begin_write()?;
            let (events, rows) = replay_into(&txn, &LIVE)?;
            search_index::clear(&txn)?;
            txn.commit()?;
            free_in_background(rows);
            Ok(RebuildReport { events, elapsed_ms: millis(started.elapsed()) })
        })
    }

    /// Replays the log into scratch tables and compares them with the live projections.
    /// Writes nothing: the transaction is aborted.
    pub fn verify(&self) -> Result<VerifyReport, StoreError> {
        self.explaining(|| {
            let txn = self.db()?.begin_write()?;
            let (events, rows) = replay_into(&txn, &SCRATCH)?;
            let differences = projection::compare(&txn, &LIVE, &SCRATCH)?;
            let _ = txn.abort();
            free_in_background(rows);
            Ok(VerifyReport { events, differences })
        })
    }

    /// Every table's name, the bytes its rows hold and the pages its tree takes (4 KiB each),
    /// largest first: where the file's size goes (`synapse-bench scale`).
    pub fn table_sizes(&self) -> Result<Vec<TableSize>, StoreError> {
        self.reading(|txn| {
            let mut sizes = Vec::new();
            for handle in txn.list_tables()? {
                let name = redb::TableHandle::name(&handle).to_string();
                let stats = txn.open_untyped_table(handle)?.stats()?;
                sizes.push(TableSize {
                    name,
                    stored_bytes: stats.stored_bytes(),
                    pages: stats.leaf_pages() + stats.branch_pages(),
                });
            }
            sizes.sort_by_key(|size| std::cmp::Reverse(size.pages));
            Ok(sizes)
        })
    }

    /// Number of events in the log.
    pub fn event_count(&self) -> Result<u64, StoreError> {
        self.reading(|txn| Ok(txn.open_table(LOG)?.len()?))
    }
}

impl Drop for Store {
    /// A store that closes leaves its database durable on its own and its write-ahead log empty
    /// (best effort: whatever the log still holds comes back at the next open anyway).
    fn drop(&mut self) {
        if let Err(error) = self.checkpoint() {
            tracing::warn!("closing the store: {error}");
        }
    }
}

/// One table's share of the file (see [`Store::table_sizes`]).
#[derive(Debug, Clone)]
pub struct TableSize {
    pub name: String,
    pub stored_bytes: u64,
    pub pages: u64,
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Starts the write-ahead log over, once the database holds everything in it durably. A log
/// whose first record cannot be cleared still starts over in memory, and the next open skips its
/// records (they are not past the database's head): the failure is only reported.
fn start_over(wal: &mut wal::Wal) {
    if let Err(error) = wal.reset() {
        tracing::warn!("the write-ahead log cannot start over: {error}");
    }
}

/// Drops the system's cached copy of the database file's pages, so that a reopen reads what
/// the disk holds. After a failed fsync, Linux may keep showing pages it never wrote (it marks
/// them clean): a reopen that read them would take a commit that is not on the disk for
/// durable, and start the write-ahead log over while the log is the only durable copy of the
/// batches since the last checkpoint. Best effort: pages still dirty are not dropped, and are
/// written by the next fsync.
fn forget_cached_pages(path: &Path) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let Ok(file) = std::fs::File::open(path) else { return };
        // SAFETY: posix_fadvise only reads its arguments; the descriptor is open for the call.
        #[allow(unsafe_code)]
        let result = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if result != 0 {
            tracing::debug!("{}: the cached pages were not dropped (error {result})", path.display());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = path;
}

/// The events of `rows` in their order, each that refers to a long text stored once given it
/// (as if it had been copied), up to the one that brings their texts to `max_text_bytes` or more.
fn read_within<'a>(
    txn: &redb::ReadTransaction,
    rows: impl Iterator<
        Item = Result<(redb::AccessGuard<'a, u64>, redb::AccessGuard<'a, &'static [u8]>), redb::StorageError>,
    >,
    max_text_bytes: usize,
) -> Result<Vec<Envelope>, StoreError> {
    let mut projections = None;
    let mut events = Vec::new();
    let mut text_bytes = 0usize;
    for row in rows {
        let (_, bytes) = row?;
        let mut envelope = Envelope::decode(bytes.value())?;
        if envelope.event.refers_to_text() {
            if projections.is_none() {
                projections = Some(projection::ReadProjections::open(txn, &LIVE)?);
            }
            if let Some(projections) = &projections {
                projections.hydrate_event(&mut envelope.event)?;
            }
        }
        text_bytes = text_bytes.saturating_add(envelope.event.text_bytes());
        events.push(envelope);
        if text_bytes >= max_text_bytes {
            break;
        }
    }
    Ok(events)
}

/// The sequence number of the log's last event; 0 when it has none.
fn last_seq(log: &impl ReadableTable<u64, &'static [u8]>) -> Result<u64, StoreError> {
    Ok(log.last()?.map_or(0, |(seq, _)| seq.value()))
}

/// The write-ahead log's salt, as the database keeps it; None before the first open by a build
/// that writes salts.
fn stored_wal_salt(db: &Database) -> Result<Option<u64>, StoreError> {
    let txn = db.begin_read()?;
    match txn.open_table(META) {
        Ok(meta) => Ok(meta.get(META_WAL_SALT)?.map(|v| v.value()).filter(|salt| *salt != 0)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// A new salt for the write-ahead log: random, never 0 (zeros are where the log ends).
fn new_wal_salt() -> u64 {
    let mut bytes = [0_u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // As random as a new id, where the system's source failed.
        bytes = uuid::Uuid::new_v4().as_u64_pair().0.to_le_bytes();
    }
    u64::from_le_bytes(bytes).max(1)
}

/// The last event of a database just opened (at its last durable commit); 0 when it has none.
fn durable_head(db: &Database) -> Result<u64, StoreError> {
    let txn = db.begin_read()?;
    match txn.open_table(LOG) {
        Ok(log) => last_seq(&log),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
        Err(error) => Err(error.into()),
    }
}

/// Appends to the log, and applies to the live projections when `apply`, the events of the
/// write-ahead log past the log's head (the ones before it are in the database already). They
/// must continue the log: a gap means the log file does not belong to this database.
fn recover_logged(txn: &WriteTransaction, logged: &[wal::LoggedEvent], apply: bool) -> Result<u64, StoreError> {
    let mut log = txn.open_table(LOG)?;
    let head = last_seq(&log)?;
    let missing: Vec<&wal::LoggedEvent> = logged.iter().filter(|event| event.seq > head).collect();
    if missing.is_empty() {
        return Ok(0);
    }
    if let Some(first) = missing.first()
        && first.seq != head + 1
    {
        return Err(StoreError::Corrupt(format!(
            "the write-ahead log continues at event {} but the database ends at {head}: it belongs to another database (move it aside to open this one)",
            first.seq
        )));
    }
    if !apply {
        for event in &missing {
            logged_envelope(event)?;
            log.insert(event.seq, event.bytes.as_slice())?;
        }
        return Ok(missing.len() as u64);
    }
    let mut projections = Projections::open(txn, &LIVE)?;
    projections.log = Some(log);
    for event in &missing {
        let envelope = logged_envelope(event)?;
        if let Some(log) = projections.log.as_mut() {
            log.insert(event.seq, event.bytes.as_slice())?;
        }
        projections.apply(&envelope)?;
    }
    Ok(missing.len() as u64)
}

/// The envelope a write-ahead log record holds for event `event.seq`: it must decode, and be
/// that event (an envelope numbered otherwise would stand in the log under another number).
fn logged_envelope(event: &wal::LoggedEvent) -> Result<Envelope, StoreError> {
    let envelope = Envelope::decode(&event.bytes).map_err(|error| match StoreError::from(error) {
        StoreError::Corrupt(reason) => {
            StoreError::Corrupt(format!("event {} of the write-ahead log cannot be read: {reason}", event.seq))
        }
        other => other,
    })?;
    if envelope.seq != event.seq {
        return Err(StoreError::Corrupt(format!(
            "the write-ahead log holds event {} where event {} should be",
            envelope.seq, event.seq
        )));
    }
    Ok(envelope)
}

/// Replays the whole log into the (emptied) projection tables `names`.
///
/// A replay keeps every row in memory until its end: at 1M events, 200k tasks and a few million
/// small allocations. Freeing them was a sixth of a rebuild (the drop, then glibc merging its
/// freed chunks inside the next large allocation), so the replay runs on a thread of its own,
/// whose allocator arena nothing else uses, and hands its rows back, for the caller to free
/// once the transaction has ended ([`free_in_background`]).
fn replay_into(txn: &WriteTransaction, names: &ProjectionNames) -> Result<(u64, projection::ReplayRows), StoreError> {
    let replay = || -> Result<(u64, projection::ReplayRows), StoreError> {
        names.delete_all(txn)?;
        let mut projections = Projections::open_for_replay(txn, names)?;
        let log = txn.open_table(LOG)?;
        let events = replay_log(&log, &mut projections)?;
        Ok((events, projections.flush()?))
    };
    std::thread::scope(|scope| {
        match std::thread::Builder::new().name("synapse-replay".into()).spawn_scoped(scope, replay) {
            Ok(thread) => thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => replay(),
        }
    })
}

/// Envelopes the reading thread of a replay decodes before it hands them on (a few in the unit
/// tests, whose logs are short, so that their replays cross chunks).
const REPLAY_CHUNK: usize = if cfg!(test) { 3 } else { 1024 };

/// Applies every event of `log` to `projections` and says how many there were. The log is read
/// and decoded on a thread of its own, a chunk of [`REPLAY_CHUNK`] envelopes at a time, while
/// this one applies the chunk before (decoding was about a third of a rebuild); the chunks go
/// back to that thread to be freed there, in the allocator arena they came from. When no
/// thread can be started, it all happens here. Sound only while a replay writes no row of the
/// log: redb lets the two threads share the transaction, but a page of the log written while
/// the reading thread holds it would panic (`projections.log` is None in a replay).
fn replay_log(log: &redb::Table<'_, u64, &[u8]>, projections: &mut Projections<'_>) -> Result<u64, StoreError> {
    let (chunks, decoded) = std::sync::mpsc::sync_channel::<Vec<Envelope>>(4);
    let (used, returned) = std::sync::mpsc::channel::<Vec<Envelope>>();
    let read = move || -> Result<(), StoreError> {
        let mut chunk = Vec::with_capacity(REPLAY_CHUNK);
        for row in log.iter()? {
            chunk.push(Envelope::decode(row?.1.value())?);
            if chunk.len() == REPLAY_CHUNK {
                let next = returned.try_recv().map_or_else(|_| Vec::with_capacity(REPLAY_CHUNK), clear);
                if chunks.send(std::mem::replace(&mut chunk, next)).is_err() {
                    // The applying side stopped on an error of its own, which it reports.
                    return Ok(());
                }
            }
        }
        if !chunk.is_empty() {
            let _ = chunks.send(chunk);
        }
        Ok(())
    };
    fn clear(mut chunk: Vec<Envelope>) -> Vec<Envelope> {
        chunk.clear();
        chunk
    }
    std::thread::scope(|scope| {
        let reader = match std::thread::Builder::new().name("synapse-replay-read".into()).spawn_scoped(scope, read) {
            Ok(reader) => reader,
            Err(_) => {
                let mut events = 0;
                for row in log.iter()? {
                    projections.apply(&Envelope::decode(row?.1.value())?)?;
                    events += 1;
                }
                return Ok(events);
            }
        };
        let mut events = 0;
        let applied = decoded.iter().try_for_each(|chunk| {
            for envelope in &chunk {
                projections.apply(envelope)?;
            }
            events += chunk.len() as u64;
            let _ = used.send(chunk);
            Ok::<(), StoreError>(())
        });
        // An error here stops the reader at its next chunk.
        drop(decoded);
        let read = reader.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        applied?;
        read?;
        Ok(events)
    })
}

/// Drops a replay's rows on a thread of its own, after its transaction (its commit frees
/// buffers of the same allocator arena), and returns the freed memory to the system. When no
/// thread can be started, the closure and the rows are dropped here.
fn free_in_background(rows: projection::ReplayRows) {
    let _ = std::thread::Builder::new().name("synapse-free".into()).spawn(move || {
        drop(rows);
        crate::process::release_free_memory();
    });
}

/// The writer's handle inside one transaction: reads see everything appended before.
pub struct Appender<'txn> {
    /// Holds the log table too (`Projections::log`): reads of tasks take long texts from it.
    projections: Projections<'txn>,
    next_seq: u64,
    time_ms: u64,
    /// The batch's events for the write-ahead log (None: the store has none).
    logged: Option<Vec<u8>>,
}

impl<'txn> Appender<'txn> {
    /// The projections as they stand, including everything appended so far in this transaction.
    pub fn view(&self) -> &Projections<'txn> {
        &self.projections
    }

    /// The time of this batch (every event in it gets this time).
    pub fn time_ms(&self) -> u64 {
        self.time_ms
    }

    /// The sequence number the next appended event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Appends events to the log and applies them to the projections; returns them as readers
    /// of the log see them (an event that refers to a long text elsewhere in `events` is given
    /// the text, see `Store::read_after`).
    pub fn append(&mut self, actor: Option<&str>, events: Vec<Event>) -> Result<Vec<Envelope>, StoreError> {
        let mut written = Vec::with_capacity(events.len());
        for event in events {
            let envelope = Envelope {
                v: SCHEMA_VERSION,
                seq: self.next_seq,
                time_ms: self.time_ms,
                actor: actor.map(str::to_string),
                event,
            };
            let Some(log) = self.projections.log.as_mut() else {
                return Err(StoreError::Storage("the appender has no log table".into()));
            };
            let bytes = envelope.encode();
            log.insert(envelope.seq, bytes.as_slice())?;
            if let Some(logged) = self.logged.as_mut() {
                wal::push_event(logged, envelope.seq, &bytes);
            }
            self.projections.apply(&envelope)?;
            self.next_seq += 1;
            written.push(envelope);
        }
        for envelope in &mut written {
            self.projections.hydrate_event(&mut envelope.event)?;
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests;
