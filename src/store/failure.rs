//! What made the database fail, kept where redb does not keep it.
//!
//! After a storage failure redb refuses every transaction with `PreviousIo` ("Previous I/O error
//! occurred") until the database is reopened, without saying what failed. The store's backend
//! ([`Recording`]) notes each I/O failure before redb sees it, so that whoever meets the
//! refusal next (the writer's batch after the history indexer's failed step, say) is told the
//! cause: a full disk stays a full disk ([`crate::store::Store::explained`]).

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};
use std::io;
use std::ops::Bound;
use std::sync::{Arc, Mutex, PoisonError};

/// The storage failure behind redb's refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    DiskFull(String),
    Io(String),
}

/// The last storage failure of a store's database, shared by its backends (a reopen opens a
/// new one) and cleared as soon as a reopened database has opened.
#[derive(Debug, Clone, Default)]
pub struct LastFailure(Arc<Mutex<Option<Cause>>>);

impl LastFailure {
    pub fn get(&self) -> Option<Cause> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn clear(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// A lock that cannot be released fails the database too.
    fn note_backend<T>(&self, result: Result<T, BackendError>) -> Result<T, BackendError> {
        if let Err(error) = &result {
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Cause::Io(error.to_string()));
        }
        result
    }

    fn note<T>(&self, result: Result<T, io::Error>) -> Result<T, io::Error> {
        if let Err(error) = &result {
            let cause = if super::is_disk_full(error) {
                Cause::DiskFull(error.to_string())
            } else {
                Cause::Io(error.to_string())
            };
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(cause);
        }
        result
    }
}

/// The backend of a store's database: redb's file backend, with its I/O failures noted before
/// redb sees them. In fault-injection tests it also behaves as on a full disk
/// ([`super::fault::SimulatedDisk`]).
///
/// redb fails the database after any failed call of its backend but one: a best-effort write of
/// its cache under memory pressure, which it tries again later. Such a note waits for the next
/// refusal or reopen, and a refusal after it is always preceded by a note of its own.
#[derive(Debug)]
pub struct Recording {
    file: FileBackend,
    disk: Option<super::fault::SimulatedDisk>,
    failure: LastFailure,
}

impl Recording {
    pub fn new(
        file: FileBackend,
        disk: Option<super::fault::SimulatedDisk>,
        failure: LastFailure,
    ) -> Result<Recording, io::Error> {
        if let Some(disk) = &disk {
            disk.attach(file.len()?);
        }
        Ok(Recording { file, disk, failure })
    }
}

impl StorageBackend for Recording {
    fn len(&self) -> Result<u64, io::Error> {
        self.failure.note(self.file.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.failure.note(self.file.read(offset, out))
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.failure.note(self.file.set_len(len))
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let synced = self.file.sync_data();
        let reported = synced.and_then(|()| self.disk.as_ref().map_or(Ok(()), |disk| disk.after_sync()));
        self.failure.note(reported)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let checked = self.disk.as_ref().map_or(Ok(()), |disk| disk.check_write(offset, data.len()));
        let written = checked.and_then(|()| self.file.write(offset, data));
        if let (Ok(()), Some(disk)) = (&written, &self.disk) {
            disk.after_write(offset);
        }
        self.failure.note(written)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.file.close()
    }

    // The file's locks, passed on (one broker per database).

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.failure.note_backend(self.file.unlock_range(start, end))
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}
