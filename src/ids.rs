//! New ids for tasks, contexts and idempotency keys: UUIDs whose first 24 bits count
//! microseconds, so that ids made close in time sort close together.
//!
//! Why: the tasks table is keyed by the task id. With random (v4) ids, every send of a group
//! commit dirtied its own B-tree leaf, and the copy, checksum and write of those pages cost
//! about a third of the writer's time (`synapse-bench append`: 42–47k events/s with v4 ids,
//! 64–75k with time-ordered ones). Putting the whole time first (UUID v7) would make the
//! 8-character prefix users see and type the same for a minute of tasks; putting its *low*
//! bits first (as UUID v1 does with `time_low`) keeps the prefix different from one id to the
//! next and still puts the ids of one commit side by side in the table.
//!
//! Layout (RFC 9562 version 8, "custom"): bits 0–23 the low 24 bits of a microsecond clock
//! that never gives the same value twice in a process (it runs ahead of the wall clock when
//! ids are made faster than one per microsecond; it wraps every 16.8 s); bits 24–31 random, so
//! that the ids one send makes (its task, the sender's task, the context), a microsecond
//! apart, do not differ in one digit only, and a mistyped last digit seldom names a sibling;
//! the version nibble `8`; the RFC variant; the other 90 bits random. So an id is as hard to
//! guess as a 98-bit secret, and two ids of one process made less than 16.8 s apart never
//! share their 8-character prefix; ids further apart share it as rarely as random 32-bit
//! prefixes do (same microsecond modulo 2^24, and the same random byte).
//!
//! Invariants: every id is a lowercase hyphenated UUID string; within a process, ids made less
//! than 16.8 s apart have different first 32 bits, ordered as they were made (except once
//! where the 24-bit clock wraps). Imports nothing of the crate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The last microsecond value given out (0: none yet).
static LAST_MICROS: AtomicU64 = AtomicU64::new(0);

