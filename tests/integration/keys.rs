//! Object keys round-trip exactly: a listed object whose key holds `% # ? [ ]
//! { } +`, spaces, non-ASCII or `..`-looking segments is read back
//! byte-identical, from a local dir, memory:// and the S3 server, with
//! prefetch on and off, through `File::read`, `File::read_range`,
//! `File::open`, and the script builtin `sha256(file)`.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use udfchain::{File, Output, ScriptRunner, Session, Settings};

use udfchain_testkit::{S3Server, content};

/// File names holding every character that URL or path encoding treats
/// specially (no name ends in `#<digits>`: the local store hides such files as
/// its own upload parts).
const NAMES: &[&str] = &[
    "pct%41%.bin",
    "hash#x.bin",
    "q?mark.bin",
    "br[a]ket.bin",
    "cu{r}ly.bin",
    "pl+us.bin",
    "sp ace.bin",
    "all %#?[]{}+ .bin",
    "café.bin",
    "日本.txt",
    "emoji😀.bin",
    "a..b",
    "..x",
    "x..",
];

/// A subdirectory whose own name needs encoding too.
const SUB: &str = "sub dir#%é";

/// Every object (relative path -> bytes): each name at the top and in `SUB`.
fn objects() -> BTreeMap<String, Vec<u8>> {
    NAMES
        .iter()
        .flat_map(|n| [n.to_string(), format!("{SUB}/{n}")])
        .enumerate()
        .map(|(i, rel)| (rel, content(i, 50 + i * 13)))
        .collect()
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Local,
    Memory,
    S3,
}

/// A store of `kind` holding [`objects`] below a prefix: the session reading
/// it, the URI of that prefix, and the URI of `SUB` below it.
struct Fixture {
    session: Arc<Session>,
    uri: String,
    sub_uri: String,
    _dir: Option<tempfile::TempDir>,
    _s3: Option<S3Server>,
}

