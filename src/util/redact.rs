//! Credentials are never echoed: [`redact`] replaces every known secret in a text
//! with `***` before the text leaves the process (errors, `--verbose` causes,
//! EXPLAIN, run reports, progress, messages, the query text saved with a dataset).
//!
//! Known secrets are the values of credential-like storage options given to
//! [`Settings`](crate::Settings) (registered by [`register_option`]), the values of
//! credential-like `AWS_*` / `AZURE_*` / `GOOGLE_*` environment variables (read
//! once), the password of any `scheme://user:password@host` URL in the text, and
//! the value of every credential-like query parameter of a presigned URL
//! (`X-Amz-Signature=`, `X-Amz-Credential=`, `X-Amz-Security-Token=`,
//! `X-Goog-Signature=`, Azure SAS `sig=`, ...: [`is_secret_query_name`]).
//! Values shorter than [`MIN_SECRET_LEN`] are not registered: redacting a
//! two-letter "secret" everywhere would garble output without protecting anything.

use std::borrow::Cow;
use std::sync::{LazyLock, RwLock};

use crate::util::lock::{read, write};

/// The replacement text.
pub const MASK: &str = "***";

/// Shorter values are not treated as secrets.
pub const MIN_SECRET_LEN: usize = 4;

/// Environment variable prefixes of the stores' credential chains.
const ENV_PREFIXES: &[&str] = &["AWS_", "AZURE_", "GOOGLE_", "GCS_", "OBJECT_STORE_"];

static SECRETS: LazyLock<RwLock<Vec<String>>> = LazyLock::new(|| {
    let mut found: Vec<String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| {
            let upper = k.to_ascii_uppercase();
            ENV_PREFIXES.iter().any(|p| upper.starts_with(p)) && is_secret_name(&upper)
        })
        .map(|(_, v)| v)
        .filter(|v| v.len() >= MIN_SECRET_LEN)
        .collect();
    found.sort();
    found.dedup();
    RwLock::new(found)
});

/// Whether an option or variable name names a credential (`secret_access_key`,
/// `session_token`, `account_key`, `client_secret`, `sas_key`, `password`, ...).
pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    // An id (`access_key_id`, `client_id`) names a credential but is not secret:
    // AWS prints access key ids in its own error messages.
    if lower.ends_with("_id") {
        return false;
    }
    [
        "secret",
        "token",
        "password",
        "key",
        "sas",
        "credential",
        "signature",
    ]
    .iter()
    .any(|w| lower.contains(w))
}

/// Query parameters whose values are secret although [`is_secret_name`] does
/// not say so: Azure SAS's signature.
const SECRET_QUERY_NAMES: &[&str] = &["sig"];

/// Whether a URL query parameter carries a credential (`X-Amz-Signature`,
/// `X-Amz-Security-Token`, `X-Goog-Credential`, `sig`, `token`, ...).
pub fn is_secret_query_name(name: &str) -> bool {
    is_secret_name(&name.replace('-', "_"))
        || SECRET_QUERY_NAMES
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
}

/// Registers the value of a storage option if its name names a credential.
pub fn register_option(name: &str, value: &str) {
    if is_secret_name(name) {
        register(value);
    }
}

/// Registers a secret value: from now on [`redact`] masks it.
pub fn register(value: &str) {
    let value = value.trim();
    if value.len() < MIN_SECRET_LEN {
        return;
    }
    let mut secrets = write(&SECRETS);
    if !secrets.iter().any(|s| s == value) {
        secrets.push(value.to_string());
        // Longest first, so a secret that contains another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// `text` with every known secret and every URL password replaced by `***`.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    {
        let secrets = read(&SECRETS);
        for s in secrets.iter() {
            if out.contains(s.as_str()) {
                out = Cow::Owned(out.replace(s.as_str(), MASK));
            }
        }
    }
    if let Some(masked) = mask_url_passwords(&out) {
        out = Cow::Owned(masked);
    }
    match mask_query_secrets(&out) {
        Some(masked) => Cow::Owned(masked),
        None => out,
    }
}

