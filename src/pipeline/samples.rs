//! Samples from storage: the files under the pipeline's URI (+ glob), listed
//! with udfchain's listing (local, `s3://`, `memory://`, ...), read with the
//! configured format into (index in file, timestamp, label[, feature]).
//!
//! Guarantees:
//! - New data = files whose path was never ingested and whose timestamp (mtime,
//!   whole seconds) is >= the watermark, the largest file timestamp ingested so
//!   far (Modyn's storage semantics). A file sharing the watermark's timestamp
//!   with files already ingested is new if its path is; those files are never
//!   read again. A file that appears later with an older timestamp is ignored.
//! - The bytes read are the version listed (pinned by version or etag through
//!   `storage::download`); a label file (`single_sample` with `label_file_ext`)
//!   is read as it is when the sample is ingested.
//! - Every bad input names the file: a label that is not an integer, a CSV row
//!   without the label column, a binary file whose size is not a multiple of
//!   `record_size`.

use std::sync::Arc;

use datafusion::object_store::{ObjectStore, ObjectStoreExt};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pipeline::config::{
    BinaryFormat, ByteOrder, CsvFormat, DataConfig, Format, TimestampSource,
};
use crate::session::Session;
use crate::storage::Location;
use crate::udfs::File;

/// Files read at once while ingesting.
const READ_AHEAD: usize = 16;

/// One sample read from a file, before it has a key.
#[derive(Clone, Debug, PartialEq)]
pub struct RawSample {
    /// The sample's position inside its file, from 0.
    pub index: u64,
    pub timestamp: i64,
    pub label: i64,
    /// The features the trigger asked for: a csv column, or what a
    /// [`FeatureFn`] made of the sample's bytes.
    pub feature: Option<Vec<f32>>,
}

/// A trigger's embedding UDF (`feature: {udf: "name"}`): the sample's bytes ->
/// its features. The bytes are the file (single_sample), the record after its
/// label (binary), or the CSV row's fields joined by the separator (csv). An
/// `Err` names what is wrong with the sample; it stops the ingest.
pub type FeatureFn = Arc<dyn Fn(&[u8]) -> std::result::Result<Vec<f32>, String> + Send + Sync>;

/// Where the features of a sample come from.
#[derive(Clone)]
pub enum Features {
    /// A numeric CSV column.
    Column(usize),
    /// A Rust embedding function.
    Udf(FeatureFn),
}

