//! Object stores from URIs, listing (`read_storage`), and downloads pinned to the
//! listed version. (The [`FileSource`] UDFs read through, which prefers local
//! copies, is `cache::StoreSource`, one layer up.)
//!
//! A URI is a local path (`data/`, `/abs/dir`), `file://`, `memory://`, `s3://`,
//! `gs://`, `az://`/`abfs://` or `http(s)://`. Stores are kept in DataFusion's
//! object store registry keyed by scheme and host; one not registered yet is opened
//! from the `AWS_*`/`GOOGLE_*`/`AZURE_*` environment plus the chain's
//! `storage_option`s, so any S3-compatible server works; an `http://`
//! endpoint the user gives allows plain HTTP unless they set `allow_http`,
//! and a store's bare "builder error" is [`explain`]ed (which setting to set).
//! An `http(s)://` store asks a plain server once where its answer will not
//! change (`plain_http`: a 501, no WebDAV for listing, no `Range` for part
//! reads) and says what the server lacks.
//!
//! First-run mistakes fail at once with one line saying what to do: S3 without
//! credentials (none configured and no instance metadata endpoint answering:
//! which settings or variables to set, [`NoCredentials`], not a minute of
//! metadata retries), a bucket that does not exist ([`explain_at`]: at which
//! endpoint), credentials the server rejects (which settings to check), a
//! local path that does not exist (relative to which directory, and the
//! closest existing name), an access key id without its secret (or the
//! reverse) and an unknown storage option (the closest known one).
//!
//! Keys round-trip: a listed file's `source` is `scheme://host/` plus the
//! prefix verbatim and its `path` the rest of the key verbatim;
//! [`Location::of_source`] and [`Location::child`] turn them back into the
//! exact key (no percent-encoding or decoding), whatever it holds (`% # ? [ ]
//! { } +`, spaces, non-ASCII, `..x`).
//!
//! [`FileSource`]: udfchain_udfs::FileSource

mod download;
mod listing;
mod plain_http;

pub use download::{Changed, Downloaded, Pin, download_bytes, download_to, is_transient};
pub use listing::{ListingExec, StorageTable, file_schema};

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::object_store::ObjectStore;
use datafusion::object_store::path::Path;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::memory::InMemory;
use object_store::{ClientConfigKey, ClientOptions};
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
                    return Err(invalid(&missing_path(uri)));
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
        // Dropping them would list another prefix than the one written.
        if url.query().is_some() || url.fragment().is_some() {
            return Err(invalid(
                "'?' and '#' in a URI start a query or fragment: write them as %3F and %23 \
                 (or give a local path)",
            ));
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

    /// The location of `file.source`: `scheme://host/` followed by the prefix
    /// verbatim, as [`Location::source`] wrote it. Not URL-decoded: a listed
    /// prefix `a%41#b` stays `a%41#b` (a source that is not `scheme://...`,
    /// e.g. a path typed by a user, is parsed as [`Location::parse`] does).
    pub fn of_source(source: &str) -> Result<Self> {
        let Some((scheme, rest)) = source.split_once("://") else {
            return Self::parse(source);
        };
        if scheme.len() < 2 || !scheme.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Self::parse(source);
        }
        let (authority, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let store = Self::parse(&format!("{scheme}://{authority}/"))?;
        let prefix = Path::parse(prefix).map_err(|e| Error::InvalidUri {
            uri: source.to_string(),
            reason: e.to_string(),
        })?;
        let source = format!("{}{}", store.store_url.as_str(), prefix.as_ref());
        Ok(Self {
            store_url: store.store_url,
            prefix,
            source,
        })
    }

    /// The object path of `relative` (a listed file's `path`: the store's key
    /// below this prefix) below this location's prefix. The key is taken
    /// verbatim, never re-encoded, so `c#d.txt` names the object `c#d.txt`.
    pub fn child(&self, relative: &str) -> Result<Path> {
        let key = join_key(self.prefix.as_ref(), relative);
        Path::parse(&key).map_err(|e| Error::InvalidUri {
            uri: format!("{}/{relative}", self.source.trim_end_matches('/')),
            reason: e.to_string(),
        })
    }
}

/// Opens the store of `uri`, a source about to be planned: a plain local path
/// that does not exist fails here (see [`check_local_path`]); a glob or a URL
/// is left to the listing.
pub fn open_source(env: &RuntimeEnv, uri: &str, options: &BTreeMap<String, String>) -> Result<()> {
    check_local_path(uri)?;
    if let Ok(loc) = Location::parse(uri) {
        open_store(env, &loc, options)?;
    }
    Ok(())
}

