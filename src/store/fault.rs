//! A simulated full disk for fault-injection tests of the real binary: the database file and the
//! write-ahead log behave as if the disk were full while a switch file exists.
//!
//! "Full" means what a full disk does to a file: no new blocks. As on Linux, extending the
//! length (`set_len`, a sparse `ftruncate`) still works, but writing into the part that never
//! held data fails with `ENOSPC`; writes into blocks the file already has, and fsync, succeed.
//! So a commit that needs new pages fails when it writes them out, and reopening the database
//! (a repair rewrites only the header) works.
//!
//! Only the broker's tests turn this on (`SYNAPSE_TEST_DISK_FULL_FILE`). The store's backend
//! ([`super::failure::Recording`]) asks [`SimulatedDisk::check_write`] before each write, and
//! the write-ahead log [`SimulatedDisk::is_full`].

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::AtomicBool;
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
    /// Tests only: see [`Self::fail_sync_after_next_commit`]. Armed, then the header written.
    #[cfg(test)]
    fail_sync: Arc<(AtomicBool, AtomicBool)>,
}

impl SimulatedDisk {
    pub fn new(switch: PathBuf) -> SimulatedDisk {
        SimulatedDisk {
            switch,
            allocated: Arc::new(AtomicU64::new(u64::MAX)),
            #[cfg(test)]
            fail_sync: Arc::new((AtomicBool::new(false), AtomicBool::new(false))),
        }
    }

    /// Tests only: the fsync that follows the next write of the database's header (a durable
    /// commit's last step) makes everything durable and then reports an I/O error, as a file
    /// system that reports a failure late does. redb then answers that the commit failed,
    /// though a reopen finds it.
    #[cfg(test)]
    pub fn fail_sync_after_next_commit(&self) {
        self.fail_sync.1.store(false, Ordering::SeqCst);
        self.fail_sync.0.store(true, Ordering::SeqCst);
    }

    /// Called after each write of the database that succeeded.
    pub fn after_write(&self, offset: u64) {
        #[cfg(test)]
        if offset == 0 && self.fail_sync.0.load(Ordering::SeqCst) {
            self.fail_sync.1.store(true, Ordering::SeqCst);
        }
        #[cfg(not(test))]
        let _ = offset;
    }

    /// Called after each fsync of the database that succeeded: the failure a test asked for.
    pub fn after_sync(&self) -> Result<(), io::Error> {
        #[cfg(test)]
        if self.fail_sync.1.swap(false, Ordering::SeqCst) {
            self.fail_sync.0.store(false, Ordering::SeqCst);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    /// Is the disk "full" now? (The write-ahead log asks too: it must fail as the database does.)
    pub fn is_full(&self) -> bool {
        self.switch.exists()
    }

    /// The database file was opened with `length`: that much of it has blocks (the first open
    /// only; a reopen keeps what is known).
    pub fn attach(&self, length: u64) {
        let _ = self.allocated.compare_exchange(u64::MAX, length, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// May `len` bytes be written at `offset`? Not into the part that never got blocks while the
    /// disk is full (`ENOSPC`); otherwise they are, and that part has blocks from then on. (A
    /// longer length by `set_len` is a sparse extension: no blocks, whether full or not.)
    pub fn check_write(&self, offset: u64, len: usize) -> Result<(), io::Error> {
        let end = offset.saturating_add(u64::try_from(len).unwrap_or(u64::MAX));
        if end > self.allocated.load(Ordering::SeqCst) {
            if self.is_full() {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.allocated.fetch_max(end, Ordering::SeqCst);
        }
        Ok(())
    }
}
