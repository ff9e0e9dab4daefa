//! [`Settings`]: DataChain-named knobs, set on a chain and captured by each UDF
//! added after them. Unset fields fall back to the chain's earlier settings,
//! then to the defaults documented on each getter. Set by name from text
//! (`SET`, `--set`), every value is checked against its range and every
//! refusal is one line saying what is accepted; no text makes it panic.
//!
//! Naming: each setting's builder method carries its DataChain name
//! (`Settings::new().prefetch(16)`, the spelling of every example), so its
//! getter is `get_prefetch()`: one name cannot be both in Rust, and the
//! standard library settles the same clash the same way
//! (`std::process::Command::current_dir` / `get_current_dir`). Renaming the
//! builders `with_*` to free the plain names for getters would trade the
//! API users write for the one they rarely read.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The share of the space available under the temp dir when a run starts
/// that prefetched files may take there, without `temp_dir_limit`.
pub const DEFAULT_TEMP_DIR_SHARE: f64 = 0.5;
/// `Settings::memory_file_limit` default: files up to 1 MiB are prefetched into memory.
pub const DEFAULT_MEMORY_FILE_LIMIT: u64 = 1 << 20;

/// Downloads in flight at once per prefetch operator, across its partitions,
/// unless `max_connections` says otherwise: where `prefetch = auto` stops
/// growing. 128 keeps 20 ms round trips of small objects near the best fixed
/// window (64 capped the default at 0.58 of prefetch 128 on the bench's A);
/// object stores serve far more parallel GETs than that.
pub const DEFAULT_MAX_CONNECTIONS: usize = 128;

/// The largest `prefetch` and `max_connections` `Settings::set` accepts.
pub const MAX_IN_FLIGHT: usize = 65_536;
/// The largest `parallel` and `workers` `Settings::set` accepts.
pub const MAX_PARALLEL: usize = 4_096;
/// The largest `batch_size` `Settings::set` accepts.
pub const MAX_BATCH_SIZE: usize = 1 << 24;

/// A byte size: a whole number with an optional `k`, `m`, `g` or `t` suffix
/// (powers of 1024, any case, an optional trailing `b` or `ib`: `512k`,
/// `64MB`, `512MiB`, `2g`); `None` for anything else or a size past `u64::MAX`.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let t = match t.strip_suffix('i') {
        Some(unit) if unit.ends_with(['k', 'm', 'g', 't']) => unit,
        _ => t,
    };
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'k')) => (&t[..i], 10),
        Some((i, 'm')) => (&t[..i], 20),
        Some((i, 'g')) => (&t[..i], 30),
        Some((i, 't')) => (&t[..i], 40),
        _ => (t, 0),
    };
    let n: u64 = num.trim().parse().ok()?;
    n.checked_mul(1 << shift)
}

/// `Settings::cluster_executor_timeout` default: how long a cluster job may
/// wait for an executor to register before it fails.
pub const DEFAULT_CLUSTER_EXECUTOR_TIMEOUT: Duration = Duration::from_secs(60);

/// A duration: `"500ms"`, `"30s"`, `"5m"`, `"2h"`, `"1d"`, or plain seconds
/// (`"10"`), above 0; an error saying what is accepted for anything else
/// (including a duration past `u64::MAX` milliseconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 30s, 5m, 2h, 1d)"))?;
    let per_unit: u64 = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s, m, h or d)"
            ));
        }
    };
    let ms = n
        .checked_mul(per_unit)
        .ok_or_else(|| format!("{text:?} is too long a duration"))?;
    if ms == 0 {
        return Err(format!("{text:?}: the interval must be > 0"));
    }
    Ok(Duration::from_millis(ms))
}

/// How many downloads run ahead of a UDF, per partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefetch {
    /// Exactly this many files in flight (0 disables prefetching).
    Fixed(usize),
    /// Adapt the in-flight count so the UDF never waits for data.
    Auto,
}