/// An error when `uri` is a local path (no scheme, no glob characters) that
/// does not exist, saying where it was looked for ([`missing_path`]); `Ok` for
/// anything else (URLs and globs are checked by whoever opens them).
pub fn check_local_path(uri: &str) -> Result<()> {
    let is_url = Url::parse(uri).is_ok_and(|u| u.scheme().len() > 1);
    if is_url || uri.contains(['*', '?', '[', '{']) || uri.trim().is_empty() {
        return Ok(());
    }
    match std::path::absolute(uri) {
        Ok(p) if !p.exists() => Err(Error::InvalidUri {
            uri: crate::util::redact::redact(uri).into_owned(),
            reason: missing_path(uri),
        }),
        _ => Ok(()),
    }
}

/// Why local path `uri` does not exist: relative to which directory, and the
/// path with its first missing part replaced by the closest existing name.
pub fn missing_path(uri: &str) -> String {
    let typed = std::path::Path::new(uri);
    let base = if typed.is_relative() {
        std::env::current_dir().ok()
    } else {
        None
    };
    let mut msg = "no such file or directory".to_string();
    if let Some(dir) = &base {
        msg.push_str(&format!(
            " (relative to the current directory {})",
            dir.display()
        ));
    }
    // The first missing component, and the closest name in its parent.
    let mut have = std::path::PathBuf::new();
    for part in typed.components() {
        let next = have.join(part);
        let full = base
            .as_ref()
            .map_or_else(|| next.clone(), |b| b.join(&next));
        if !full.exists() {
            let parent = base
                .as_ref()
                .map_or_else(|| have.clone(), |b| b.join(&have));
            let names: Vec<String> = std::fs::read_dir(&parent)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            let name = part.as_os_str().to_string_lossy();
            if let Some(close) = crate::util::closest(&name, names.iter().map(String::as_str)) {
                msg.push_str(&format!(
                    "; did you mean {:?}?",
                    have.join(close).display().to_string()
                ));
            }
            break;
        }
        have = next;
    }
    msg
}

/// `prefix/relative` (either may be empty), the object key of a listed file.
fn join_key(prefix: &str, relative: &str) -> String {
    match (prefix.is_empty(), relative.is_empty()) {
        (true, _) => relative.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}/{relative}"),
    }
}

/// A store error with one line on what to do where the store's message does
/// not say it: reqwest's bare "builder error" is a plain `http://` URL with
/// `allow_http` off.
#[derive(Debug)]
pub struct Explained {
    source: object_store::Error,
    hint: &'static str,
}

impl std::fmt::Display for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.source, self.hint)
    }
}

impl std::error::Error for Explained {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// `e` as an error source, with [`Explained`]'s hint where one applies; a
/// failed credential lookup is the [`NoCredentials`] it carries.
pub fn explain(e: object_store::Error) -> Box<dyn std::error::Error + Send + Sync> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(c) = cause {
        if let Some(none) = c.downcast_ref::<NoCredentials>() {
            return Box::new(none.clone());
        }
        cause = c.source();
    }
    if e.to_string().contains("builder error") {
        return Box::new(Explained {
            source: e,
            hint: "a plain http:// endpoint or URL needs storage.allow_http=true",
        });
    }
    Box::new(e)
}

/// [`explain`], and for S3 what the server's error code means: a bucket that
/// does not exist (`NoSuchBucket`) is [`NoSuchBucket`] (which bucket, at which
/// endpoint); credentials it rejects (`SignatureDoesNotMatch`, an unknown key
/// id: `InvalidAccessKeyId` on AWS, `NotSignedUp` on s3s) are [`Rejected`]
/// (which settings to check).
pub fn explain_at(
    e: object_store::Error,
    loc: &Location,
    options: &BTreeMap<String, String>,
) -> Box<dyn std::error::Error + Send + Sync> {
    if !matches!(loc.store_url.scheme(), "s3" | "s3a") {
        return explain(e);
    }
    let text = e.to_string();
    if text.contains("NoSuchBucket") {
        return Box::new(NoSuchBucket {
            bucket: loc.store_url.host_str().unwrap_or_default().to_string(),
            endpoint: s3_endpoint(loc, options),
            source: e,
        });
    }
    if let Some(code) = ["SignatureDoesNotMatch", "InvalidAccessKeyId", "NotSignedUp"]
        .into_iter()
        .find(|c| text.contains(c))
    {
        return Box::new(Rejected {
            endpoint: s3_endpoint(loc, options),
            code,
            source: e,
        });
    }
    explain(e)
}

