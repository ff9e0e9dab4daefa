//! Test support (unit tests only): a [`FileSource`] over bytes in memory that
//! counts its reads, so a parser's reads can be bounded in a test, and a
//! helper that runs a future with it on a fresh current-thread runtime.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::UdfError;
use crate::file::{File, FileSource, with_file_source};

/// The bytes of one object; every `File` read through it reads these.
#[derive(Debug)]
pub struct MemorySource {
    bytes: Bytes,
    reads: AtomicUsize,
    max_read: AtomicU64,
}

impl MemorySource {
    pub fn new(bytes: impl Into<Bytes>) -> Arc<Self> {
        Arc::new(Self {
            bytes: bytes.into(),
            reads: AtomicUsize::new(0),
            max_read: AtomicU64::new(0),
        })
    }

    /// A whole-object `File` of these bytes.
    pub fn file(&self) -> File {
        File {
            source: "memory:///t".into(),
            path: "x".into(),
            size: self.bytes.len() as u64,
            ..File::default()
        }
    }

    /// The reads made so far.
    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::Relaxed)
    }

    /// The most bytes one read asked for so far.
    pub fn max_read(&self) -> u64 {
        self.max_read.load(Ordering::Relaxed)
    }

    /// Runs `fut` with this source serving its reads, to completion.
    pub fn run<T>(self: &Arc<Self>, fut: impl Future<Output = T>) -> T {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime");
        rt.block_on(with_file_source(Arc::clone(self) as _, fut))
    }
}

#[async_trait]
impl FileSource for MemorySource {
    async fn read(&self, file: &File) -> Result<Bytes, UdfError> {
        self.read_range(file, 0..file.size).await
    }

    async fn read_range(&self, file: &File, range: Range<u64>) -> Result<Bytes, UdfError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        // As the engine's source: the range is clamped to the file, and a
        // virtual file reads its range of the parent.
        let end = range.end.min(file.size);
        if range.start >= end {
            return Ok(Bytes::new());
        }
        self.max_read
            .fetch_max(end - range.start, Ordering::Relaxed);
        let base = file.member().map_or(0, |m| m.offset);
        let len = self.bytes.len() as u64;
        match (base.checked_add(range.start), base.checked_add(end)) {
            (Some(s), Some(e)) if e <= len => Ok(self.bytes.slice(s as usize..e as usize)),
            _ => Err(UdfError::Read {
                url: file.url(),
                source: format!("range {range:?} at {base} of a {len}-byte object").into(),
            }),
        }
    }
}
