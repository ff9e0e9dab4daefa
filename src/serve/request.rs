//! The JSON command a Flight client puts in a `get_flight_info` descriptor.
//!
//! Guarantees: a request is parsed strictly (unknown fields are errors, serde
//! `deny_unknown_fields`) and checked before any data is read — every
//! out-of-range value is a [`RequestError`] naming the field, the value and the
//! accepted range. Every field but `dataset` is optional; the defaults are the
//! latest version, [`DEFAULT_PARTITION_ROWS`] rows per partition, no shuffle, one
//! rank and one worker, all columns.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use udfchain_udfs::builtins::image::{MAX_SIDE, Mode};

use crate::loader::{DEFAULT_PARTITION_ROWS, Loader};

/// The largest `partition_rows`, `prefetch_partitions` and `parallel_requests`
/// accepted (a typo such as 1e12 rows must not reserve the machine).
pub const MAX_PARTITION_ROWS: usize = 100_000_000;
/// The most partitions a request may ask to be read ahead.
pub const MAX_PREFETCH_PARTITIONS: usize = 1024;
/// The most partition requests one client may have in flight.
pub const MAX_PARALLEL_REQUESTS: usize = 64;
/// The largest `world_size` and `num_workers`.
pub const MAX_CONSUMERS: usize = 1 << 16;
/// The range of `max_message_bytes`: from 1 KiB (a message per few rows) to
/// 64 MiB (a partition of tens of MB in one message; a message's size changes
/// only its header count, its body is the partition's buffers either way).
pub const MESSAGE_BYTES_RANGE: (usize, usize) = (1024, 64 << 20);

/// A request's `with_images`: which File column, into which column, at
/// which size and mode (defaults `file`, `image`, 224 x 224, `RGB`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesRequest {
    /// The File column (default `file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The output column (default `image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<String>,
    /// `[width, height]`, 1..=65,535 each (default `[224, 224]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<[u32; 2]>,
    /// `L`, `RGB` or `RGBA` (default `RGB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

impl ImagesRequest {
    /// (file column, output column, (width, height), mode), checked.
    fn resolved(&self) -> Result<(String, String, (u32, u32), Mode), RequestError> {
        let file = self.file.clone().unwrap_or_else(|| "file".into());
        let out = self.out.clone().unwrap_or_else(|| "image".into());
        if file.is_empty() || out.is_empty() {
            return Err(RequestError(
                "with_images needs a non-empty file column and output column".into(),
            ));
        }
        let [width, height] = self.size.unwrap_or([224, 224]);
        let max = MAX_SIDE as usize;
        range("with_images size: width", width as usize, 1, max)?;
        range("with_images size: height", height as usize, 1, max)?;
        let mode = Mode::parse(self.mode.as_deref().unwrap_or("RGB")).map_err(|_| {
            RequestError(format!(
                "with_images mode must be \"L\", \"RGB\" or \"RGBA\", got {:?}",
                self.mode.as_deref().unwrap_or_default()
            ))
        })?;
        Ok((file, out, (width, height), mode))
    }
}

/// What to serve: `{"dataset": "name", "version": 1, "partition_rows": 1000,
/// "shuffle": true, "seed": 7, "epoch": 0, "rank": 0, "world_size": 1,
/// "worker": 0, "num_workers": 1, "columns": ["a"], "with_bytes": {"file":
/// "data"}, "with_images": {"file": "file", "size": [224, 224]},
/// "prefetch_partitions": 2, "parallel_requests": 1,
/// "max_message_bytes": 2097152}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlightRequest {
    /// The dataset's name (required).
    pub dataset: String,
    /// The version (default: latest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// Rows per partition, 1..=[`MAX_PARTITION_ROWS`] (default [`DEFAULT_PARTITION_ROWS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_rows: Option<usize>,
    /// Shuffle partition order and rows inside partitions (default false).
    #[serde(default)]
    pub shuffle: bool,
    /// The shuffle seed (default 0); only with `shuffle: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The epoch (default 0): with shuffle, each epoch has its own order.
    #[serde(default)]
    pub epoch: u64,
    /// This trainer's rank, `< world_size` (default 0).
    #[serde(default)]
    pub rank: usize,
    /// Trainers sharing the epoch, 1..=[`MAX_CONSUMERS`] (default 1).
    #[serde(default = "one")]
    pub world_size: usize,
    /// This data-loader worker, `< max(num_workers, 1)` (default 0).
    #[serde(default)]
    pub worker: usize,
    /// Data-loader workers per rank, 0..=[`MAX_CONSUMERS`] (default 1; 0 = no
    /// worker split, as PyTorch's loading in the main process).
    #[serde(default = "one")]
    pub num_workers: usize,
    /// The columns to serve (default all), at least one, no duplicates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
    /// `{"file_column": "out_column"}`: add the bytes of each row's File as a
    /// binary column (one pair).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with_bytes: Option<BTreeMap<String, String>>,
    /// Add each row's File decoded as an image: `{"file": "file", "out":
    /// "image", "size": [224, 224], "mode": "RGB"}`, every field optional
    /// (those defaults), as the loader's `with_images` (a fixed-shape uint8
    /// tensor column `[H, W, C]`, decoded on the server's cores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with_images: Option<ImagesRequest>,
    /// Partitions the server reads ahead of this client, 0..=[`MAX_PREFETCH_PARTITIONS`]
    /// (default: the server's `--prefetch-partitions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch_partitions: Option<usize>,
    /// Partitions fetched at once for this client, 1..=[`MAX_PARALLEL_REQUESTS`]
    /// (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_requests: Option<usize>,
    /// The most bytes of Arrow data in one `do_get` message, in
    /// [`MESSAGE_BYTES_RANGE`] (default [`super::default_message_bytes`]: 2 MiB,
    /// under the 4 MiB every gRPC library accepts by default, or 16 MiB for
    /// Arrow's C++ client, pyarrow's, which accepts any size and reads faster
    /// with fewer messages: a partition of 8 MB whole). A single row larger
    /// than this still goes as one message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<usize>,
}

