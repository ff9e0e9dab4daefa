//! What a store error means, in one line saying what to do where the store's
//! own message does not: [`explain`] (a bare "builder error" is a plain
//! `http://` URL with `allow_http` off; a failed credential lookup is the
//! [`NoCredentials`] it carries) and [`explain_at`] (S3 error codes: a bucket
//! that does not exist at which endpoint, credentials the server rejects).
//! No message names a password or a secret.

use std::collections::BTreeMap;

use super::location::Location;
use super::s3::{NoCredentials, s3_endpoint};

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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

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
}
