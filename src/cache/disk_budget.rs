//! [`DiskBudget`]: the bytes prefetched files may take on disk under one
//! root's temp dir (`temp_dir_limit`), shared by every prefetch of the process
//! that uses that root, as the memory pool bounds memory.
//!
//! Guarantees:
//! - a copy on disk is reserved before its download starts and released when
//!   the copy is deleted (its [`DiskReservation`] dropped with the temp
//!   cache's entry): what is reserved never exceeds the limit;
//! - [`DiskBudget::try_reserve`] never waits: a file that does not fit beside
//!   the ones held now is read from its store by its UDF instead (streamed),
//!   so no prefetch window waits on another's release and none can deadlock,
//!   and a run progresses whatever the space (one file at a time fits, or
//!   none is copied);
//! - a write that meets a full disk (ENOSPC, a quota) lowers the limit to what
//!   is held then ([`DiskBudget::back_off`]): the next files are streamed until
//!   copies are released, and each run sets the limit again when it starts
//!   ([`DiskBudget::start_run`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::settings::DEFAULT_TEMP_DIR_SHARE;
use crate::util::lock::lock;

/// The disk budget of one temp dir (see the module header).
#[derive(Debug)]
pub struct DiskBudget {
    dir: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    limit: u64,
    used: u64,
}

/// Bytes reserved on a [`DiskBudget`], released when dropped.
#[derive(Debug)]
pub struct DiskReservation {
    budget: Arc<DiskBudget>,
    bytes: u64,
}

impl Drop for DiskReservation {
    fn drop(&mut self) {
        let mut s = lock(&self.budget.state);
        s.used = s.used.saturating_sub(self.bytes);
    }
}

impl DiskBudget {
    /// The process-wide budget of the temp dir `dir` (`<root>/tmp`).
    pub fn of(dir: &Path) -> Arc<Self> {
        static ALL: Mutex<Option<HashMap<PathBuf, Arc<DiskBudget>>>> = Mutex::new(None);
        let mut all = lock(&ALL);
        let all = all.get_or_insert_with(HashMap::new);
        Arc::clone(all.entry(dir.to_path_buf()).or_insert_with(|| {
            Arc::new(Self {
                dir: dir.to_path_buf(),
                // Until a run sets it: nothing is copied.
                state: Mutex::new(State::default()),
            })
        }))
    }

    /// Sets the limit a run starts with: `limit`, else
    /// [`DEFAULT_TEMP_DIR_SHARE`] of the space available in the dir's file
    /// system now, plus what is already held there. Blocking (`statvfs`).
    pub fn start_run(&self, limit: Option<u64>) {
        let limit = limit.unwrap_or_else(|| {
            let free = fs4::available_space(&self.dir).unwrap_or(0);
            let share = (free as f64 * DEFAULT_TEMP_DIR_SHARE) as u64;
            share.saturating_add(lock(&self.state).used)
        });
        lock(&self.state).limit = limit;
    }

    /// Reserves `bytes` when they fit beside what is held; `None` at once
    /// otherwise.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<DiskReservation> {
        let mut s = lock(&self.state);
        if s.used.saturating_add(bytes) > s.limit {
            return None;
        }
        s.used += bytes;
        Some(DiskReservation {
            budget: Arc::clone(self),
            bytes,
        })
    }

    /// The disk filled up before the limit: the limit becomes what is held now.
    pub fn back_off(&self) {
        let mut s = lock(&self.state);
        s.limit = s.limit.min(s.used);
    }

    /// (bytes held, limit).
    #[cfg(test)]
    pub fn usage(&self) -> (u64, u64) {
        let s = lock(&self.state);
        (s.used, s.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_the_limit_and_a_full_disk_lowers_it() {
        let dir = tempfile::tempdir().expect("dir");
        let b = DiskBudget::of(dir.path());
        assert!(Arc::ptr_eq(&b, &DiskBudget::of(dir.path())), "one per dir");
        assert!(b.try_reserve(1).is_none(), "no run set a limit yet");
        b.start_run(Some(100));
        let first = b.try_reserve(60).expect("fits");
        assert!(b.try_reserve(50).is_none(), "60 + 50 > 100");
        let second = b.try_reserve(40).expect("fits exactly");
        assert_eq!(b.usage(), (100, 100));
        drop(first);
        assert_eq!(b.usage(), (40, 100));
        b.back_off();
        assert_eq!(b.usage(), (40, 40));
        assert!(b.try_reserve(1).is_none(), "backed off to what is held");
        drop(second);
        assert!(
            b.try_reserve(40).is_some(),
            "released space is usable again"
        );
        b.start_run(None);
        let (_, limit) = b.usage();
        assert!(limit > 0, "the default is a share of the free space");
    }
}