/// What a UDF error does to the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Fail the query; the error names the UDF and the file (default).
    #[default]
    Fail,
    /// Drop the row.
    Skip,
    /// Output null for the row.
    Null,
}

/// `checkpoints`: keep and reuse UDF results in saves, neither, or keep after
/// discarding what earlier runs kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checkpoints {
    On,
    Off,
    Fresh,
}

/// Settings of a chain. Builder style: `Settings::new().prefetch(16).parallel(4)`.
/// Its `Debug` output masks credential-like storage options.
#[derive(Clone, Default, PartialEq)]
#[must_use]
pub struct Settings {
    prefetch: Option<Prefetch>,
    cache: Option<bool>,
    cache_limit: Option<u64>,
    parallel: Option<usize>,
    workers: Option<usize>,
    batch_size: Option<usize>,
    ordered: Option<bool>,
    max_connections: Option<usize>,
    on_error: Option<OnError>,
    root: Option<PathBuf>,
    memory_limit: Option<usize>,
    memory_file_limit: Option<u64>,
    temp_dir_limit: Option<u64>,
    progress: Option<bool>,
    cluster: Option<String>,
    cluster_executor_timeout: Option<Duration>,
    checkpoints: Option<Checkpoints>,
    udf_version: Option<String>,
    delta_unsafe: Option<bool>,
    max_image_pixels: Option<u64>,
    storage_options: BTreeMap<String, String>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let options: BTreeMap<&str, &str> = self
            .storage_options
            .iter()
            .map(|(k, v)| {
                let shown = if crate::util::redact::is_secret_name(k) {
                    crate::util::redact::MASK
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("Settings")
            .field("prefetch", &self.prefetch)
            .field("cache", &self.cache)
            .field("cache_limit", &self.cache_limit)
            .field("parallel", &self.parallel)
            .field("workers", &self.workers)
            .field("batch_size", &self.batch_size)
            .field("ordered", &self.ordered)
            .field("max_connections", &self.max_connections)
            .field("on_error", &self.on_error)
            .field("root", &self.root)
            .field("memory_limit", &self.memory_limit)
            .field("memory_file_limit", &self.memory_file_limit)
            .field("temp_dir_limit", &self.temp_dir_limit)
            .field("progress", &self.progress)
            .field("cluster", &self.cluster)
            .field("cluster_executor_timeout", &self.cluster_executor_timeout)
            .field("checkpoints", &self.checkpoints)
            .field("udf_version", &self.udf_version)
            .field("delta_unsafe", &self.delta_unsafe)
            .field("max_image_pixels", &self.max_image_pixels)
            .field("storage_options", &options)
            .finish()
    }
}

impl Settings {
    /// The defaults (see docs/settings.md).
    pub fn new() -> Self {
        Self::default()
    }

    /// Exactly `n` files downloading ahead of each UDF per partition (0 = off).
    /// Without this the window adapts (`prefetch = auto`, the default).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(Prefetch::Fixed(n));
        self
    }

    /// Adaptive prefetch (the default): starts at 2 files per partition and
    /// grows while the UDF waits for downloads, within `max_connections` and
    /// the memory pool.
    pub fn prefetch_auto(mut self) -> Self {
        self.prefetch = Some(Prefetch::Auto);
        self
    }

    /// Keep downloaded files in the shared persistent cache (default false).
    pub fn cache(mut self, on: bool) -> Self {
        self.cache = Some(on);
        self
    }

    /// Size limit of the shared cache in bytes; least recently used entries
    /// are evicted past it (default: no limit).
    pub fn cache_limit(mut self, bytes: u64) -> Self {
        self.cache_limit = Some(bytes);
        self
    }

    /// UDF calls running at once per UDF (default: the number of cores).
    pub fn parallel(mut self, n: usize) -> Self {
        self.parallel = Some(n);
        self
    }

    /// Partitions each map, gen and batch_map UDF is spread over on a cluster
    /// (`cluster`, see `udfchain::cluster`; default 1); no effect locally.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self
    }

