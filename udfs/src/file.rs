//! [`File`]: the value a UDF receives for a stored object, and how it reads bytes.
//!
//! A `File` is plain data (source URL, relative path, size, version, etag, ...);
//! reading goes through the [`FileSource`] the engine installs around each UDF call
//! with [`with_file_source`]. So the same `File` reads a prefetched local copy, a
//! shared-cache entry or the object store, and the UDF does not need to know which.

use std::fmt::Debug;
use std::io::SeekFrom;
use std::ops::Range;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray};
use datafusion::arrow::datatypes::{
    DataType, Field, Fields, TimeUnit, TimestampMillisecondType, UInt64Type,
};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncSeek, ReadBuf};

use crate::error::UdfError;

/// A stored object (or a virtual file inside one).
///
/// `source` is the URL of the listed prefix (`s3://bucket/images`, `file:///data`,
/// `memory:///x`) and `path` is relative to it, so the same data listed from two
/// stores gives equal paths. Both hold the store's key verbatim, never
/// percent-encoded: an object `c#d.txt` has the path `c#d.txt`, and reading
/// it asks the store for exactly that key. `location` describes a virtual file (a tar member, a
/// parquet row range) inside the object at `path`; it is `None` for whole objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct File {
    /// The listed prefix's URL: the store and the prefix inside it
    /// (`s3://bucket/images`, `file:///data`).
    pub source: String,
    /// The key below `source`, verbatim (not percent-encoded).
    pub path: String,
    /// Bytes: of the object, or of the virtual file inside it.
    pub size: u64,
    /// The object version the listing saw, when the store reports versions.
    pub version: Option<String>,
    /// The ETag the listing saw; every read asks for it (`If-Match`).
    pub etag: Option<String>,
    /// Milliseconds since the Unix epoch, UTC (Arrow `Timestamp(ms, UTC)`).
    pub last_modified: Option<i64>,
    /// Where a virtual file lies inside the object at `path` (a tar member's
    /// byte range); `None` for a whole object.
    pub location: Option<String>,
}

impl File {
    /// The Arrow fields of the `file` struct column, in order.
    pub fn fields() -> Fields {
        Fields::from(vec![
            Field::new("source", DataType::Utf8, false),
            Field::new("path", DataType::Utf8, false),
            Field::new("size", DataType::UInt64, false),
            Field::new("version", DataType::Utf8, true),
            Field::new("etag", DataType::Utf8, true),
            Field::new(
                "last_modified",
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                true,
            ),
            Field::new("location", DataType::Utf8, true),
        ])
    }

    /// The `File`s of a `file` struct column (`None` for a null row), as
    /// [`decode_column`](crate::decode_column) gives them: read straight off
    /// the child arrays when they have [`File::fields`]' types (no serde per
    /// field; the engine decodes File columns on its per-file paths), else
    /// through serde_arrow, which takes any layout it can convert (view
    /// strings read back from Parquet, say) and says what it cannot.
    pub fn decode_array(array: &ArrayRef) -> Result<Vec<Option<File>>, UdfError> {
        match Self::decode_plain(array) {
            Some(files) => Ok(files),
            None => crate::decode_column(array),
        }
    }

    /// [`File::decode_array`] of a column whose fields have [`File::fields`]'
    /// types (found by name, as the prefetch's `all_in_place` reads them);
    /// `None` for any other layout, or a required field null in a valid row.
    fn decode_plain(array: &ArrayRef) -> Option<Vec<Option<File>>> {
        let s = array.as_struct_opt()?;
        let field = |name: &str| s.column_by_name(name);
        let text = |name: &str| field(name)?.as_string_opt::<i32>();
        let (source, path, location) = (text("source")?, text("path")?, text("location")?);
        let (version, etag) = (text("version")?, text("etag")?);
        let size = field("size")?.as_primitive_opt::<UInt64Type>()?;
        let modified = field("last_modified")?.as_primitive_opt::<TimestampMillisecondType>()?;
        let opt = |a: &StringArray, i: usize| a.is_valid(i).then(|| a.value(i).to_string());
        let mut files = Vec::with_capacity(s.len());
        for i in 0..s.len() {
            if s.is_null(i) {
                files.push(None);
                continue;
            }
            if source.is_null(i) || path.is_null(i) || size.is_null(i) {
                return None;
            }
            files.push(Some(File {
                source: source.value(i).to_string(),
                path: path.value(i).to_string(),
                size: size.value(i),
                version: opt(version, i),
                etag: opt(etag, i),
                last_modified: modified.is_valid(i).then(|| modified.value(i)),
                location: opt(location, i),
            }));
        }
        Some(files)
    }

