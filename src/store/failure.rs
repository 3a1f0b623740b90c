//! What made the database fail, kept where redb does not keep it.
//!
//! After a storage failure redb refuses every transaction with `PreviousIo` ("Previous I/O error
//! occurred") until the database is reopened, without saying what failed. The store's backend
//! wrapper ([`Recording`]) notes each I/O failure before redb sees it, so that whoever meets the
//! refusal next (the writer's batch after the history indexer's failed step, say) is told the
//! cause: a full disk stays a full disk ([`crate::store::Store::explained`]).

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
/// new one) and cleared when a reopened database is in place.
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

/// A storage backend that passes everything to `inner` and notes its I/O failures first.
///
/// redb fails the database after any failed call of its backend but one: a best-effort write of
/// its cache under memory pressure, which it tries again later. Such a note waits for the next
/// refusal or reopen, and a refusal after it is always preceded by a note of its own.
#[derive(Debug)]
pub struct Recording<B> {
    pub inner: B,
    pub failure: LastFailure,
}

impl<B: StorageBackend> StorageBackend for Recording<B> {
    fn len(&self) -> Result<u64, io::Error> {
        self.failure.note(self.inner.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.failure.note(self.inner.read(offset, out))
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.failure.note(self.inner.set_len(len))
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.failure.note(self.inner.sync_data())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.failure.note(self.inner.write(offset, data))
    }

    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }

    // The file's locks, passed on (one broker per database).

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.failure.note_backend(self.inner.unlock_range(start, end))
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