/// The endpoint `loc`'s S3 store talks to (without user or password): the
/// configured one, else AWS's for the region.
fn s3_endpoint(loc: &Location, options: &BTreeMap<String, String>) -> String {
    let mut b = AmazonS3Builder::from_env().with_url(loc.store_url.as_str());
    for (k, v) in options {
        if let Ok(key) = k.parse::<AmazonS3ConfigKey>() {
            b = b.with_config(key, v);
        }
    }
    b.get_config_value(&AmazonS3ConfigKey::Endpoint)
        .and_then(|e| Url::parse(&e).ok())
        .map(|mut u| {
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.as_str().trim_end_matches('/').to_string()
        })
        .unwrap_or_else(|| {
            let region = b
                .get_config_value(&AmazonS3ConfigKey::Region)
                .unwrap_or_else(|| "us-east-1".into());
            format!("https://s3.{region}.amazonaws.com")
        })
}

/// Credentials the S3 server rejected.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server at {endpoint} rejected the credentials ({code}): check \
     storage.access_key_id and storage.secret_access_key \
     (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
)]
pub struct Rejected {
    endpoint: String,
    code: &'static str,
    #[source]
    source: object_store::Error,
}

/// A bucket the store's server does not have.
#[derive(Debug, thiserror::Error)]
#[error(
    "bucket {bucket} does not exist at {endpoint} (check the bucket name, or \
     storage.endpoint / AWS_ENDPOINT for another server)"
)]
pub struct NoSuchBucket {
    bucket: String,
    endpoint: String,
    #[source]
    source: object_store::Error,
}

/// S3 without credentials: none configured and no instance metadata endpoint
/// answering. Says which settings or environment variables to set.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "no credentials for {url}: set storage.access_key_id and storage.secret_access_key \
     (--set or SET), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
     (storage.skip_signature=true for a public bucket)"
)]
pub struct NoCredentials {
    url: String,
}

/// The instance metadata credentials object_store falls back to when nothing
/// else is configured, asked only once its endpoint accepts a connection: where
/// none answers (any machine outside a cloud), every request fails at once
/// with [`NoCredentials`] instead of after a minute of retried connects.
#[derive(Debug)]
struct InstanceCredentials {
    url: String,
    metadata: String,
    inner: object_store::aws::AwsCredentialProvider,
    reachable: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl object_store::CredentialProvider for InstanceCredentials {
    type Credential = object_store::aws::AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<Self::Credential>> {
        use std::sync::atomic::Ordering;
        if !self.reachable.load(Ordering::Relaxed) {
            let metadata = self.metadata.clone();
            // object_store's own connect timeout for the metadata endpoint.
            let connects = tokio::task::spawn_blocking(move || {
                let url = Url::parse(&metadata).ok()?;
                let addr = std::net::ToSocketAddrs::to_socket_addrs(&(
                    url.host_str()?.trim_matches(['[', ']']),
                    url.port_or_known_default()?,
                ))
                .ok()?
                .next()?;
                std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)).ok()
            })
            .await
            .ok()
            .flatten()
            .is_some();
            if !connects {
                return Err(object_store::Error::Generic {
                    store: "S3",
                    source: Box::new(NoCredentials {
                        url: self.url.clone(),
                    }),
                });
            }
            self.reachable.store(true, Ordering::Relaxed);
        }
        self.inner.get_credential().await
    }
}

/// The storage options a first run usually means (the closest is suggested
/// for an unknown one); every object_store config key is accepted.
const STORAGE_OPTIONS: [&str; 12] = [
    "endpoint",
    "region",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "allow_http",
    "virtual_hosted_style_request",
    "skip_signature",
    "metadata_endpoint",
    "service_account_path",
    "account_name",
    "access_key",
];

/// An access key id without its secret, or a secret without its id: which
/// one is missing, instead of the store's bare "Missing SecretAccessKey".
fn half_a_key(b: &AmazonS3Builder, url: &str) -> Result<()> {
    let id = b
        .get_config_value(&AmazonS3ConfigKey::AccessKeyId)
        .is_some();
    let secret = b
        .get_config_value(&AmazonS3ConfigKey::SecretAccessKey)
        .is_some();
    let (have, missing, var) = match (id, secret) {
        (true, false) => (
            "storage.access_key_id",
            "storage.secret_access_key",
            "AWS_SECRET_ACCESS_KEY",
        ),
        (false, true) => (
            "storage.secret_access_key",
            "storage.access_key_id",
            "AWS_ACCESS_KEY_ID",
        ),
        _ => return Ok(()),
    };
    Err(Error::Plan(format!(
        "{url} has {have} (or its AWS_* variable) but no {missing}: set {missing} or {var}"
    )))
}