async fn fixture(kind: Kind) -> Fixture {
    let objects = objects();
    let write_dir = |dir: &std::path::Path| {
        for (rel, bytes) in &objects {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, bytes).expect("write");
        }
    };
    // A URI of `SUB` below `base`, percent-encoded as a URL must be.
    let sub_url = |base: &str| {
        let mut url = url::Url::parse(base).expect("url");
        url.path_segments_mut().expect("segments").push(SUB);
        url.to_string()
    };
    match kind {
        Kind::Local => {
            let dir = tempfile::tempdir().expect("tempdir");
            let data = dir.path().join("data");
            write_dir(&data);
            Fixture {
                session: Session::new(),
                uri: data.display().to_string(),
                // A plain path, not a URL: nothing to encode.
                sub_uri: data.join(SUB).display().to_string(),
                _dir: Some(dir),
                _s3: None,
            }
        }
        Kind::Memory => {
            let store = Arc::new(InMemory::new());
            for (rel, bytes) in &objects {
                // The key verbatim (`Path::from` would percent-encode it).
                let key = Path::parse(format!("data/{rel}")).expect("key");
                store
                    .put(&key, PutPayload::from(bytes.clone()))
                    .await
                    .expect("put");
            }
            let session = Session::new();
            session
                .register_store("memory://keys", store)
                .expect("register");
            Fixture {
                session,
                uri: "memory://keys/data".into(),
                sub_uri: sub_url("memory://keys/data"),
                _dir: None,
                _s3: None,
            }
        }
        Kind::S3 => {
            let s3 = S3Server::start();
            write_dir(&s3.bucket_dir().join("data"));
            Fixture {
                session: s3.session(),
                uri: "s3://bucket/data".into(),
                sub_uri: sub_url("s3://bucket/data"),
                _dir: None,
                _s3: Some(s3),
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct Row {
    path: String,
    bytes: Vec<u8>,
    tail: Vec<u8>,
    opened: Vec<u8>,
}

/// Lists `uri` and reads every file three ways with `prefetch`.
async fn read_all(session: &Arc<Session>, uri: &str, prefetch: usize) -> BTreeMap<String, Row> {
    let rows: Vec<Row> = session
        .from_storage(uri)
        .settings(Settings::new().prefetch(prefetch).parallel(2))
        .map("bytes", |f: File| async move {
            f.read().await.map(|b| b.to_vec())
        })
        .map("tail", |f: File| async move {
            f.read_range(f.size / 2..f.size).await.map(|b| b.to_vec())
        })
        .map("opened", |f: File| async move {
            let mut out = Vec::new();
            let mut reader = f.open().await.map_err(std::io::Error::other)?;
            reader.read_to_end(&mut out).await?;
            Ok::<_, std::io::Error>(out)
        })
        .select([
            udfchain::col("file.path").alias("path"),
            udfchain::col("bytes"),
            udfchain::col("tail"),
            udfchain::col("opened"),
        ])
        .to_rows()
        .await
        .unwrap_or_else(|e| panic!("{uri} (prefetch {prefetch}): {e}"));
    rows.into_iter().map(|r| (r.path.clone(), r)).collect()
}

fn assert_same(got: &BTreeMap<String, Row>, want: &BTreeMap<String, Vec<u8>>, what: &str) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: listed paths"
    );
    for (path, bytes) in want {
        let row = &got[path];
        assert!(row.bytes == *bytes, "{what}: read of {path:?}");
        assert!(
            row.tail == bytes[bytes.len() / 2..],
            "{what}: read_range of {path:?}"
        );
        assert!(row.opened == *bytes, "{what}: open of {path:?}");
    }
}

/// The shared suite: list, read back, compare, with prefetch off and on; the
/// same below the subdirectory whose name needs encoding.
async fn keys_round_trip(kind: Kind) {
    let fx = fixture(kind).await;
    let all = objects();
    let in_sub: BTreeMap<String, Vec<u8>> = all
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(&format!("{SUB}/"))?.to_string(), v.clone())))
        .collect();
    for prefetch in [0, 4] {
        let what = format!("{kind:?}, prefetch {prefetch}");
        assert_same(&read_all(&fx.session, &fx.uri, prefetch).await, &all, &what);
        assert_same(
            &read_all(&fx.session, &fx.sub_uri, prefetch).await,
            &in_sub,
            &format!("{what}, listed from {:?}", fx.sub_uri),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_keys_round_trip_on_a_local_dir() {
    keys_round_trip(Kind::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_keys_round_trip_on_memory() {
    keys_round_trip(Kind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_keys_round_trip_on_the_s3_server() {
    keys_round_trip(Kind::S3).await;
}

/// The script builtin `sha256(file)` over `read_storage` of a local dir
/// (with and without prefetch) hashes every odd key's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_sha256_reads_odd_keys() {
    let fx = fixture(Kind::Local).await;
    let want: BTreeMap<String, String> = objects()
        .into_iter()
        .map(|(k, v)| (k, hex(&Sha256::digest(&v))))
        .collect();
    let root = tempfile::tempdir().expect("root");
    let runner = ScriptRunner::new(Session::with_settings(Settings::new().root(root.path())));
    for prefetch in [0, 4] {
        let script = format!(
            "SET prefetch = {prefetch};\n\
             SELECT file.path AS path, sha256(file) AS sha FROM read_storage('{}');",
            fx.uri
        );
        let outputs = runner.run(&script).await.unwrap_or_else(|e| panic!("{e}"));
        let mut got = BTreeMap::new();
        for out in outputs {
            let Output::Table(batches) = out else {
                continue;
            };
            for b in batches {
                let col = |i: usize| {
                    let utf8 = cast(b.column(i), &DataType::Utf8).expect("cast to utf8");
                    utf8.as_any()
                        .downcast_ref::<StringArray>()
                        .expect("utf8 column")
                        .clone()
                };
                let (paths, shas) = (col(0), col(1));
                for i in 0..paths.len() {
                    got.insert(paths.value(i).to_string(), shas.value(i).to_string());
                }
            }
        }
        assert_eq!(got, want, "prefetch {prefetch}");
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The paths of a listing of `uri`, in the order the listing gives them.
async fn listed_paths(session: &Arc<Session>, uri: &str) -> Vec<String> {
    #[derive(Deserialize)]
    struct P {
        path: String,
    }
    let rows: Vec<P> = session
        .from_storage(uri)
        .select([udfchain::col("file.path").alias("path")])
        .to_rows()
        .await
        .unwrap_or_else(|e| panic!("{uri}: {e}"));
    rows.into_iter().map(|r| r.path).collect()
}

/// A listing gives keys in lexicographic byte order on every store — a
/// local dir walked by the engine, memory:// and the S3 server — so the same
/// files give the same dataset order everywhere (`a-c` < `a/x` < `a0`: a
/// directory sorts as `name/`, as its keys do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_lists_keys_in_the_same_lexicographic_order() {
    let want: Vec<String> = objects().into_keys().collect();
    assert!(want.windows(2).all(|w| w[0].as_bytes() < w[1].as_bytes()));
    for kind in [Kind::Local, Kind::Memory, Kind::S3] {
        let fx = fixture(kind).await;
        assert_eq!(listed_paths(&fx.session, &fx.uri).await, want, "{kind:?}");
    }
    // A tree whose readdir order is not its key order: written in reverse,
    // with names on both sides of '/' (0x2F).
    let dir = tempfile::tempdir().expect("tempdir");
    let names = ["a-c", "a/x", "a/y/z", "a0", "A", "b", "z/deep/er/file"];
    for n in names.iter().rev() {
        let p = dir.path().join(n);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, n.as_bytes()).expect("write");
    }
    let mut sorted: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    sorted.sort();
    let uri = dir.path().display().to_string();
    assert_eq!(listed_paths(&Session::new(), &uri).await, sorted);
}
