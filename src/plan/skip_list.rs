//! [`SkipList`]: the rows one operator dropped under `on_error = skip`, bounded.
//!
//! Guarantees: at most `limit` entries are listed (the first ones recorded) and
//! every drop is counted, so a run that skips millions of rows holds a
//! thousand strings, not millions. Entries are redacted
//! ([`redact`](crate::util::redact::redact)).

use crate::util::lock::lock;
use std::sync::Mutex;

/// The most dropped rows one operator (and one report) lists.
pub const SKIP_LIST_LIMIT: usize = 1000;

/// The rows one operator dropped under `on_error = skip`: the first
/// `limit` listed, every one counted.
#[derive(Debug)]
pub struct SkipList {
    limit: usize,
    inner: Mutex<SkipInner>,
}

#[derive(Debug, Default)]
struct SkipInner {
    listed: Vec<String>,
    total: usize,
}

impl Default for SkipList {
    fn default() -> Self {
        Self::with_limit(SKIP_LIST_LIMIT)
    }
}

impl SkipList {
    /// A list keeping at most `limit` entries.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            limit,
            inner: Mutex::default(),
        }
    }

    /// Records one dropped row, listed (redacted: a presigned URL's
    /// signature is masked) if the list has room.
    pub fn push(&self, what: String) {
        let mut inner = lock(&self.inner);
        inner.total += 1;
        if inner.listed.len() < self.limit {
            inner
                .listed
                .push(crate::util::redact::redact(&what).into_owned());
        }
    }

    /// The listed entries, in the order they were recorded.
    pub fn listed(&self) -> Vec<String> {
        lock(&self.inner).listed.clone()
    }

    /// Every dropped row, listed or not.
    pub fn total(&self) -> usize {
        lock(&self.inner).total
    }
}
