//! A storage backend for fault-injection tests of the real binary: the database file behaves as
//! if the disk were full while a switch file exists.
//!
//! "Full" means what a full disk does to a file: no new blocks. As on Linux, extending the
//! length (`set_len`, a sparse `ftruncate`) still works, but writing into the part that never
//! held data fails with `ENOSPC`; writes into blocks the file already has, and fsync, succeed.
//! So a commit that needs new pages fails when it writes them out, and reopening the database
//! (a repair rewrites only the header) works.
//!
//! Only the broker's tests turn this on (`SYNAPSE_TEST_DISK_FULL_FILE`); without it the broker
//! uses redb's plain file backend.

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};
use std::io;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The state of the simulated disk, shared by every backend opened on the file (a reopen
/// must not forget which part of the file never got blocks).
#[derive(Debug, Clone)]
pub struct SimulatedDisk {
    /// The disk is "full" while this file exists.
    switch: PathBuf,
    /// The length up to which the file has blocks: its length when first opened, and how far
    /// writes reached while the disk was not full. `u64::MAX` until first opened.
    allocated: Arc<AtomicU64>,
}

impl SimulatedDisk {
    pub fn new(switch: PathBuf) -> SimulatedDisk {
        SimulatedDisk { switch, allocated: Arc::new(AtomicU64::new(u64::MAX)) }
    }

    /// Is the disk "full" now? (The write-ahead log asks too: it must fail as the database does.)
    pub fn is_full(&self) -> bool {
        self.switch.exists()
    }
}

#[derive(Debug)]
pub struct DiskFullSwitch {
    file: FileBackend,
    disk: SimulatedDisk,
}

impl DiskFullSwitch {
    pub fn new(file: FileBackend, disk: SimulatedDisk) -> Result<DiskFullSwitch, io::Error> {
        let length = file.len()?;
        let _ = disk.allocated.compare_exchange(u64::MAX, length, Ordering::SeqCst, Ordering::SeqCst);
        Ok(DiskFullSwitch { file, disk })
    }

    fn is_full(&self) -> bool {
        self.disk.is_full()
    }

    fn no_space() -> io::Error {
        io::Error::from_raw_os_error(libc::ENOSPC)
    }
}

impl StorageBackend for DiskFullSwitch {
    fn len(&self) -> Result<u64, io::Error> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file.read(offset, out)
    }

    /// A longer length is a sparse extension: no blocks, whether the disk is full or not (redb
    /// makes room this way; a write into it later needs the blocks).
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let end = offset.saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
        if end > self.disk.allocated.load(Ordering::SeqCst) {
            if self.is_full() {
                return Err(DiskFullSwitch::no_space());
            }
            self.disk.allocated.fetch_max(end, Ordering::SeqCst);
        }
        self.file.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.file.close()
    }

    // The file's locks, as the plain backend takes them (one broker per database).

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
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}
