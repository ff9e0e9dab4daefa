//! Lineage: what a saved dataset version read, kept in the catalog next to
//! the version (table `lineage`, one row per source, in the order the plan
//! named them).
//!
//! Guarantees: the lineage of a version is inserted in the same SQLite
//! transaction as the version's row, so a version is never visible without
//! its lineage, and removing a version removes its lineage in the transaction
//! that deletes its row. A source is a storage URI (`kind = "storage"`) or a
//! dataset version (`kind = "dataset"`, name and the version actually read,
//! never "latest"). No credential is ever stored: a URI loses its userinfo
//! and every credential-like query parameter, and then goes through
//! [`redact`] (known secrets).
//!
//! Schema migrations are numbered by SQLite's `user_version`: a catalog
//! created before lineage existed (`user_version` 0, tables `versions` and
//! `dataset_seq` only) is upgraded in place at `Catalog::open`, in one
//! `IMMEDIATE` transaction, keeping every row; its older versions have no
//! lineage recorded ([`Catalog::lineage`] returns an empty list for them).

use rusqlite::{Connection, Transaction, params};

use crate::util::redact::{is_secret_query_name, redact};

/// The catalog schema this build writes (`PRAGMA user_version`).
pub(crate) const SCHEMA_VERSION: i64 = 1;

/// One source a dataset version read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
#[non_exhaustive]
pub enum LineageEntry {
    /// Objects or files under a storage URI (a listing, a Parquet / CSV /
    /// JSON file or dir), credentials removed.
    Storage {
        /// The URI, without userinfo or secret query parameters.
        uri: String,
    },
    /// A version of another (or the same) dataset.
    Dataset {
        /// The dataset's name.
        name: String,
        /// The version read.
        version: u32,
    },
}

impl LineageEntry {
    /// A storage source, its URI cleaned of credentials.
    pub fn storage(uri: &str) -> Self {
        Self::Storage {
            uri: clean_uri(uri),
        }
    }

    /// `"storage"` or `"dataset"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Storage { .. } => "storage",
            Self::Dataset { .. } => "dataset",
        }
    }
}

impl std::fmt::Display for LineageEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Storage { uri } => write!(f, "storage {uri}"),
            Self::Dataset { name, version } => write!(f, "dataset {name} v{version}"),
        }
    }
}

/// `uri` without userinfo and credential-like query parameters, then with
/// every known secret masked.
pub(crate) fn clean_uri(uri: &str) -> String {
    let cleaned = match url::Url::parse(uri) {
        Ok(mut url) if url.scheme().len() > 1 => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            if url.query().is_some() {
                let kept: Vec<(String, String)> = url
                    .query_pairs()
                    .filter(|(k, _)| !is_secret_query_name(k))
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect();
                if kept.is_empty() {
                    url.set_query(None);
                } else {
                    url.query_pairs_mut().clear().extend_pairs(kept);
                }
            }
            url.to_string()
        }
        _ => uri.to_string(),
    };
    redact(&cleaned).into_owned()
}

/// Brings the schema of `conn`'s catalog to [`SCHEMA_VERSION`], keeping
/// every row (see the module header).
pub(crate) fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let at: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if at < 1 {
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS lineage (
                name TEXT NOT NULL,
                version INTEGER NOT NULL,
                position INTEGER NOT NULL,
                kind TEXT NOT NULL,
                uri TEXT,
                source_name TEXT,
                source_version INTEGER,
                PRIMARY KEY (name, version, position)
            );",
        )?;
    }
    if at < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()
}

/// Inserts the lineage of (name, version) in the version's transaction.
pub(crate) fn insert(
    tx: &Transaction<'_>,
    name: &str,
    version: u32,
    sources: &[LineageEntry],
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare(
        "INSERT INTO lineage (name, version, position, kind, uri, source_name, source_version)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for (i, s) in sources.iter().enumerate() {
        let (uri, source_name, source_version) = match s {
            LineageEntry::Storage { uri } => (Some(clean_uri(uri)), None, None),
            LineageEntry::Dataset { name, version } => (None, Some(name.as_str()), Some(*version)),
        };
        stmt.execute(params![
            name,
            version,
            i as i64,
            s.kind(),
            uri,
            source_name,
            source_version
        ])?;
    }
    Ok(())
}

/// Removes the lineage of (name, version), or of every version of `name`.
pub(crate) fn delete(
    tx: &Transaction<'_>,
    name: &str,
    version: Option<u32>,
) -> rusqlite::Result<()> {
    tx.execute(
        "DELETE FROM lineage WHERE name = ?1 AND (?2 IS NULL OR version = ?2)",
        params![name, version],
    )
    .map(|_| ())
}

/// The lineage of (name, version), in the order it was recorded.
pub(crate) fn read(
    conn: &Connection,
    name: &str,
    version: u32,
) -> rusqlite::Result<Vec<LineageEntry>> {
    let mut stmt = conn.prepare(
        "SELECT kind, uri, source_name, source_version FROM lineage
         WHERE name = ?1 AND version = ?2 ORDER BY position",
    )?;
    let rows = stmt.query_map(params![name, version], |r| {
        let kind: String = r.get(0)?;
        Ok(match kind.as_str() {
            "dataset" => LineageEntry::Dataset {
                name: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                version: r.get::<_, Option<u32>>(3)?.unwrap_or(0),
            },
            _ => LineageEntry::Storage {
                uri: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
            },
        })
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_lose_userinfo_and_secret_query_parameters() {
        assert_eq!(
            clean_uri(
                "https://alice:hunter22@example.com/a/b.parquet?X-Amz-Signature=abcdef&part=1"
            ),
            "https://example.com/a/b.parquet?part=1"
        );
        assert_eq!(
            clean_uri("https://example.com/x?sig=abcdef"),
            "https://example.com/x"
        );
        assert_eq!(clean_uri("s3://bucket/images"), "s3://bucket/images");
    }
}