fn one() -> usize {
    1
}

/// A request that cannot be served as written; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError(pub String);

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RequestError {}

fn range(field: &str, value: usize, lo: usize, hi: usize) -> Result<(), RequestError> {
    if value < lo || value > hi {
        return Err(RequestError(format!(
            "{field} must be in {lo}..={hi}, got {value}"
        )));
    }
    Ok(())
}

impl FlightRequest {
    /// Parses and checks a descriptor's command bytes.
    pub fn parse(cmd: &[u8]) -> Result<Self, RequestError> {
        let req: Self = serde_json::from_slice(cmd).map_err(|e| {
            RequestError(format!(
                "the descriptor's command must be a JSON request such as \
                 {{\"dataset\": \"name\", \"partition_rows\": 1000}}: {e}"
            ))
        })?;
        req.check()?;
        Ok(req)
    }

    /// Checks every field's range and the fields' consistency.
    pub fn check(&self) -> Result<(), RequestError> {
        if self.dataset.trim().is_empty() {
            return Err(RequestError("dataset must name a dataset".into()));
        }
        if let Some(n) = self.partition_rows {
            range("partition_rows", n, 1, MAX_PARTITION_ROWS)?;
        }
        range("world_size", self.world_size, 1, MAX_CONSUMERS)?;
        if self.rank >= self.world_size {
            return Err(RequestError(format!(
                "rank must be < world_size ({}), got {}",
                self.world_size, self.rank
            )));
        }
        range("num_workers", self.num_workers, 0, MAX_CONSUMERS)?;
        if self.worker >= self.num_workers.max(1) {
            return Err(RequestError(format!(
                "worker must be < num_workers ({}; 0 workers allow only worker 0), got {}",
                self.num_workers, self.worker
            )));
        }
        if self.seed.is_some() && !self.shuffle {
            return Err(RequestError(
                "seed is only used with \"shuffle\": true; add it or drop seed".into(),
            ));
        }
        if let Some(cols) = &self.columns {
            if cols.is_empty() {
                return Err(RequestError(
                    "columns must name at least one column (omit it for all)".into(),
                ));
            }
            let mut seen = std::collections::HashSet::new();
            if let Some(dup) = cols.iter().find(|c| !seen.insert(c.as_str())) {
                return Err(RequestError(format!("columns lists {dup:?} twice")));
            }
        }
        if let Some(wb) = &self.with_bytes {
            if wb.len() != 1 {
                return Err(RequestError(format!(
                    "with_bytes takes one {{\"file_column\": \"out_column\"}} pair, got {}",
                    wb.len()
                )));
            }
            if wb.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
                return Err(RequestError(
                    "with_bytes needs a non-empty file column and output column".into(),
                ));
            }
        }
        if let Some(images) = &self.with_images {
            images.resolved()?;
        }
        if let Some(k) = self.prefetch_partitions {
            range("prefetch_partitions", k, 0, MAX_PREFETCH_PARTITIONS)?;
        }
        if let Some(p) = self.parallel_requests {
            range("parallel_requests", p, 1, MAX_PARALLEL_REQUESTS)?;
        }
        if let Some(b) = self.max_message_bytes {
            let (lo, hi) = MESSAGE_BYTES_RANGE;
            range("max_message_bytes", b, lo, hi)?;
        }
        Ok(())
    }

    /// The loader this request describes (partitions, order and split; the
    /// read-ahead is the server's, so the loader's own prefetch is unused).
    pub fn loader(&self) -> Loader {
        let mut l = match self.version {
            Some(v) => Loader::from_dataset_version(&self.dataset, v),
            None => Loader::from_dataset(&self.dataset),
        }
        .partition_rows(self.partition_rows.unwrap_or(DEFAULT_PARTITION_ROWS))
        .shard(self.rank, self.world_size)
        .worker(self.worker, self.num_workers);
        if self.shuffle {
            l = l.shuffle(self.seed.unwrap_or(0));
        }
        if let Some(cols) = &self.columns {
            l = l.columns(cols.iter().cloned());
        }
        if let Some((file, out)) = self.with_bytes.as_ref().and_then(|m| m.iter().next()) {
            l = l.with_bytes(file, out);
        }
        if let Some(Ok((file, out, size, mode))) = self.with_images.as_ref().map(|i| i.resolved()) {
            l = l.with_images(&file, &out, size, mode);
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        FlightRequest::parse(json.as_bytes())
            .expect_err("rejected")
            .to_string()
    }

    #[test]
    fn defaults_fill_every_optional_field() {
        let r = FlightRequest::parse(br#"{"dataset": "d"}"#).expect("parse");
        assert_eq!(r.version, None);
        assert_eq!(
            (r.rank, r.world_size, r.worker, r.num_workers),
            (0, 1, 0, 1)
        );
        assert!(!r.shuffle && r.columns.is_none() && r.with_bytes.is_none());
        assert_eq!(r.epoch, 0);
        assert_eq!(r.max_message_bytes, None);
    }

    #[test]
    fn the_issue_example_parses() {
        let r = FlightRequest::parse(
            br#"{"dataset": "name", "version": 1, "partition_rows": 1000, "shuffle": true,
            "seed": 7, "epoch": 0, "rank": 0, "world_size": 1, "worker": 0, "num_workers": 1,
            "columns": ["a", "b"], "with_bytes": {"file": "data"}}"#,
        )
        .expect("parse");
        assert_eq!(r.seed, Some(7));
        assert_eq!(r.with_bytes.expect("wb")["file"], "data");
    }

    #[test]
    fn with_images_defaults_and_bounds() {
        let r = FlightRequest::parse(br#"{"dataset": "d", "with_images": {}}"#).expect("parse");
        let spec = r
            .with_images
            .expect("with_images")
            .resolved()
            .expect("valid");
        assert_eq!(spec, ("file".into(), "image".into(), (224, 224), Mode::Rgb));
        let r = FlightRequest::parse(
            br#"{"dataset": "d", "with_images": {"file": "f", "out": "x", "size": [32, 16], "mode": "L"}}"#,
        )
        .expect("parse");
        let spec = r
            .with_images
            .expect("with_images")
            .resolved()
            .expect("valid");
        assert_eq!(spec, ("f".into(), "x".into(), (32, 16), Mode::L));
        assert!(
            err(r#"{"dataset": "d", "with_images": {"size": [224, 70000]}}"#)
                .contains("height must be in 1..=65535, got 70000")
        );
        assert!(
            err(r#"{"dataset": "d", "with_images": {"mode": "P"}}"#).contains("with_images mode")
        );
        assert!(err(r#"{"dataset": "d", "with_images": {"file": ""}}"#).contains("non-empty"));
        assert!(
            err(r#"{"dataset": "d", "with_images": {"size": [1]}}"#)
                .contains("expected an array of length 2")
        );
    }

    #[test]
    fn bad_requests_name_the_field() {
        assert!(err(r#"{"dataset": "d", "rnak": 1}"#).contains("unknown field `rnak`"));
        assert!(err(r#"{"rank": 1}"#).contains("missing field `dataset`"));
        assert!(
            err(r#"{"dataset": "d", "rank": 2, "world_size": 2}"#)
                .contains("rank must be < world_size (2), got 2")
        );
        assert!(
            err(r#"{"dataset": "d", "worker": 1, "num_workers": 0}"#)
                .contains("worker must be < num_workers")
        );
        assert!(
            err(r#"{"dataset": "d", "partition_rows": 0}"#)
                .contains("partition_rows must be in 1..=")
        );
        assert!(err(r#"{"dataset": "d", "world_size": 0}"#).contains("world_size must be in 1..="));
        assert!(err(r#"{"dataset": "d", "seed": 3}"#).contains("shuffle"));
        assert!(err(r#"{"dataset": "d", "columns": []}"#).contains("at least one"));
        assert!(err(r#"{"dataset": "d", "columns": ["a", "a"]}"#).contains("\"a\" twice"));
        assert!(err(r#"{"dataset": "d", "with_bytes": {}}"#).contains("one"));
        assert!(err(r#"{"dataset": "d", "parallel_requests": 0}"#).contains("parallel_requests"));
        for b in [0, 1023, (64 << 20) + 1] {
            let json = format!(r#"{{"dataset": "d", "max_message_bytes": {b}}}"#);
            assert!(
                err(&json).contains(&format!(
                    "max_message_bytes must be in 1024..=67108864, got {b}"
                )),
                "{json}"
            );
        }
        assert!(err(r#"{"dataset": "d", "rank": -1}"#).contains("invalid value"));
        assert!(err("not json").contains("JSON request"));
        assert!(err(r#"{"dataset": " "}"#).contains("dataset"));
    }
}