    /// The Arrow type of a `File` value.
    pub fn data_type() -> DataType {
        DataType::Struct(Self::fields())
    }

    /// True when an Arrow type has the shape of a `File` (same field names in order).
    pub fn is_file_type(dt: &DataType) -> bool {
        match dt {
            DataType::Struct(fields) => {
                let want = Self::fields();
                fields.len() == want.len()
                    && fields
                        .iter()
                        .zip(want.iter())
                        .all(|(a, b)| a.name() == b.name())
            }
            _ => false,
        }
    }

    /// `source/path`, the full URL of the object (`#member` for a virtual file),
    /// for people to read: the key is shown verbatim, not URL-encoded, so it
    /// is not parsed back (reads resolve `source` and `path`).
    pub fn url(&self) -> String {
        let mut url = if self.source.is_empty() {
            self.path.clone()
        } else {
            format!("{}/{}", self.source.trim_end_matches('/'), self.path)
        };
        if let Some(m) = self.member() {
            url.push('#');
            url.push_str(&m.name);
        }
        url
    }

    /// The last segment of `path` (for a virtual file, of its parent; the
    /// member's own name is `member().name`).
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// A virtual file: `size` bytes at `offset` inside the object `parent`
    /// (a tar member, a byte range of a shard).
    pub fn member_of(parent: &File, name: &str, offset: u64, size: u64) -> File {
        let member = Member {
            name: name.to_string(),
            offset,
            parent_size: parent.size,
        };
        File {
            size,
            location: serde_json::to_string(&member).ok(),
            ..parent.clone()
        }
    }

    /// Where this virtual file lies in its parent object; `None` for whole objects.
    pub fn member(&self) -> Option<Member> {
        serde_json::from_str(self.location.as_deref()?).ok()
    }

    /// The whole object a virtual file lies in (itself for a whole object).
    pub fn parent(&self) -> File {
        match self.member() {
            Some(m) => File {
                size: m.parent_size,
                location: None,
                ..self.clone()
            },
            None => self.clone(),
        }
    }

    /// Reads the whole object.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the read; nothing is left behind.
    pub async fn read(&self) -> Result<Bytes, UdfError> {
        current_source()?.read(self).await
    }

    /// Reads `range` (byte offsets, end exclusive) of the object.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the read; nothing is left behind.
    pub async fn read_range(&self, range: Range<u64>) -> Result<Bytes, UdfError> {
        current_source()?.read_range(self, range).await
    }

    /// Reads the whole object as UTF-8 text.
    pub async fn read_text(&self) -> Result<String, UdfError> {
        let bytes = self.read().await?;
        String::from_utf8(bytes.to_vec()).map_err(|e| UdfError::Read {
            url: self.url(),
            source: Box::new(e),
        })
    }

    /// A path on local disk holding the object's bytes: a local directory's
    /// file itself, else a copy the engine already holds (prefetched or cached).
    pub fn local_path(&self) -> Option<PathBuf> {
        current_source().ok()?.local_path(self)
    }

    /// Opens the object for seekable streaming reads. A local copy is read from
    /// disk; otherwise bytes are fetched by range on demand, so reading a header
    /// of a large object transfers only about the header.
    pub async fn open(&self) -> Result<FileReader, UdfError> {
        let source = current_source()?;
        if let Some(bytes) = source.local_bytes(self) {
            return Ok(FileReader::Memory(std::io::Cursor::new(bytes)));
        }
        if let Some(path) = source.local_path(self) {
            let f = tokio::fs::File::open(&path)
                .await
                .map_err(|e| UdfError::Read {
                    url: self.url(),
                    source: Box::new(e),
                })?;
            return Ok(FileReader::Local(f));
        }
        // A file named by URL learns its size before reading by ranges.
        let file = match self.size_known() {
            true => self.clone(),
            false => source.stat(self).await?,
        };
        Ok(FileReader::Remote(RemoteReader {
            file,
            source,
            pos: 0,
            buf: Bytes::new(),
            buf_start: 0,
            chunk: MIN_CHUNK,
            pending: None,
        }))
    }
}

