//! [`Location`]: a storage URI parsed into its store (`scheme://host`) and the
//! prefix inside it, and the one-line errors of a local path that does not exist.
//!
//! A URI is a local path (`data/`, `/abs/dir`), `file://`, `memory://`, `s3://`,
//! `gs://`, `az://`/`abfs://` or `http(s)://`; anything else, a bucket-less
//! cloud URI and a `?`/`#` (a query or fragment that would list another prefix)
//! fail to parse, saying why. A local path that does not exist fails with
//! where it was looked for and the closest existing name ([`missing_path`]).
//!
//! Keys round-trip: a listed file's `source` is `scheme://host/` plus the
//! prefix verbatim and its `path` the rest of the key verbatim;
//! [`Location::of_source`] and [`Location::child`] turn them back into the
//! exact key (no percent-encoding or decoding), whatever it holds (`% # ? [ ]
//! { } +`, spaces, non-ASCII, `..x`).

use datafusion::object_store::path::Path;
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
}
