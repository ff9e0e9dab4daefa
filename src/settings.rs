//! [`Settings`]: DataChain-named knobs, set on a chain and captured by each UDF
//! added after them. Unset fields fall back to the chain's earlier settings,
//! then to the defaults documented on each getter.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// `Settings::memory_file_limit` default: files up to 1 MiB are prefetched into memory.
pub const DEFAULT_MEMORY_FILE_LIMIT: u64 = 1 << 20;

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
            .field("storage_options", &options)
            .finish()
    }
}

impl Settings {
    pub fn new() -> Self {
        Self::default()
    }

    /// Files downloading ahead of each UDF per partition (default 2; 0 = off).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(Prefetch::Fixed(n));
        self
    }

    /// Adaptive prefetch.
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

    /// Distributed workers (accepted for DataChain compatibility; runs are local).
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

    /// Global cap of concurrent downloads across partitions (default 64).
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

    pub fn get_memory_file_limit(&self) -> u64 {
        self.memory_file_limit.unwrap_or(DEFAULT_MEMORY_FILE_LIMIT)
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

    pub fn get_memory_limit(&self) -> Option<usize> {
        self.memory_limit
    }

    /// A store option (object_store config key, e.g. `endpoint`, `region`,
    /// `allow_http`, `access_key_id`), applied when a store is first opened.
    /// Credential-like values (`secret_access_key`, tokens, account keys) are
    /// registered with [`redact`](crate::util::redact), so no output echoes them.
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
    ];

    /// Sets a setting by name from text, as `SET name = value` in scripts and
    /// `--set name=value` on the command line do.
    pub fn set(self, name: &str, value: &str) -> Result<Self, crate::Error> {
        let value = value.trim().trim_matches('\'').trim_matches('"');
        let bad = |what: &str| {
            crate::Error::Plan(format!("setting {name}: expected {what}, got {value:?}"))
        };
        let int = || value.parse::<usize>().map_err(|_| bad("a whole number"));
        let boolean = || match value.to_ascii_lowercase().as_str() {
            "true" | "on" | "1" | "yes" => Ok(true),
            "false" | "off" | "0" | "no" => Ok(false),
            _ => Err(bad("true or false")),
        };
        let name_lc = name.to_ascii_lowercase();
        if let Some(option) = name_lc.strip_prefix("storage.") {
            return Ok(self.storage_option(option, value));
        }
        Ok(match name_lc.as_str() {
            "prefetch" if value.eq_ignore_ascii_case("auto") => self.prefetch_auto(),
            "prefetch" => self.prefetch(int()?),
            "cache" => self.cache(boolean()?),
            "cache_limit" => self.cache_limit(int()? as u64),
            "parallel" => self.parallel(int()?),
            "workers" => self.workers(int()?),
            "batch_size" => self.batch_size(int()?),
            "ordered" => self.ordered(boolean()?),
            "max_connections" => self.max_connections(int()?),
            "memory_limit" => self.memory_limit(int()?),
            "memory_file_limit" => self.memory_file_limit(int()? as u64),
            "root" => self.root(value),
            "on_error" => self.on_error(match value.to_ascii_lowercase().as_str() {
                "fail" => OnError::Fail,
                "skip" => OnError::Skip,
                "null" => OnError::Null,
                _ => return Err(bad("fail, skip or null")),
            }),
            _ => {
                let hint = crate::util::closest(name, Self::NAMES.iter().copied())
                    .map(|c| format!(" (did you mean {c}?)"))
                    .unwrap_or_default();
                return Err(crate::Error::Plan(format!(
                    "unknown setting {name:?}{hint}"
                )));
            }
        })
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
            memory_file_limit
        );
        self.storage_options.extend(
            other
                .storage_options
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        self
    }

    pub fn get_prefetch(&self) -> Prefetch {
        self.prefetch.unwrap_or(Prefetch::Fixed(2))
    }

    pub fn get_cache(&self) -> bool {
        self.cache.unwrap_or(false)
    }

    pub fn get_cache_limit(&self) -> Option<u64> {
        self.cache_limit
    }

    /// The shared cache dir: `<root>/cache`.
    pub fn cache_dir(&self) -> PathBuf {
        self.get_root().join("cache")
    }

    pub fn get_parallel(&self) -> usize {
        self.parallel.unwrap_or_else(crate::runtime::cores).max(1)
    }

    pub fn get_workers(&self) -> usize {
        self.workers.unwrap_or(1).max(1)
    }

    pub fn get_batch_size(&self) -> usize {
        self.batch_size.unwrap_or(1000).max(1)
    }

    pub fn get_ordered(&self) -> bool {
        self.ordered.unwrap_or(true)
    }

    pub fn get_max_connections(&self) -> usize {
        self.max_connections.unwrap_or(64).max(1)
    }

    pub fn get_on_error(&self) -> OnError {
        self.on_error.unwrap_or_default()
    }

    pub fn get_root(&self) -> PathBuf {
        self.root.clone().unwrap_or_else(|| {
            std::env::var_os("UDFCHAIN_ROOT")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(".udfchain"))
        })
    }

    pub fn get_storage_options(&self) -> &BTreeMap<String, String> {
        &self.storage_options
    }
}
