//! [`WindowPins`]: the shared-cache entries a prefetch window holds for its
//! rows, in front of the window's other local copies (its temp cache): each
//! entry stays pinned until the last row using it is released, and a virtual
//! file (a member of a parent file) shares its parent's pin.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use udfchain_udfs::File;

use crate::cache::{LocalCopies, PinnedEntry, file_key};
use crate::util::lock::lock;

/// The shared-cache entries a prefetch window holds for its rows, in front of
/// the window's other local copies (`inner`, its temp cache): each entry stays
/// pinned until the last row using it is released.
#[derive(Debug)]
pub struct WindowPins {
    inner: Arc<dyn LocalCopies>,
    /// Pins by `source \0 path` (a virtual file shares its parent's), with the
    /// number of rows using each.
    held: Mutex<HashMap<String, (PinnedEntry, usize)>>,
}

impl WindowPins {
    /// Pins over `inner`'s local copies.
    pub fn new(inner: Arc<dyn LocalCopies>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            held: Mutex::default(),
        })
    }

    /// Holds `pin`, the entry of `file`, for one more row.
    pub fn hold(&self, file: &File, pin: PinnedEntry) {
        lock(&self.held)
            .entry(file_key(file))
            .and_modify(|(_, rows)| *rows += 1)
            .or_insert((pin, 1));
    }

    /// Counts one more row using `file` if its entry is held.
    pub fn acquire(&self, file: &File) -> bool {
        match lock(&self.held).get_mut(&file_key(file)) {
            Some((_, rows)) => {
                *rows += 1;
                true
            }
            None => false,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        lock(&self.held).len()
    }

    /// Whether no file is pinned.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LocalCopies for WindowPins {
    fn local_path(&self, file: &File) -> Option<PathBuf> {
        if let Some((pin, _)) = lock(&self.held).get(&file_key(file)) {
            return Some(pin.path().to_path_buf());
        }
        self.inner.local_path(file)
    }

    fn local_bytes(&self, file: &File) -> Option<bytes::Bytes> {
        self.inner.local_bytes(file)
    }

    fn holds_nothing(&self) -> bool {
        self.is_empty() && self.inner.holds_nothing()
    }

    fn release(&self, file: &File) {
        let mut held = lock(&self.held);
        let key = file_key(file);
        match held.get_mut(&key) {
            Some((_, rows)) => {
                *rows -= 1;
                if *rows == 0 {
                    held.remove(&key);
                }
            }
            None => {
                drop(held);
                self.inner.release(file);
            }
        }
    }
}
