//! S3 stores and their first-run mistakes: the store of an `s3://` URI from the
//! `AWS_*` environment plus the chain's `storage_option`s, so any S3-compatible
//! server works.
//!
//! Guarantees: an `http://` endpoint the user gives allows plain HTTP unless
//! they set `allow_http` (set off, the error says what to change); an access
//! key id without its secret (or the reverse) fails at once saying which half
//! is missing; without credentials (none configured and no instance metadata
//! endpoint accepting a connection) every request fails at once with
//! [`NoCredentials`] (which settings or variables to set), not after a minute
//! of metadata retries. No error echoes a secret or a password.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::object_store::ObjectStore;
use object_store::ClientConfigKey;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use url::Url;

use super::location::Location;
use crate::error::{Error, Result};

/// The S3 store of `url` from the `AWS_*` environment and `options` (an
/// unknown option is `bad_option`'s error).
pub(super) fn build(
    url: &str,
    options: &BTreeMap<String, String>,
    bad_option: impl Fn(&str) -> Error,
) -> Result<Arc<dyn ObjectStore>> {
    let err = |e: object_store::Error| Error::Storage {
        url: url.to_string(),
        source: Arc::new(e),
    };
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
        Ok(Arc::new(
            b.with_credentials(Arc::new(creds)).build().map_err(err)?,
        ))
    } else {
        Ok(Arc::new(b.build().map_err(err)?))
    }
}

/// The endpoint `loc`'s S3 store talks to (without user or password): the
/// configured one, else AWS's for the region.
pub(super) fn s3_endpoint(loc: &Location, options: &BTreeMap<String, String>) -> String {
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

/// S3 without credentials: none configured and no instance metadata endpoint
/// answering. Says which settings or environment variables to set.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "no credentials for {url}: set storage.access_key_id and storage.secret_access_key \
     (--set or SET), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
     (storage.skip_signature=true for a public bucket)"
)]
pub struct NoCredentials {
    pub(super) url: String,
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

/// Whether a TCP connection to `url`'s host opens within object_store's own
/// connect timeout for the metadata endpoint (1 s). Blocking.
fn connects_to(url: &str) -> bool {
    let addr = Url::parse(url).ok().and_then(|url| {
        let host = url.host_str()?.trim_matches(['[', ']']).to_string();
        std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), url.port_or_known_default()?))
            .ok()?
            .next()
    });
    addr.is_some_and(|a| {
        std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(1)).is_ok()
    })
}

#[async_trait::async_trait]
impl object_store::CredentialProvider for InstanceCredentials {
    type Credential = object_store::aws::AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<Self::Credential>> {
        use std::sync::atomic::Ordering;
        if !self.reachable.load(Ordering::Relaxed) {
            let metadata = self.metadata.clone();
            // object_store's own connect timeout for the metadata endpoint.
            let connects = crate::runtime::blocking(move || Ok(connects_to(&metadata)))
                .await
                .unwrap_or(false);
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

#[cfg(test)]
mod tests {
    use super::*;

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