/// Whether `b` would fall back to instance metadata credentials (nothing
/// else configured, requests signed).
fn uses_instance_credentials(b: &AmazonS3Builder) -> bool {
    let set = |k: AmazonS3ConfigKey| b.get_config_value(&k).is_some();
    !(set(AmazonS3ConfigKey::AccessKeyId)
        || set(AmazonS3ConfigKey::SecretAccessKey)
        || (set(AmazonS3ConfigKey::WebIdentityTokenFile) && set(AmazonS3ConfigKey::RoleArn))
        || set(AmazonS3ConfigKey::ContainerCredentialsRelativeUri)
        || (set(AmazonS3ConfigKey::ContainerCredentialsFullUri)
            && set(AmazonS3ConfigKey::ContainerAuthorizationTokenFile))
        || b.get_config_value(&AmazonS3ConfigKey::SkipSignature)
            .is_some_and(|v| v.eq_ignore_ascii_case("true")))
}

/// An `http://` endpoint the user gave means plain HTTP: `allow_http` is
/// turned on unless the user set it. Set to false with an `http://` endpoint,
/// every request would fail with a bare "builder error"; say what to change.
fn s3_plain_http(b: AmazonS3Builder, allow_http_set: bool) -> Result<AmazonS3Builder> {
    let endpoint = [AmazonS3ConfigKey::Endpoint, AmazonS3ConfigKey::S3Endpoint]
        .iter()
        .filter_map(|k| b.get_config_value(k))
        .find(|e| {
            e.get(..7)
                .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
        });
    let Some(endpoint) = endpoint else {
        return Ok(b);
    };
    if !allow_http_set {
        return Ok(b.with_allow_http(true));
    }
    let allowed = b
        .get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
        .is_some_and(|v| {
            matches!(
                v.to_ascii_lowercase().as_str(),
                "1" | "true" | "on" | "yes" | "y"
            )
        });
    if allowed {
        return Ok(b);
    }
    // Never echo credentials written into the endpoint URL.
    let endpoint = match Url::parse(&endpoint) {
        Ok(mut u) => {
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.to_string()
        }
        Err(_) => "the endpoint".to_string(),
    };
    Err(Error::Plan(format!(
        "storage endpoint {endpoint} is plain http:// but allow_http is off: \
         remove the allow_http setting (or set storage.allow_http=true, AWS_ALLOW_HTTP=true), \
         or use an https:// endpoint"
    )))
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
    let bad_option = |k: &str| {
        let hint = crate::util::closest(k, STORAGE_OPTIONS)
            .map(|c| format!(" (did you mean {c}?)"))
            .unwrap_or_default();
        Error::Plan(format!("unknown storage option {k:?} for {url}{hint}"))
    };
    let store: Arc<dyn ObjectStore> = match loc.store_url.scheme() {
        "memory" => Arc::new(InMemory::new()),
        "s3" | "s3a" => {
            let mut b = AmazonS3Builder::from_env().with_url(url);
            let mut allow_http_set = std::env::var_os("AWS_ALLOW_HTTP").is_some();
            for (k, v) in options {
                let key: AmazonS3ConfigKey = k.parse().map_err(|_| bad_option(k))?;
                allow_http_set |= key == AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp);
                b = b.with_config(key, v);
            }
            let b = s3_plain_http(b, allow_http_set)?;
            half_a_key(&b, url)?;
            if uses_instance_credentials(&b) {
                let inner = b.clone().build().map_err(err)?;
                let metadata = b
                    .get_config_value(&AmazonS3ConfigKey::MetadataEndpoint)
                    .unwrap_or_else(|| "http://169.254.169.254".into());
                let creds = InstanceCredentials {
                    url: url.to_string(),
                    metadata,
                    inner: Arc::clone(inner.credentials()),
                    reachable: Default::default(),
                };
                Arc::new(b.with_credentials(Arc::new(creds)).build().map_err(err)?)
            } else {
                Arc::new(b.build().map_err(err)?)
            }
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
        // An http:// URI is a plain-HTTP server by the user's own choice.
        // Permanent answers of plain servers are not retried (see `plain_http`).
        "http" | "https" => Arc::new(
            HttpBuilder::new()
                .with_url(url)
                .with_http_connector(plain_http::PlainHttp)
                .with_client_options(
                    ClientOptions::new().with_allow_http(loc.store_url.scheme() == "http"),
                )
                .build()
                .map_err(err)?,
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_keeps_the_listed_key_verbatim() {
        let loc = Location::parse("s3://bucket/pre").expect("parse");
        for key in [
            "c#d.txt",
            "pct%41",
            "sp ace",
            "日本/é",
            "a..b",
            "..x",
            "{b}[a]+?",
        ] {
            let path = loc.child(key).expect("child");
            assert_eq!(path.as_ref(), format!("pre/{key}"));
        }
        let root = Location::parse("memory://m/").expect("parse");
        assert_eq!(root.child("x#y").expect("child").as_ref(), "x#y");
        // Not an object key: empty or dot segments.
        assert!(loc.child("a//b").is_err());
        assert!(loc.child("a/../b").is_err());
    }

    #[test]
    fn a_bare_builder_error_says_which_setting_to_change() {
        let e = object_store::Error::Generic {
            store: "S3",
            source: "Error performing GET http://127.0.0.1:1/b - HTTP error: builder error".into(),
        };
        let msg = explain(e).to_string();
        assert!(msg.contains("storage.allow_http=true"), "{msg}");
        let e = object_store::Error::Generic {
            store: "S3",
            source: "connection refused".into(),
        };
        assert!(!explain(e).to_string().contains("allow_http"));
    }

    #[test]
    fn instance_credentials_only_when_nothing_else_is_configured() {
        let b = || AmazonS3Builder::new().with_bucket_name("b");
        assert!(uses_instance_credentials(&b()));
        assert!(!uses_instance_credentials(
            &b().with_access_key_id("k").with_secret_access_key("s")
        ));
        assert!(!uses_instance_credentials(&b().with_skip_signature(true)));
        assert!(!uses_instance_credentials(&b().with_config(
            AmazonS3ConfigKey::ContainerCredentialsRelativeUri,
            "/creds"
        )));
        // A role ARN without its token file is not web identity.
        let arn = b().with_config(AmazonS3ConfigKey::RoleArn, "arn:aws:iam::1:role/r");
        assert!(uses_instance_credentials(&arn));
        let web = arn.with_config(AmazonS3ConfigKey::WebIdentityTokenFile, "/token");
        assert!(!uses_instance_credentials(&web));
    }

    #[test]
    fn half_a_key_says_which_half_is_missing() {
        let b = AmazonS3Builder::new().with_bucket_name("b");
        assert!(half_a_key(&b, "s3://b/").is_ok());
        let id = b.clone().with_access_key_id("AKID");
        let msg = half_a_key(&id, "s3://b/")
            .expect_err("no secret")
            .to_string();
        assert!(
            msg.contains("no storage.secret_access_key")
                && msg.contains("AWS_SECRET_ACCESS_KEY")
                && !msg.contains("AKID"),
            "{msg}"
        );
        let secret = b.clone().with_secret_access_key("hush");
        let msg = half_a_key(&secret, "s3://b/")
            .expect_err("no id")
            .to_string();
        assert!(
            msg.contains("no storage.access_key_id") && !msg.contains("hush"),
            "{msg}"
        );
        assert!(half_a_key(&id.with_secret_access_key("s"), "s3://b/").is_ok());
    }

    #[test]
    fn an_unknown_storage_option_suggests_the_closest() {
        let loc = Location::parse("s3://b/").expect("parse");
        let options = BTreeMap::from([("endpont".to_string(), "http://x".to_string())]);
        let msg = build_store(&loc, &options)
            .expect_err("unknown")
            .to_string();
        assert!(msg.contains("did you mean endpoint?"), "{msg}");
    }

    #[test]
    fn explain_finds_no_credentials_inside_a_store_error() {
        let e = object_store::Error::Generic {
            store: "S3",
            source: Box::new(object_store::Error::Generic {
                store: "S3",
                source: Box::new(NoCredentials {
                    url: "s3://b/".into(),
                }),
            }),
        };
        let msg = explain(e).to_string();
        assert!(
            msg.starts_with("no credentials for s3://b/:") && msg.contains("AWS_ACCESS_KEY_ID"),
            "{msg}"
        );
    }

    #[test]
    fn a_missing_bucket_names_the_endpoint_without_credentials() {
        let loc = Location::parse("s3://nob/x").expect("parse");
        let options = BTreeMap::from([
            (
                "endpoint".to_string(),
                "http://user:pw@127.0.0.1:9000".to_string(),
            ),
            ("secret_access_key".to_string(), "hush".to_string()),
        ]);
        let e = || object_store::Error::NotFound {
            path: "x".into(),
            source: "<Error><Code>NoSuchBucket</Code></Error>".into(),
        };
        let msg = explain_at(e(), &loc, &options).to_string();
        assert!(
            msg.starts_with("bucket nob does not exist at http://127.0.0.1:9000 "),
            "{msg}"
        );
        assert!(!msg.contains("pw") && !msg.contains("hush"), "{msg}");
        // Not S3: the store's own error.
        let mem = Location::parse("memory://m/x").expect("parse");
        assert!(
            !explain_at(e(), &mem, &options)
                .to_string()
                .contains("bucket")
        );
    }

    #[test]
    fn a_missing_path_names_the_dir_and_the_closest_name() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("images/train")).expect("mkdir");
        let abs = dir.path().join("images/trian");
        let msg = missing_path(&abs.display().to_string());
        let want = dir.path().join("images/train").display().to_string();
        assert!(msg.contains(&format!("did you mean {want:?}")), "{msg}");
        // An absolute path names no current directory.
        assert!(!msg.contains("current directory"), "{msg}");
        let far = dir.path().join("zzzzzzzz/x");
        assert_eq!(
            missing_path(&far.display().to_string()),
            "no such file or directory"
        );
    }

    #[test]
    fn join_key_of_empty_parts() {
        assert_eq!(join_key("", "a/b"), "a/b");
        assert_eq!(join_key("p", ""), "p");
        assert_eq!(join_key("p/q", "a"), "p/q/a");
    }

    #[test]
    fn of_source_reads_the_prefix_verbatim() {
        for prefix in ["sub dir#%é", "pct%41", "a?b/c", "日本"] {
            let source = format!("s3://bucket/{prefix}");
            let loc = Location::of_source(&source).expect("of_source");
            assert_eq!(loc.prefix.as_ref(), prefix);
            assert_eq!(loc.store_url.as_str(), "s3://bucket/");
            assert_eq!(loc.source, source, "source round-trips");
        }
        let root = Location::of_source("s3://bucket/").expect("root");
        assert!(root.prefix.is_root());
        let local = Location::of_source("file:///tmp/x#y").expect("file");
        assert_eq!(local.prefix.as_ref(), "tmp/x#y");
        assert_eq!(local.store_url.as_str(), "file:///");
    }

    #[test]
    fn parse_decodes_a_url_and_keeps_a_local_path() {
        let loc = Location::parse("s3://bucket/a%20b%23c").expect("parse");
        assert_eq!(loc.prefix.as_ref(), "a b#c");
        for uri in ["s3://bucket/a#b", "s3://bucket/a?b", "memory://m/x#"] {
            let err = Location::parse(uri).expect_err(uri);
            assert!(err.to_string().contains("%23"), "{err}");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let odd = dir.path().join("x#%y é");
        std::fs::create_dir(&odd).expect("mkdir");
        let loc = Location::parse(&odd.display().to_string()).expect("local");
        assert!(loc.prefix.as_ref().ends_with("x#%y é"), "{}", loc.prefix);
        // The source the listing writes resolves to the same location.
        assert_eq!(Location::of_source(&loc.source).expect("back"), loc);
    }

    #[test]
    fn an_http_endpoint_allows_http_unless_the_user_said_otherwise() {
        let b = AmazonS3Builder::new().with_endpoint("http://127.0.0.1:9000");
        let allow = |b: &AmazonS3Builder| {
            b.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
        };
        let b2 = s3_plain_http(b.clone(), false).expect("allowed");
        assert_eq!(allow(&b2).as_deref(), Some("true"));
        let off = b.clone().with_allow_http(false);
        let err = s3_plain_http(off, true).expect_err("explicitly off");
        assert!(err.to_string().contains("storage.allow_http=true"), "{err}");
        let https = AmazonS3Builder::new().with_endpoint("https://s3.example");
        let b3 = s3_plain_http(https, false).expect("https");
        assert_eq!(allow(&b3).as_deref(), Some("false"));
        let creds = AmazonS3Builder::new()
            .with_endpoint("http://user:secret@127.0.0.1:9000")
            .with_allow_http(false);
        let err = s3_plain_http(creds, true).expect_err("off");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}