    /// Rows per `batch_map` call and per output batch of `gen` (default 1000).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = Some(n);
        self
    }

    /// Keep input order through UDFs (default true).
    pub fn ordered(mut self, on: bool) -> Self {
        self.ordered = Some(on);
        self
    }

    /// Global cap of concurrent downloads across partitions (default
    /// `DEFAULT_MAX_CONNECTIONS`, 128).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = Some(n);
        self
    }

    /// The largest file a prefetch keeps in memory instead of its temp dir
    /// (default 1 MiB; 0 = every file on disk). Held bytes are charged to the
    /// memory pool either way; a UDF asking for `File::local_path` of a file held
    /// in memory gets it written out first. `cache = true` always writes the cache.
    pub fn memory_file_limit(mut self, bytes: u64) -> Self {
        self.memory_file_limit = Some(bytes);
        self
    }

    /// `memory_file_limit`: files up to this size are prefetched into memory, not to disk.
    pub fn get_memory_file_limit(&self) -> u64 {
        self.memory_file_limit.unwrap_or(DEFAULT_MEMORY_FILE_LIMIT)
    }

    /// The bytes prefetched files may take on disk under the root's temp dir,
    /// across every prefetch of the process using that root (default: half
    /// of the space available there when a run starts). A file that does not
    /// fit beside the ones held is not copied: its UDF reads it from the
    /// store, streamed.
    pub fn temp_dir_limit(mut self, bytes: u64) -> Self {
        self.temp_dir_limit = Some(bytes);
        self
    }

    /// `temp_dir_limit` (`None`: the default share of the available space).
    pub fn get_temp_dir_limit(&self) -> Option<u64> {
        self.temp_dir_limit
    }

    /// What a UDF error does (default [`OnError::Fail`]).
    pub fn on_error(mut self, policy: OnError) -> Self {
        self.on_error = Some(policy);
        self
    }

    /// Root dir for caches, temp files and datasets (default `$UDFCHAIN_ROOT` or `./.udfchain`).
    pub fn root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root = Some(dir.into());
        self
    }

    /// Memory budget of a session's queries in bytes (DataFusion's memory pool);
    /// prefetched bytes are charged to it. Read when a `Session` is created.
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// `memory_limit`: the bytes the session's memory pool allows (`None`: no limit).
    pub fn get_memory_limit(&self) -> Option<usize> {
        self.memory_limit
    }

    /// A store option (object_store config key, e.g. `endpoint`, `region`,
    /// `allow_http`, `access_key_id`), applied when a store is first opened.
    /// Credential-like values (`secret_access_key`, tokens, account keys) are
    /// registered with udfchain's redaction, so no output echoes them.
    pub fn storage_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let (key, value) = (key.into(), value.into());
        crate::util::redact::register_option(&key, &value);
        self.storage_options.insert(key, value);
        self
    }

    /// The names `Settings::set` accepts (plus `storage.<option>`).
    pub const NAMES: &'static [&'static str] = &[
        "prefetch",
        "cache",
        "cache_limit",
        "parallel",
        "workers",
        "batch_size",
        "ordered",
        "max_connections",
        "on_error",
        "root",
        "memory_limit",
        "memory_file_limit",
        "temp_dir_limit",
        "progress",
        "cluster",
        "cluster_executor_timeout",
        "checkpoints",
        "delta_unsafe",
        "max_image_pixels",
    ];

    /// Sets a setting by name from text, as `SET name = value` in scripts and
    /// `--set name=value` on the command line do. Names ignore ASCII case;
    /// values are trimmed of whitespace (`root` and `storage.<option>` values
    /// are taken as given). A value out of range or an unknown name is an
    /// [`Error::Setting`](crate::Error::Setting) saying what is accepted (and
    /// the closest name); counts are bounded so that no setting can ask for
    /// more tasks, permits or rows than the engine can allocate.
    pub fn set(self, name: &str, value: &str) -> Result<Self, crate::Error> {
        let v = value.trim();
        let bad = |accepted: &str| crate::Error::Setting {
            name: name.to_string(),
            value: value.to_string(),
            reason: format!("must be {accepted}, got {v:?}"),
        };
        let count = |range: std::ops::RangeInclusive<usize>| {
            v.parse::<usize>()
                .ok()
                .filter(|n| range.contains(n))
                .ok_or_else(|| {
                    bad(&format!(
                        "a whole number from {} to {}",
                        range.start(),
                        range.end()
                    ))
                })
        };
        let size = |min: u64| {
            parse_size(v).filter(|&n| n >= min).ok_or_else(|| {
                let least = if min > 0 { " above 0" } else { "" };
                bad(&format!(
                    "a size in bytes{least} (e.g. 1048576, 512k, 64m, 2g)"
                ))
            })
        };
        let boolean = || match v.to_ascii_lowercase().as_str() {
            "true" | "on" | "1" | "yes" => Ok(true),
            "false" | "off" | "0" | "no" => Ok(false),
            _ => Err(bad("true or false (on/off, yes/no, 1/0)")),
        };
        let name_lc = name.to_ascii_lowercase();
        if let Some(option) = name_lc.strip_prefix("storage.") {
            if option.is_empty() {
                // Not echoed: a store option's value may be a credential.
                return Err(crate::Error::Setting {
                    name: name.to_string(),
                    value: String::new(),
                    reason: "needs an option name after the period, e.g. storage.region".into(),
                });
            }
            return Ok(self.storage_option(option, value));
        }
        Ok(match name_lc.as_str() {
            "prefetch" if v.eq_ignore_ascii_case("auto") => self.prefetch_auto(),
            "prefetch" => self.prefetch(count(0..=MAX_IN_FLIGHT).map_err(|_| {
                bad(&format!(
                    "a whole number from 0 to {MAX_IN_FLIGHT} or \"auto\""
                ))
            })?),
            "cache" => self.cache(boolean()?),
            "cache_limit" => self.cache_limit(size(0)?),
            "parallel" => self.parallel(count(1..=MAX_PARALLEL)?),
            "workers" => self.workers(count(1..=MAX_PARALLEL)?),
            "batch_size" => self.batch_size(count(1..=MAX_BATCH_SIZE)?),
            "ordered" => self.ordered(boolean()?),
            "max_connections" => self.max_connections(count(1..=MAX_IN_FLIGHT)?),
            "memory_limit" => self.memory_limit(
                usize::try_from(size(1)?)
                    .map_err(|_| bad("a size in bytes this machine can address"))?,
            ),
            "memory_file_limit" => self.memory_file_limit(size(0)?),
            "temp_dir_limit" => self.temp_dir_limit(size(0)?),
            "progress" => self.progress(boolean()?),
            "checkpoints" if v.eq_ignore_ascii_case("fresh") => self.fresh_checkpoints(),
            "checkpoints" => self.checkpoints(
                boolean()
                    .map_err(|_| bad("true, false or fresh (discard what earlier runs kept)"))?,
            ),
            "cluster" if v.is_empty() || v.eq_ignore_ascii_case("local") => Self {
                cluster: Some(String::new()),
                ..self
            },
            "cluster" => match v.strip_prefix("df://").and_then(|r| r.rsplit_once(':')) {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    self.cluster(v)
                }
                _ => return Err(bad("df://HOST:PORT, or local")),
            },
            "cluster_executor_timeout" => self.cluster_executor_timeout(
                parse_duration(v).map_err(|_| bad("a duration above 0 (e.g. 500ms, 30s, 5m)"))?,
            ),
            "delta_unsafe" => self.delta_unsafe(boolean()?),
            "max_image_pixels" => self.max_image_pixels(
                v.parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad("a whole number of pixels above 0"))?,
            ),
            "root" if v.is_empty() => return Err(bad("a directory")),
            "root" => self.root(value),
            "on_error" => self.on_error(match v.to_ascii_lowercase().as_str() {
                "fail" => OnError::Fail,
                "skip" => OnError::Skip,
                "null" => OnError::Null,
                _ => return Err(bad("fail, skip or null")),
            }),
            _ => {
                let hint = crate::util::closest(name, Self::NAMES.iter().copied())
                    .map(|c| format!(" (did you mean {c}?)"))
                    .unwrap_or_default();
                return Err(crate::Error::Setting {
                    name: name.to_string(),
                    value: value.to_string(),
                    reason: format!(
                        "is not a setting{hint}; settings are {} and storage.<option>",
                        Self::NAMES.join(", ")
                    ),
                });
            }
        })
    }

    /// Show the progress of runs (default off): a live display on stderr when
    /// stderr is a terminal and `CI` is unset, and a one-line summary on
    /// stderr after each run (also in pipes). See `crate::progress`.
    pub fn progress(mut self, on: bool) -> Self {
        self.progress = Some(on);
        self
    }

    /// `progress`: whether running plans show progress.
    pub fn get_progress(&self) -> bool {
        self.progress.unwrap_or(false)
    }

    /// Run on the Ballista cluster whose scheduler is at `url`
    /// (`df://host:port`); see `udfchain::cluster`.
    pub fn cluster(mut self, url: &str) -> Self {
        self.cluster = Some(url.to_string());
        self
    }

    /// The scheduler chains run on (`None`: locally, the default).
    pub fn get_cluster(&self) -> Option<&str> {
        self.cluster.as_deref().filter(|c| !c.is_empty())
    }

    /// How long a job on the cluster may wait for an executor while its
    /// scheduler has none registered (default
    /// `DEFAULT_CLUSTER_EXECUTOR_TIMEOUT`); then it fails saying so. Taken
    /// when the cluster session is made (`SET` it before `SET cluster`).
    pub fn cluster_executor_timeout(mut self, timeout: Duration) -> Self {
        self.cluster_executor_timeout = Some(timeout);
        self
    }

    /// `cluster.executor_timeout`: how long an executor may go silent before it is declared lost.
    pub fn get_cluster_executor_timeout(&self) -> Duration {
        self.cluster_executor_timeout
            .unwrap_or(DEFAULT_CLUSTER_EXECUTOR_TIMEOUT)
    }

    /// Let a delta save (`Chain::delta`, `read_storage(.., delta => ..)`) run
    /// steps whose rows over the new and changed files alone differ from their
    /// rows over all files (aggregates, joins, unions, distinct, limits, window
    /// functions, subqueries); refused by default, as DataChain's
    /// `delta_unsafe` does. See `chain/delta.rs`.
    pub fn delta_unsafe(mut self, on: bool) -> Self {
        self.delta_unsafe = Some(on);
        self
    }

    /// `delta_unsafe`: whether a delta save allows steps that are not row-local (default false).
    pub fn get_delta_unsafe(&self) -> bool {
        self.delta_unsafe.unwrap_or(false)
    }

    /// The most pixels an image may have to be decoded (default
    /// 178,956,970, Pillow's `Image.MAX_IMAGE_PIXELS`): a larger one, as its
    /// header says, is that row's error before any pixel buffer exists, so a
    /// decompression bomb never allocates. Applies to `image_decode`,
    /// `image_thumbnail` and the loader's `with_images`.
    pub fn max_image_pixels(mut self, pixels: u64) -> Self {
        self.max_image_pixels = Some(pixels);
        self
    }

    /// `max_image_pixels`: the pixel limit of decoded images.
    pub fn get_max_image_pixels(&self) -> u64 {
        self.max_image_pixels
            .unwrap_or(udfchain_udfs::builtins::image::MAX_IMAGE_PIXELS)
    }

    /// `other`'s set fields override `self`'s.
    pub fn merge(mut self, other: &Settings) -> Self {
        macro_rules! take {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f.clone(); } )* };
        }
        take!(
            prefetch,
            cache,
            cache_limit,
            parallel,
            workers,
            batch_size,
            ordered,
            max_connections,
            on_error,
            root,
            memory_limit,
            memory_file_limit,
            temp_dir_limit,
            progress,
            cluster,
            cluster_executor_timeout,
            checkpoints,
            udf_version,
            delta_unsafe,
            max_image_pixels
        );
        self.storage_options.extend(
            other
                .storage_options
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        self
    }

    /// Saves keep each UDF's results in a checkpoint as they complete, and a
    /// save run again after a crash or an error continues from them (default
    /// true; see `plan::memo`). `false` neither reads nor writes checkpoints.
    pub fn checkpoints(mut self, on: bool) -> Self {
        self.checkpoints = Some(if on {
            Checkpoints::On
        } else {
            Checkpoints::Off
        });
        self
    }

    /// `checkpoints = fresh` (`udfchain run --fresh`): a save discards what
    /// earlier runs of it kept, then keeps its own results as `true` does.
    pub fn fresh_checkpoints(mut self) -> Self {
        self.checkpoints = Some(Checkpoints::Fresh);
        self
    }

    /// `checkpoints`: whether saves keep and reuse UDF results.
    pub fn get_checkpoints(&self) -> bool {
        self.checkpoints != Some(Checkpoints::Off)
    }

    /// `checkpoints = fresh`: whether a save starts from nothing.
    pub fn get_fresh_checkpoints(&self) -> bool {
        self.checkpoints == Some(Checkpoints::Fresh)
    }

    /// The version of the UDFs added under these settings: part of what a
    /// checkpoint is keyed by, so a new version starts over (see
    /// [`Chain::version`](crate::Chain::version), which sets it for one UDF).
    pub fn udf_version(mut self, version: impl Into<String>) -> Self {
        self.udf_version = Some(version.into());
        self
    }

    /// `udf_version`, when set.
    pub fn get_udf_version(&self) -> Option<&str> {
        self.udf_version.as_deref()
    }

    /// `prefetch`: files downloaded ahead of each UDF.
    pub fn get_prefetch(&self) -> Prefetch {
        self.prefetch.unwrap_or(Prefetch::Auto)
    }

    /// `cache`: whether downloads go to the shared cache.
    pub fn get_cache(&self) -> bool {
        self.cache.unwrap_or(false)
    }

    /// `cache_limit`: the shared cache's size bound (`None`: unbounded).
    pub fn get_cache_limit(&self) -> Option<u64> {
        self.cache_limit
    }

    /// The shared cache dir: `<root>/cache`.
    pub fn cache_dir(&self) -> PathBuf {
        self.get_root().join("cache")
    }

    /// `parallel`: UDF calls at once per operator.
    pub fn get_parallel(&self) -> usize {
        self.parallel.unwrap_or_else(crate::runtime::cores).max(1)
    }

    /// These settings with `parallel = n` unless `parallel` was set.
    pub(crate) fn parallel_by_default(self, n: usize) -> Self {
        match self.parallel {
            Some(_) => self,
            None => self.parallel(n),
        }
    }

    /// `workers`: partitions per UDF on a cluster.
    pub fn get_workers(&self) -> usize {
        self.workers.unwrap_or(1).max(1)
    }

    /// `batch_size`: rows per batch_map call.
    pub fn get_batch_size(&self) -> usize {
        self.batch_size.unwrap_or(1000).max(1)
    }

    /// `ordered`: whether UDF operators keep the input order.
    pub fn get_ordered(&self) -> bool {
        self.ordered.unwrap_or(true)
    }

    /// `max_connections`: requests in flight per store.
    pub fn get_max_connections(&self) -> usize {
        self.max_connections
            .unwrap_or(DEFAULT_MAX_CONNECTIONS)
            .max(1)
    }

    /// `on_error`: what a failed UDF call does to its row.
    pub fn get_on_error(&self) -> OnError {
        self.on_error.unwrap_or_default()
    }

    /// `root`: the dir of datasets, caches and temp files.
    pub fn get_root(&self) -> PathBuf {
        self.root.clone().unwrap_or_else(|| {
            std::env::var_os("UDFCHAIN_ROOT")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(".udfchain"))
        })
    }

    /// The store options (`storage.*` settings).
    pub fn get_storage_options(&self) -> &BTreeMap<String, String> {
        &self.storage_options
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `Settings::NAMES`, the names `set` matches and the table of
    /// docs/settings.md are one list: every name is matched (no text makes
    /// it "not a setting") and has its row, and every row names a setting.
    #[test]
    fn names_the_set_match_and_the_settings_doc_agree() {
        for name in Settings::NAMES {
            if let Err(e) = Settings::new().set(name, "\u{1}") {
                assert!(
                    !e.to_string().contains("is not a setting"),
                    "{name} is in NAMES but set does not match it: {e}"
                );
            }
        }
        let doc = include_str!("../docs/settings.md");
        let rows: Vec<&str> = doc
            .split("| name | Rust builder |")
            .nth(1)
            .expect("the settings table")
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with("| `"))
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .collect();
        let mut want: Vec<&str> = Settings::NAMES.to_vec();
        want.push("storage.<option>");
        assert_eq!(rows, want, "docs/settings.md rows, in NAMES order");
    }

    fn refused(name: &str, value: &str) -> String {
        match Settings::new().set(name, value) {
            Err(e @ crate::Error::Setting { .. }) => e.to_string(),
            other => panic!("{name} = {value:?}: {other:?}"),
        }
    }

    #[test]
    fn refusals_say_what_is_accepted() {
        assert_eq!(
            refused("prefetch", "-1"),
            "prefetch must be a whole number from 0 to 65536 or \"auto\", got \"-1\""
        );
        assert_eq!(
            refused("batch_size", "0"),
            "batch_size must be a whole number from 1 to 16777216, got \"0\""
        );
        assert_eq!(
            refused("parallel", "99999999999999999999999"),
            "parallel must be a whole number from 1 to 4096, got \"99999999999999999999999\""
        );
        assert!(refused("cache", "maybe").contains("must be true or false"));
        assert!(refused("memory_limit", "0").contains("a size in bytes above 0"));
        assert!(refused("cache_limit", "20000000000g").contains("a size in bytes"));
        assert!(refused("on_error", "retry").contains("fail, skip or null"));
        let unknown = refused("prefech", "4");
        assert!(
            unknown.starts_with("prefech is not a setting (did you mean prefetch?)"),
            "{unknown}"
        );
        let storage = refused("storage.", "hunter2");
        assert!(!storage.contains("hunter2"), "{storage}");
        for msg in [unknown, storage, refused("root", " ")] {
            assert_eq!(msg.lines().count(), 1, "{msg}");
        }
    }

    #[test]
    fn accepted_values() {
        let s = Settings::new()
            .set("PREFETCH", " auto ")
            .and_then(|s| s.set("cache", "ON"))
            .and_then(|s| s.set("cache_limit", "2g"))
            .and_then(|s| s.set("memory_file_limit", "0"))
            .and_then(|s| s.set("storage.Region", " eu-west-1"))
            .expect("valid");
        assert_eq!(s.get_prefetch(), Prefetch::Auto);
        assert!(s.get_cache());
        assert_eq!(s.get_cache_limit(), Some(2 << 30));
        assert_eq!(s.get_memory_file_limit(), 0);
        assert_eq!(
            s.get_storage_options().get("region").map(String::as_str),
            Some(" eu-west-1")
        );
        assert_eq!(parse_size("64MB"), Some(64 << 20));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("2GB"), Some(2 << 30));
        assert_eq!(parse_size("3kib"), Some(3 << 10));
        assert_eq!(parse_size("3i"), None);
        assert_eq!(parse_size("1t"), Some(1 << 40));
        assert_eq!(parse_size("16777216t"), None, "overflow");
        assert_eq!(parse_size("k"), None);
        let s = Settings::new()
            .set("cluster_executor_timeout", "1500ms")
            .expect("valid");
        assert_eq!(
            s.get_cluster_executor_timeout(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            Settings::new().get_cluster_executor_timeout(),
            DEFAULT_CLUSTER_EXECUTOR_TIMEOUT
        );
        assert!(refused("cluster_executor_timeout", "0s").contains("a duration above 0"));
        let s = Settings::new()
            .set("max_image_pixels", "1000")
            .expect("valid");
        assert_eq!(s.get_max_image_pixels(), 1000);
        assert_eq!(Settings::new().get_max_image_pixels(), 178_956_970);
        assert!(refused("max_image_pixels", "0").contains("whole number of pixels"));
        assert!(refused("max_image_pixels", "1e6").contains("whole number of pixels"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("18446744073709551615d").is_err(), "overflow");
    }

    proptest! {
        #![proptest_config(crate::util::fuzz_cases())]

        /// Any name and value: a setting or a one-line refusal, never a panic.
        #[test]
        fn any_name_and_value(
            name in "\\PC{0,12}|(prefetch|cache|cache_limit|parallel|workers|batch_size|ordered|max_connections|on_error|root|memory_limit|memory_file_limit|cluster_executor_timeout|storage\\.[a-z]{0,5})",
            value in "\\PC{0,24}|-?[0-9]{1,22}[kKmMgGtT]?[bB]?",
        ) {
            match Settings::new().set(&name, &value) {
                Ok(_) => {}
                Err(crate::Error::Setting { name: n, value: v, reason }) => {
                    prop_assert_eq!(n, name.clone());
                    prop_assert!(v == value || (v.is_empty() && name.eq_ignore_ascii_case("storage.")));
                    prop_assert!(!reason.is_empty() && !reason.contains('\n'));
                }
                Err(e) => prop_assert!(false, "{:?}", e),
            }
        }

        /// Valid values written as text give the same settings as the builder.
        #[test]
        fn valid_values_round_trip(
            prefetch in 0..=MAX_IN_FLIGHT,
            parallel in 1..=MAX_PARALLEL,
            batch in 1..=MAX_BATCH_SIZE,
            conns in 1..=MAX_IN_FLIGHT,
            limit in any::<u64>(),
            flag in any::<bool>(),
            on_error in prop::sample::select(vec![OnError::Fail, OnError::Skip, OnError::Null]),
            root in "[^\\s]\\PC{0,20}",
            option in "[a-z_]{1,12}",
            option_value in "\\PC{0,20}",
        ) {
            let text = |n: &dyn std::fmt::Display| format!(" {n} ");
            let got = Settings::new()
                .set("prefetch", &text(&prefetch))
                .and_then(|s| s.set("parallel", &text(&parallel)))
                .and_then(|s| s.set("workers", &text(&parallel)))
                .and_then(|s| s.set("batch_size", &text(&batch)))
                .and_then(|s| s.set("max_connections", &text(&conns)))
                .and_then(|s| s.set("cache_limit", &text(&limit)))
                .and_then(|s| s.set("memory_file_limit", &text(&limit)))
                .and_then(|s| s.set("cache", &text(&flag)))
                .and_then(|s| s.set("ordered", &text(&flag)))
                .and_then(|s| s.set("on_error", &format!("{on_error:?}")))
                .and_then(|s| s.set("root", &root))
                .and_then(|s| s.set(&format!("storage.{option}"), &option_value));
            let want = Settings::new()
                .prefetch(prefetch)
                .parallel(parallel)
                .workers(parallel)
                .batch_size(batch)
                .max_connections(conns)
                .cache_limit(limit)
                .memory_file_limit(limit)
                .cache(flag)
                .ordered(flag)
                .on_error(on_error)
                .root(&root)
                .storage_option(option, option_value);
            prop_assert_eq!(got.ok(), Some(want));
            // Sizes with a suffix are the same bytes.
            let kib = limit >> 10;
            prop_assert_eq!(
                Settings::new().set("cache_limit", &format!("{kib}k")).ok(),
                Some(Settings::new().cache_limit(kib << 10))
            );
        }
    }
}