/// The `location` of a virtual file: `size` bytes at `offset` of the parent object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The member's name inside the parent (e.g. its path in a tar archive).
    pub name: String,
    /// Byte offset of the member's data in the parent.
    pub offset: u64,
    /// Size of the parent object.
    pub parent_size: u64,
}

/// Where a UDF's `File` reads come from. The engine implements it over object
/// stores and caches; tests and tools may implement it over anything.
#[async_trait]
pub trait FileSource: Send + Sync + Debug {
    /// Reads the whole object.
    async fn read(&self, file: &File) -> Result<Bytes, UdfError>;
    /// Reads a byte range of the object.
    async fn read_range(&self, file: &File, range: Range<u64>) -> Result<Bytes, UdfError>;
    /// `file` with what the store says of it now (size, etag, version,
    /// modification time) when its size is not known (a file named by URL
    /// before its first GET, see [`File::size_known`]); else `file` as it is.
    async fn stat(&self, file: &File) -> Result<File, UdfError> {
        Ok(file.clone())
    }
    /// The path of a complete local copy, if one exists now.
    fn local_path(&self, _file: &File) -> Option<PathBuf> {
        None
    }
    /// The bytes of a complete copy held in memory, if one exists now.
    fn local_bytes(&self, _file: &File) -> Option<Bytes> {
        None
    }
}

tokio::task_local! {
    static FILE_SOURCE: Arc<dyn FileSource>;
}

/// Runs `fut` with `source` serving every `File` read made inside it.
pub async fn with_file_source<F: Future>(source: Arc<dyn FileSource>, fut: F) -> F::Output {
    FILE_SOURCE.scope(source, fut).await
}

/// The source serving `File` reads here: the one [`with_file_source`] installed
/// around the running UDF call. For UDFs that hand reads to another thread (a
/// Python UDF's interpreter thread), which the task-local does not reach.
pub fn current_source() -> Result<Arc<dyn FileSource>, UdfError> {
    FILE_SOURCE
        .try_with(Arc::clone)
        .map_err(|_| UdfError::NoFileSource)
}

const MIN_CHUNK: u64 = 64 * 1024;
const MAX_CHUNK: u64 = 8 * 1024 * 1024;

/// A seekable async reader over a [`File`] (see [`File::open`]).
pub enum FileReader {
    /// A local copy (prefetched, cached, or a local file).
    Local(tokio::fs::File),
    /// Bytes held in memory (a small prefetched file).
    Memory(std::io::Cursor<Bytes>),
    /// Range reads from the store, pinned to the listed version.
    Remote(RemoteReader),
}

/// Reads a remote object by ranges: the first read fetches 64 KiB, each following
/// sequential read doubles the chunk up to 8 MiB; a seek resets it.
pub struct RemoteReader {
    file: File,
    source: Arc<dyn FileSource>,
    pos: u64,
    buf: Bytes,
    buf_start: u64,
    chunk: u64,
    pending: Option<BoxFuture<'static, Result<Bytes, UdfError>>>,
}

impl Debug for FileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(_) => f.write_str("FileReader::Local"),
            Self::Memory(_) => f.write_str("FileReader::Memory"),
            Self::Remote(r) => write!(f, "FileReader::Remote({})", r.file.url()),
        }
    }
}

impl AsyncRead for FileReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Local(f) => Pin::new(f).poll_read(cx, out),
            Self::Memory(c) => Pin::new(c).poll_read(cx, out),
            Self::Remote(r) => r.poll_read(cx, out),
        }
    }
}