/// The next value of the process's microsecond clock: the wall clock, or one more than the last
/// value when the wall clock has not moved on (or went back).
fn next_micros() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    let mut last = LAST_MICROS.load(Ordering::Relaxed);
    loop {
        let next = now.max(last.wrapping_add(1));
        match LAST_MICROS.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// Bytes of the pool [`random_bytes`] refills at once.
const RANDOM_POOL: usize = 4096;

/// 16 random bytes from the operating system's generator, fetched 4 KiB at a time: one
/// `getrandom` call per 256 ids instead of one per id, which was 2–3 % of the writer's time
/// (a send makes three ids). They are the same generator's bytes; the pool is per thread, and
/// no Synapse process forks without exec after making ids, so no two processes share one.
fn random_bytes() -> [u8; 16] {
    thread_local! {
        static POOL: std::cell::RefCell<Pool> = const { std::cell::RefCell::new(Pool { bytes: Vec::new(), used: 0 }) };
    }
    let pooled = POOL.try_with(|pool| pool.borrow_mut().take(|fresh| getrandom::fill(fresh).is_ok()));
    // The generator failed (or the thread is ending): as before, one UUID's worth straight from
    // it, which panics if it fails again, as it did before the pool.
    pooled.ok().flatten().unwrap_or_else(|| *uuid::Uuid::new_v4().as_bytes())
}

/// Random bytes fetched ahead, and how many of them are spent.
struct Pool {
    bytes: Vec<u8>,
    used: usize,
}

impl Pool {
    /// The next 16 bytes, refilling the pool with `fill` (false: the generator failed) once it
    /// is spent. A pool `fill` failed to fill is never handed out (it would hold zeros or stale
    /// bytes): None, and the next call asks again.
    fn take(&mut self, fill: impl FnOnce(&mut [u8]) -> bool) -> Option<[u8; 16]> {
        if self.used + 16 > self.bytes.len() {
            let mut fresh = vec![0u8; RANDOM_POOL];
            if !fill(&mut fresh) {
                return None;
            }
            self.bytes = fresh;
            self.used = 0;
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.bytes[self.used..self.used + 16]);
        self.used += 16;
        Some(out)
    }
}

/// A new id: see the module documentation for its layout.
pub fn new_id() -> String {
    let mut bytes = random_bytes();
    // Truncation intended: only the low 24 bits of the clock go into the id, then the random
    // byte that is already in `bytes[3]`.
    #[allow(clippy::cast_possible_truncation)]
    let low = (next_micros() & 0x00ff_ffff) as u32;
    bytes[..3].copy_from_slice(&low.to_be_bytes()[1..]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid().hyphenated().to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_are_version_8_uuids_with_the_rfc_variant() {
        let id = new_id();
        let parsed = uuid::Uuid::parse_str(&id).unwrap();
        assert_eq!(parsed.get_version_num(), 8);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(id, id.to_ascii_lowercase());
        assert_eq!(id.len(), 36);
    }

    #[test]
    fn consecutive_ids_have_different_prefixes_and_sort_in_order() {
        let ids: Vec<String> = (0..10_000).map(|_| new_id()).collect();
        let prefixes: std::collections::HashSet<&str> = ids.iter().map(|id| &id[..8]).collect();
        assert_eq!(prefixes.len(), ids.len(), "every id has its own 8-character prefix");
        // In order, except at most once where the 24-bit microsecond count wraps.
        let descents = ids.windows(2).filter(|pair| pair[1] < pair[0]).count();
        assert!(descents <= 1, "{descents} ids sorted before the one made just before them");
    }

    #[test]
    fn ids_across_many_refills_of_the_pool_never_repeat_their_random_part() {
        // 10,000 ids take about 40 pools; the 90 random bits (after the clock) never repeat.
        let ids: Vec<String> = (0..10_000).map(|_| new_id()).collect();
        let random: std::collections::HashSet<&str> = ids.iter().map(|id| &id[9..]).collect();
        assert_eq!(random.len(), ids.len());
        // The last 12 digits are random (before them: the variant, never 0).
        assert!(ids.iter().all(|id| id[24..] != *"000000000000"), "no id ends in zeros");
    }

    #[test]
    fn a_pool_the_generator_failed_to_fill_is_never_handed_out() {
        let mut pool = Pool { bytes: Vec::new(), used: 0 };
        assert_eq!(pool.take(|_| false), None, "an empty pool and a failing generator");
        assert_eq!(pool.take(|_| false), None, "asked again, still nothing");
        let mut counter = 0u8;
        let mut numbered = |fresh: &mut [u8]| {
            for byte in fresh.iter_mut() {
                counter = counter.wrapping_add(1);
                *byte = counter;
            }
            true
        };
        assert_eq!(pool.take(&mut numbered), Some(std::array::from_fn(|index| index as u8 + 1)));
        // The rest of the pool is handed out without asking the generator.
        for _ in 1..RANDOM_POOL / 16 {
            assert!(pool.take(|_| panic!("the pool is not spent yet")).is_some());
        }
        // Spent: a failing refill gives nothing, not the old bytes again.
        assert_eq!(pool.take(|_| false), None);
        assert_eq!(
            pool.take(|fresh| {
                fresh.fill(7);
                true
            }),
            Some([7; 16])
        );
    }

    #[test]
    fn the_rest_of_an_id_is_random() {
        let first = new_id();
        let second = new_id();
        assert_ne!(first[9..], second[9..], "the 90 random bits differ");
        // Made a microsecond apart, two ids differ in more than the clock's last digit: the
        // byte after it is random (1 in 16 that a sibling's 8th digit matches, 1 in 256 both).
        let siblings: Vec<String> = (0..200).map(|_| new_id()).collect();
        let same_tail = siblings.windows(2).filter(|pair| pair[0][6..8] == pair[1][6..8]).count();
        assert!(same_tail < 20, "{same_tail} of 199 neighbours share digits 7-8");
    }
}