/// Replaces the value of each `?name=value` / `&name=value` whose name
/// [`is_secret_query_name`]; `None` if there is none.
fn mask_query_secrets(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    let mut changed = false;
    while let Some(i) = rest.find(['?', '&']) {
        let (head, tail) = rest.split_at(i + 1);
        out.push_str(head);
        rest = tail;
        let name_len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
            .unwrap_or(tail.len());
        let (name, after) = tail.split_at(name_len);
        let Some(value) = after.strip_prefix('=') else {
            continue;
        };
        if name.is_empty() || !is_secret_query_name(name) {
            continue;
        }
        // The value ends where the parameter, the URL or a quoted text does.
        let end = value
            .find(|c: char| {
                c.is_whitespace()
                    || matches!(
                        c,
                        '&' | '#' | '"' | '\'' | '`' | '\\' | ')' | ']' | '>' | ';' | ','
                    )
            })
            .unwrap_or(value.len());
        if end > 0 {
            out.push_str(name);
            out.push('=');
            out.push_str(MASK);
            rest = &value[end..];
            changed = true;
        }
    }
    out.push_str(rest);
    changed.then_some(out)
}

/// Replaces the password of each `scheme://user:password@` in `text`; `None` if
/// there is none.
fn mask_url_passwords(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    let mut changed = false;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // The authority ends at the first '/', whitespace or quote.
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || matches!(c, '"' | '\'' | '`'))
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@').and_then(|at| {
            let userinfo = &authority[..at];
            userinfo.find(':').map(|colon| (colon, at))
        }) {
            Some((colon, at)) if at > colon + 1 => {
                out.push_str(&authority[..=colon]);
                out.push_str(MASK);
                out.push_str(&authority[at..]);
                changed = true;
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_secrets_are_masked_wherever_they_appear() {
        register("s3cr3t-value-for-redact-test");
        let text =
            "error at x: key s3cr3t-value-for-redact-test rejected (s3cr3t-value-for-redact-test)";
        assert_eq!(redact(text), "error at x: key *** rejected (***)");
    }

    #[test]
    fn short_values_are_not_secrets() {
        register("ab");
        assert_eq!(redact("a b ab abc"), "a b ab abc");
    }

    #[test]
    fn option_names_decide_what_is_registered() {
        register_option("region", "eu-west-redact-test");
        register_option("secret_access_key", "the-secret-redact-test");
        assert_eq!(
            redact("eu-west-redact-test the-secret-redact-test"),
            "eu-west-redact-test ***"
        );
        for name in [
            "session_token",
            "AZURE_STORAGE_ACCOUNT_KEY",
            "client_secret",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "endpoint",
            "region",
            "allow_http",
            "bucket",
            "access_key_id",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn url_passwords_are_masked() {
        assert_eq!(
            redact("cannot open s3://user:pw123@bucket/a and http://u:p@h:9/x, keep a://b@c"),
            "cannot open s3://user:***@bucket/a and http://u:***@h:9/x, keep a://b@c"
        );
        assert_eq!(redact("no url here: a:b@c"), "no url here: a:b@c");
        assert_eq!(redact("trailing ://"), "trailing ://");
    }

    #[test]
    fn presigned_url_credentials_are_masked() {
        let s3 = "GET https://b.s3.amazonaws.com/k/f.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256\
                  &X-Amz-Credential=AKIAEXAMPLE%2F20260101%2Fus-east-1%2Fs3%2Faws4_request\
                  &X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host\
                  &X-Amz-Security-Token=IQoJb3JpZ2luX2VjE&X-Amz-Signature=0123abcd failed";
        assert_eq!(
            redact(s3),
            "GET https://b.s3.amazonaws.com/k/f.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256\
             &X-Amz-Credential=***&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600\
             &X-Amz-SignedHeaders=host&X-Amz-Security-Token=***&X-Amz-Signature=*** failed"
        );
        assert_eq!(
            redact(
                "'https://a.blob.core.windows.net/c/f?sv=2022-11-02&se=2026&sp=r&sig=AbC%2Bd%3D'"
            ),
            "'https://a.blob.core.windows.net/c/f?sv=2022-11-02&se=2026&sp=r&sig=***'"
        );
        assert_eq!(
            redact("https://storage.googleapis.com/b/o?X-Goog-Signature=ff00#frag"),
            "https://storage.googleapis.com/b/o?X-Goog-Signature=***#frag"
        );
        for kept in ["a?b=c&d=e", "what? & why=", "x?sig", "x?sig=&y=1"] {
            assert_eq!(redact(kept), kept);
        }
    }

    #[test]
    fn a_secret_containing_another_is_masked_whole() {
        register("inner-redact-test");
        register("outer-inner-redact-test-long");
        assert_eq!(redact("outer-inner-redact-test-long"), "***");
    }
}
