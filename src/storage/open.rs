//! Opening stores: the store of a [`Location`] comes from DataFusion's object
//! store registry (keyed by scheme and host) or, on first use, is built from
//! the environment plus the chain's `storage_option`s and registered there.
//!
//! Guarantees: an unknown storage option fails naming the closest known one; a
//! plain local path that does not exist fails before planning ([`open_source`]);
//! an `http://` URI is a plain-HTTP server by the user's own choice.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::object_store::ObjectStore;
use object_store::ClientOptions;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::memory::InMemory;

use super::location::{Location, check_local_path};
use crate::error::{Error, Result};

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
        "s3" | "s3a" => super::s3::build(url, options, bad_option)?,
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
                .with_http_connector(super::plain_http::PlainHttp)
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
    fn an_unknown_storage_option_suggests_the_closest() {
        let loc = Location::parse("s3://b/").expect("parse");
        let options = BTreeMap::from([("endpont".to_string(), "http://x".to_string())]);
        let msg = build_store(&loc, &options)
            .expect_err("unknown")
            .to_string();
        assert!(msg.contains("did you mean endpoint?"), "{msg}");
    }
}