impl Features {
    fn of(&self, bytes: &[u8]) -> std::result::Result<Vec<f32>, String> {
        match self {
            Self::Udf(f) => f(bytes),
            Self::Column(c) => Err(format!("feature column {c} needs the csv format")),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Listed {
    file: File,
}

/// A file's timestamp: its last-modified time in whole seconds.
pub fn file_timestamp(file: &File) -> Result<i64> {
    file.last_modified
        .map(|ms| ms.div_euclid(1000))
        .ok_or_else(|| Error::Storage {
            url: format!("{}/{}", file.source.trim_end_matches('/'), file.path),
            source: Arc::new(std::io::Error::other(
                "the store reports no last-modified time (use timestamp: {column: N})",
            )),
        })
}

/// The files under the config's URI matching its glob, label files left out.
pub async fn list(session: &Arc<Session>, data: &DataConfig) -> Result<Vec<File>> {
    // A listing every poll: no progress display or summary line for it.
    let mut chain = session.from_storage(&data.uri).progress(false);
    if let Some(g) = &data.glob {
        chain = chain.glob(g);
    }
    let rows: Vec<Listed> = chain.to_rows().await?;
    let label_ext = match &data.format {
        Format::SingleSample(s) => s.label_file_ext.clone(),
        _ => None,
    };
    let mut files: Vec<File> = rows
        .into_iter()
        .map(|r| r.file)
        .filter(|f| {
            !label_ext
                .as_ref()
                .is_some_and(|e| f.path.ends_with(e.as_str()))
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// Reads the samples of every file, `READ_AHEAD` at a time, in `files` order.
pub async fn read_all(
    session: &Arc<Session>,
    data: &DataConfig,
    files: &[File],
    features: Option<Features>,
) -> Result<Vec<Vec<RawSample>>> {
    let store = session.store(&data.uri)?;
    // Owned values in the futures: a borrowing closure here makes the
    // caller's future not `Send` (a higher-ranked lifetime error in spawn).
    let data = Arc::new(data.clone());
    futures::stream::iter(files.iter().cloned().map(move |f| {
        let (store, data, features) = (Arc::clone(&store), Arc::clone(&data), features.clone());
        async move { read_samples(&store, &data, &f, features.as_ref()).await }
    }))
    .buffered(READ_AHEAD)
    .try_collect()
    .await
}

/// The samples of one file.
pub async fn read_samples(
    store: &Arc<dyn ObjectStore>,
    data: &DataConfig,
    file: &File,
    features: Option<&Features>,
) -> Result<Vec<RawSample>> {
    let mtime = file_timestamp(file);
    let name = || format!("{}/{}", file.source.trim_end_matches('/'), file.path);
    let bad = |reason: String| Error::Storage {
        url: name(),
        source: Arc::new(std::io::Error::new(std::io::ErrorKind::InvalidData, reason)),
    };
    match &data.format {
        Format::SingleSample(s) => {
            let label = match &s.label_file_ext {
                Some(ext) => {
                    let label_path = sibling(&file.path, ext);
                    let bytes = get(store, file, &label_path).await?;
                    let text = String::from_utf8_lossy(&bytes);
                    text.trim().parse::<i64>().map_err(|_| {
                        bad(format!(
                            "label file {label_path} holds {:?}, not an integer",
                            text.trim()
                        ))
                    })?
                }
                None => parent_label(&file.path).ok_or_else(|| {
                    bad(
                        "no label_file_ext and the parent dir's name is not an integer label"
                            .into(),
                    )
                })?,
            };
            let feature = match features {
                Some(f) => Some(f.of(&download(store, file).await?).map_err(bad)?),
                None => None,
            };
            Ok(vec![RawSample {
                index: 0,
                timestamp: mtime?,
                label,
                feature,
            }])
        }
        Format::Csv(c) => {
            let bytes = download(store, file).await?;
            parse_csv(&bytes, c, &data.timestamp, mtime, features).map_err(bad)
        }
        Format::Binary(b) => {
            let bytes = download(store, file).await?;
            parse_binary(&bytes, b, mtime?, features).map_err(bad)
        }
    }
}

/// `dir/a.png` with extension `.label` -> `dir/a.label` (the last extension
/// replaced; a name without one gets `ext` appended).
pub fn sibling(path: &str, ext: &str) -> String {
    let (dir, name) = match path.rfind('/') {
        Some(i) => (&path[..=i], &path[i + 1..]),
        None => ("", path),
    };
    let stem = match name.rfind('.') {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    };
    let ext = if ext.starts_with('.') {
        ext.to_string()
    } else {
        format!(".{ext}")
    };
    format!("{dir}{stem}{ext}")
}

/// The integer name of a path's parent dir (`3/a.png` -> 3).
pub fn parent_label(path: &str) -> Option<i64> {
    let dir = &path[..path.rfind('/')?];
    dir.rsplit('/').next()?.trim().parse().ok()
}

async fn download(store: &Arc<dyn ObjectStore>, file: &File) -> Result<bytes::Bytes> {
    let loc = Location::of_source(&file.source)?;
    let path = loc.child(&file.path)?;
    let (bytes, _) = crate::storage::download_bytes(store, &path, file).await?;
    Ok(bytes)
}

/// A whole object next to `file` (not listed: read as it is now).
async fn get(store: &Arc<dyn ObjectStore>, file: &File, relative: &str) -> Result<bytes::Bytes> {
    let loc = Location::of_source(&file.source)?;
    let path = loc.child(relative)?;
    let err = |e: datafusion::object_store::Error| Error::Storage {
        url: format!("{}/{relative}", file.source.trim_end_matches('/')),
        source: Arc::new(e),
    };
    store
        .get(&path)
        .await
        .map_err(err)?
        .bytes()
        .await
        .map_err(err)
}

/// CSV rows -> samples (index = the row's position after the header).
pub fn parse_csv(
    bytes: &[u8],
    c: &CsvFormat,
    ts: &TimestampSource,
    mtime: Result<i64>,
    features: Option<&Features>,
) -> std::result::Result<Vec<RawSample>, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(c.header)
        .flexible(true)
        .delimiter(c.separator.map(|s| s as u8).unwrap_or(b','))
        .from_reader(bytes);
    // The file's timestamp, used by every row unless a column gives one.
    let mtime = match ts {
        TimestampSource::Mtime => mtime.map_err(|e| e.to_string())?,
        TimestampSource::Column(_) => 0,
    };
    let mut out = Vec::new();
    for (index, record) in reader.records().enumerate() {
        let record = record.map_err(|e| format!("CSV row {index}: {e}"))?;
        let field = |col: usize, what: &str| -> std::result::Result<&str, String> {
            record.get(col).map(str::trim).ok_or_else(|| {
                format!(
                    "CSV row {index} has {} columns, no {what} column {col}",
                    record.len()
                )
            })
        };
        let int = |col: usize, what: &str| -> std::result::Result<i64, String> {
            let v = field(col, what)?;
            v.parse::<i64>().map_err(|_| {
                format!("CSV row {index}: {what} column {col} is {v:?}, not an integer")
            })
        };
        let label = int(c.label_column, "label")?;
        let timestamp = match ts {
            TimestampSource::Mtime => mtime,
            TimestampSource::Column(col) => int(*col, "timestamp")?,
        };
        let feature = match features {
            Some(Features::Column(col)) => {
                let v = field(*col, "feature")?;
                Some(vec![v.parse::<f32>().map_err(|_| {
                    format!("CSV row {index}: feature column {col} is {v:?}, not a number")
                })?])
            }
            Some(f) => {
                let sep = c.separator.unwrap_or(',').to_string();
                let row = record.iter().collect::<Vec<_>>().join(&sep);
                Some(
                    f.of(row.as_bytes())
                        .map_err(|e| format!("CSV row {index}: {e}"))?,
                )
            }
            None => None,
        };
        out.push(RawSample {
            index: index as u64,
            timestamp,
            label,
            feature,
        });
    }
    Ok(out)
}

/// Fixed-size records -> samples: label first (`label_size` bytes, unsigned,
/// `byte_order`), then the sample's bytes.
pub fn parse_binary(
    bytes: &[u8],
    b: &BinaryFormat,
    timestamp: i64,
    features: Option<&Features>,
) -> std::result::Result<Vec<RawSample>, String> {
    if !bytes.len().is_multiple_of(b.record_size) {
        return Err(format!(
            "size {} is not a multiple of record_size {}",
            bytes.len(),
            b.record_size
        ));
    }
    bytes
        .chunks_exact(b.record_size)
        .enumerate()
        .map(|(i, rec)| {
            let raw = &rec[..b.label_size];
            let mut buf = [0u8; 8];
            let label = match b.byte_order {
                ByteOrder::Little => {
                    buf[..raw.len()].copy_from_slice(raw);
                    u64::from_le_bytes(buf)
                }
                ByteOrder::Big => {
                    buf[8 - raw.len()..].copy_from_slice(raw);
                    u64::from_be_bytes(buf)
                }
            };
            let feature = match features {
                Some(f) => Some(
                    f.of(&rec[b.label_size..])
                        .map_err(|e| format!("record {i}: {e}"))?,
                ),
                None => None,
            };
            Ok(RawSample {
                index: i as u64,
                timestamp,
                label: label as i64,
                feature,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_and_parent_labels() {
        assert_eq!(sibling("d/a.png", ".label"), "d/a.label");
        assert_eq!(sibling("a.tar.gz", "label"), "a.tar.label");
        assert_eq!(sibling("noext", ".label"), "noext.label");
        assert_eq!(sibling(".hidden", ".label"), ".hidden.label");
        assert_eq!(parent_label("x/7/a.png"), Some(7));
        assert_eq!(parent_label("a.png"), None);
        assert_eq!(parent_label("cat/a.png"), None);
    }

    #[test]
    fn binary_labels_in_both_byte_orders() {
        let bytes = [1u8, 0, 0, 0, 9, 9, 9, 9, 0, 0, 1, 2, 8, 8, 8, 8];
        let little = BinaryFormat {
            record_size: 8,
            label_size: 4,
            byte_order: ByteOrder::Little,
        };
        let s = parse_binary(&bytes, &little, 5, None).expect("parse");
        assert_eq!(
            s.iter().map(|s| s.label).collect::<Vec<_>>(),
            [1, 0x0201_0000]
        );
        assert_eq!(s[1].index, 1);
        let big = BinaryFormat {
            byte_order: ByteOrder::Big,
            ..little.clone()
        };
        let s = parse_binary(&bytes, &big, 5, None).expect("parse");
        assert_eq!(
            s.iter().map(|s| s.label).collect::<Vec<_>>(),
            [0x0100_0000, 0x0102]
        );
        assert!(parse_binary(&bytes[..7], &little, 5, None).is_err());
    }

    #[test]
    fn csv_rows_with_header_and_timestamp_column() {
        let text = b"x,label,ts\n0.5,1,100\n1.5,0,101\n";
        let c = CsvFormat {
            label_column: 1,
            header: true,
            separator: None,
        };
        let s = parse_csv(
            text,
            &c,
            &TimestampSource::Column(2),
            Ok(7),
            Some(&Features::Column(0)),
        )
        .expect("parse");
        assert_eq!(
            s,
            vec![
                RawSample {
                    index: 0,
                    timestamp: 100,
                    label: 1,
                    feature: Some(vec![0.5])
                },
                RawSample {
                    index: 1,
                    timestamp: 101,
                    label: 0,
                    feature: Some(vec![1.5])
                },
            ]
        );
        let no_header = CsvFormat {
            header: false,
            ..c.clone()
        };
        let err =
            parse_csv(b"1\n", &no_header, &TimestampSource::Mtime, Ok(7), None).expect_err("short");
        assert!(err.contains("no label column 1"), "{err}");
    }
}
