//! Object stores from URIs, listing (`read_storage`), and the [`FileSource`] UDFs read through.
//!
//! A URI is a local path (`data/`, `/abs/dir`), `file://`, `memory://`, `s3://`,
//! `gs://`, `az://`/`abfs://` or `http(s)://`. Stores are kept in DataFusion's
//! object store registry keyed by scheme and host; one not registered yet is opened
//! from the `AWS_*`/`GOOGLE_*`/`AZURE_*` environment plus the chain's
//! `storage_option`s, so any S3-compatible server works.
//!
//! [`FileSource`]: udfchain_udfs::FileSource

mod download;
mod listing;
pub mod source;

pub use download::{Downloaded, download_bytes, download_to, is_transient};
pub use listing::{ListingExec, StorageTable};
pub use source::StoreSource;

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::object_store::ObjectStore;
use datafusion::object_store::path::Path;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::memory::InMemory;
use url::Url;

use crate::error::{Error, Result};

/// A parsed storage URI: which store, and which prefix inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// `scheme://host`, the registry key of the store.
    pub store_url: Url,
    /// The prefix inside the store (no leading or trailing slash).
    pub prefix: Path,
    /// `store_url` + `/` + `prefix`: the `source` of listed files.
    pub source: String,
}

impl Location {
    /// Parses a URI or local path. A local path must exist.
    pub fn parse(uri: &str) -> Result<Self> {
        Self::parse_with(uri, true)
    }

    /// Parses a URI or local path to write to (a local path need not exist).
    pub fn parse_output(uri: &str) -> Result<Self> {
        Self::parse_with(uri, false)
    }

    fn parse_with(uri: &str, must_exist: bool) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidUri {
            uri: crate::util::redact::redact(uri).into_owned(),
            reason: reason.to_string(),
        };
        if uri.trim().is_empty() {
            return Err(invalid("empty URI"));
        }
        let url = match Url::parse(uri) {
            Ok(url) if url.scheme().len() > 1 => url,
            // No scheme (or a Windows drive letter): a local path.
            _ => {
                let path = std::path::absolute(uri).map_err(|e| invalid(&e.to_string()))?;
                if must_exist && !path.exists() {
                    return Err(invalid("no such file or directory"));
                }
                Url::from_file_path(&path).map_err(|_| invalid("not an absolute path"))?
            }
        };
        match url.scheme() {
            "file" | "memory" | "s3" | "s3a" | "gs" | "az" | "abfs" | "abfss" | "http"
            | "https" => {}
            other => {
                return Err(invalid(&format!(
                    "unsupported scheme {other}:// (use a path, file://, memory://, s3://, gs://, az:// or http(s)://)"
                )));
            }
        }
        if matches!(url.scheme(), "s3" | "s3a" | "gs" | "az" | "abfs" | "abfss")
            && url.host_str().unwrap_or("").is_empty()
        {
            return Err(invalid("missing bucket or container name"));
        }
        let prefix = Path::from_url_path(url.path()).map_err(|e| invalid(&e.to_string()))?;
        let mut store_url = url.clone();
        store_url.set_path("/");
        store_url.set_query(None);
        store_url.set_fragment(None);
        let _ = store_url.set_password(None);
        let _ = store_url.set_username("");
        let source = format!("{}{}", store_url.as_str(), prefix.as_ref());
        Ok(Self {
            store_url,
            prefix,
            source,
        })
    }

    /// The location of `file.source` (already a store URL plus prefix).
    pub fn of_source(source: &str) -> Result<Self> {
        Self::parse(source)
    }

    /// The object path of `relative` below this location's prefix.
    pub fn child(&self, relative: &str) -> Path {
        if self.prefix.as_ref().is_empty() {
            Path::from(relative)
        } else {
            Path::from(format!("{}/{}", self.prefix.as_ref(), relative))
        }
    }
}

/// Returns the store for `loc`, opening and registering it on first use.
pub fn open_store(
    env: &RuntimeEnv,
    loc: &Location,
    options: &BTreeMap<String, String>,
) -> Result<Arc<dyn ObjectStore>> {
    if let Ok(store) = env.object_store_registry.get_store(&loc.store_url) {
        return Ok(store);
    }
    let store = build_store(loc, options)?;
    env.register_object_store(&loc.store_url, Arc::clone(&store));
    Ok(store)
}

fn build_store(loc: &Location, options: &BTreeMap<String, String>) -> Result<Arc<dyn ObjectStore>> {
    let url = loc.store_url.as_str();
    let err = |e: object_store::Error| Error::Storage {
        url: url.to_string(),
        source: Arc::new(e),
    };
    let bad_option = |k: &str| Error::Plan(format!("unknown storage option {k:?} for {url}"));
    let store: Arc<dyn ObjectStore> = match loc.store_url.scheme() {
        "memory" => Arc::new(InMemory::new()),
        "s3" | "s3a" => {
            let mut b = AmazonS3Builder::from_env().with_url(url);
            for (k, v) in options {
                b = b.with_config(k.parse().map_err(|_| bad_option(k))?, v);
            }
            Arc::new(b.build().map_err(err)?)
        }
        "gs" => {
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url);
            for (k, v) in options {
                b = b.with_config(k.parse().map_err(|_| bad_option(k))?, v);
            }
            Arc::new(b.build().map_err(err)?)
        }
        "az" | "abfs" | "abfss" => {
            let mut b = MicrosoftAzureBuilder::from_env().with_url(url);
            for (k, v) in options {
                b = b.with_config(k.parse().map_err(|_| bad_option(k))?, v);
            }
            Arc::new(b.build().map_err(err)?)
        }
        "http" | "https" => Arc::new(HttpBuilder::new().with_url(url).build().map_err(err)?),
        "file" => Arc::new(object_store::local::LocalFileSystem::new()),
        other => {
            return Err(Error::InvalidUri {
                uri: url.to_string(),
                reason: format!("unsupported scheme {other}"),
            });
        }
    };
    Ok(store)
}