impl AsyncSeek for FileReader {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> std::io::Result<()> {
        match self.get_mut() {
            Self::Local(f) => Pin::new(f).start_seek(position),
            Self::Memory(c) => Pin::new(c).start_seek(position),
            Self::Remote(r) => r.start_seek(position),
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        match self.get_mut() {
            Self::Local(f) => Pin::new(f).poll_complete(cx),
            Self::Memory(c) => Pin::new(c).poll_complete(cx),
            Self::Remote(r) => Poll::Ready(Ok(r.pos)),
        }
    }
}

impl RemoteReader {
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let buf_end = self.buf_start + self.buf.len() as u64;
            if self.pos >= self.buf_start && self.pos < buf_end {
                let off = (self.pos - self.buf_start) as usize;
                let n = out.remaining().min(self.buf.len() - off);
                out.put_slice(&self.buf[off..off + n]);
                self.pos += n as u64;
                return Poll::Ready(Ok(()));
            }
            if self.pos >= self.file.size {
                return Poll::Ready(Ok(()));
            }
            let fut = match &mut self.pending {
                Some(f) => f,
                None => {
                    if self.pos != buf_end {
                        self.chunk = MIN_CHUNK;
                    }
                    let end = (self.pos + self.chunk).min(self.file.size);
                    let (source, file, start) = (self.source.clone(), self.file.clone(), self.pos);
                    self.pending.insert(Box::pin(async move {
                        source.read_range(&file, start..end).await
                    }))
                }
            };
            let bytes = ready!(fut.as_mut().poll(cx)).map_err(std::io::Error::other)?;
            self.pending = None;
            self.chunk = (self.chunk * 2).min(MAX_CHUNK);
            if bytes.is_empty() {
                return Poll::Ready(Ok(()));
            }
            self.buf_start = self.pos;
            self.buf = bytes;
        }
    }

    fn start_seek(&mut self, position: SeekFrom) -> std::io::Result<()> {
        let new = match position {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.file.size.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = new.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start")
        })?;
        self.pending = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::StructArray;
    use datafusion::arrow::compute::cast;
    use proptest::prelude::*;

    fn column(files: &[Option<File>]) -> ArrayRef {
        let field = Field::new("file", File::data_type(), true);
        crate::encode_column(&field, files).expect("encode")
    }

    fn file() -> impl Strategy<Value = Option<File>> {
        let text = "[a-z/#% \u{e9}\u{1F600}]{0,12}";
        let opt = proptest::option::of(text);
        proptest::option::weighted(
            0.9,
            (text, text, any::<u64>(), opt.clone(), opt.clone()).prop_flat_map(
                move |(source, path, size, version, etag)| {
                    (proptest::option::of(any::<i64>()), opt.clone()).prop_map(
                        move |(last_modified, location)| File {
                            source: source.clone(),
                            path: path.clone(),
                            size,
                            version: version.clone(),
                            etag: etag.clone(),
                            last_modified,
                            location,
                        },
                    )
                },
            ),
        )
    }

    proptest! {
        /// The direct read gives what serde_arrow gives, for any Files and
        /// null rows, whole or sliced.
        #[test]
        fn decode_array_is_decode_column(files in proptest::collection::vec(file(), 0..20), cut in 0usize..4) {
            let array = column(&files);
            prop_assert!(File::decode_plain(&array).is_some());
            let direct = File::decode_array(&array).expect("direct");
            prop_assert_eq!(&direct, &crate::decode_column::<Option<File>>(&array).expect("serde"));
            prop_assert_eq!(&direct, &files);
            let start = cut.min(files.len());
            let sliced = array.slice(start, files.len() - start);
            prop_assert_eq!(File::decode_array(&sliced).expect("sliced"), files[start..].to_vec());
        }
    }

    /// Another layout of the same fields (view strings, as Parquet may give
    /// back) is read through serde_arrow, with the same result.
    #[test]
    fn other_layouts_fall_back_to_serde() {
        let files = vec![
            Some(File {
                source: "s3://b/p".into(),
                path: "a#b.txt".into(),
                size: 3,
                etag: Some("\"e\"".into()),
                ..File::default()
            }),
            None,
        ];
        let array = column(&files);
        let s = array.as_struct();
        let viewed: Vec<ArrayRef> = s
            .columns()
            .iter()
            .map(|c| match c.data_type() {
                DataType::Utf8 => cast(c, &DataType::Utf8View).expect("view"),
                _ => Arc::clone(c),
            })
            .collect();
        let fields: Fields = s
            .fields()
            .iter()
            .zip(&viewed)
            .map(|(f, c)| Field::new(f.name(), c.data_type().clone(), f.is_nullable()))
            .collect();
        let other: ArrayRef = Arc::new(StructArray::new(fields, viewed, s.nulls().cloned()));
        assert!(File::decode_plain(&other).is_none());
        assert_eq!(File::decode_array(&other).expect("serde"), files);
    }
}
