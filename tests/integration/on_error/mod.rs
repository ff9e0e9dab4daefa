//! `on_error` has one meaning for map, gen, batch_map and agg: `null` emits
//! the row (agg: the group) with a null output, `skip` drops exactly the failed
//! rows and lists them, `fail` names the UDF, the file and the row. Rows carry
//! two `File` columns read through prefetched local copies (on disk), from the
//! S3 server on loopback. Prefetch reference counts stay exact under skip and
//! null; `ordered = false` emits results as calls finish, in every operator.
//!
//! One file per behaviour (below); the helpers they share are here.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tempfile::TempDir;
use udfchain::udfs::{BatchMapper, BoxError, CallError, Signature, decode_rows, encode_column};
use udfchain::{Chain, File, OnError, RunReport, Session, Settings, Udf, col};

use udfchain_testkit::{CountingStore, S3Server, content};

mod ordering;
mod policies;
mod prefetch_copies;

const PREFIX: &str = "onerr";

/// The S3 server, a session whose `s3://bucket` counts GETs, and a root dir.
struct Fixture {
    _server: S3Server,
    root: TempDir,
    session: Arc<Session>,
    store: Arc<CountingStore>,
}

impl Fixture {
    /// Objects `names[i]` of `size(i)` bytes under `s3://bucket/onerr/`.
    fn new(objects: &[(&str, usize)]) -> Self {
        let server = S3Server::start();
        let dir = server.bucket_dir().join(PREFIX);
        std::fs::create_dir_all(&dir).expect("mkdir");
        for (i, (name, size)) in objects.iter().enumerate() {
            std::fs::write(dir.join(name), content(i, *size)).expect("write");
        }
        let root = tempfile::tempdir().expect("root");
        let session = Session::with_settings(server.settings().root(root.path()));
        let inner = session.store("s3://bucket/").expect("s3 store");
        let store = CountingStore::new(inner);
        session
            .register_store("s3://bucket", Arc::clone(&store) as _)
            .expect("register");
        Self {
            _server: server,
            root,
            session,
            store,
        }
    }

    fn tmp(&self) -> PathBuf {
        self.root.path().join("tmp")
    }
}

fn file(name: &str, size: usize) -> File {
    File {
        source: format!("s3://bucket/{PREFIX}"),
        path: name.to_string(),
        size: size as u64,
        ..File::default()
    }
}

fn url(name: &str) -> String {
    format!("s3://bucket/{PREFIX}/{name}")
}

/// An input row: a key for agg and two files.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    id: u64,
    key: String,
    a: File,
    b: File,
}

/// What the UDFs read: the `id`, `a`, `b` params.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pair {
    id: u64,
    a: File,
    b: File,
}

fn boom(what: &str) -> BoxError {
    std::io::Error::other(format!("cannot decode {what}")).into()
}

/// The UDFs fail on rows whose `a` is `f1` or `f3`.
fn bad(p: &Pair) -> bool {
    p.a.path == "f1.bin" || p.a.path == "f3.bin"
}

async fn total(p: &Pair) -> Result<u64, BoxError> {
    Ok((p.a.read().await?.len() + p.b.read().await?.len()) as u64)
}

/// A batch UDF that says which row of a call failed.
#[derive(Debug)]
struct Totals(Signature);

#[async_trait]
impl BatchMapper for Totals {
    fn signature(&self) -> &Signature {
        &self.0
    }

    async fn map_batch(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        let rows: Vec<Pair> = decode_rows(&input, &self.0.params)?;
        let mut out = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            if bad(r) {
                return Err(CallError::at_row(i, boom(&r.a.path)));
            }
            out.push(total(r).await.map_err(|e| CallError::at_row(i, e))?);
        }
        Ok(encode_column(&self.0.output, &out)?)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Map,
    Gen,
    BatchMap,
    Agg,
}

/// Sizes of `f0.bin` .. `f5.bin`.
fn size(i: usize) -> usize {
    100 + 10 * i
}

/// Six rows in four groups; rows 1 and 3 fail (groups g1 and g2). Row 2 has
/// the same file in both columns; rows share files with their neighbours.
fn rows() -> Vec<Row> {
    let f = |i: usize| file(&format!("f{i}.bin"), size(i));
    let row = |id: u64, key: &str, a: usize, b: usize| Row {
        id,
        key: key.to_string(),
        a: f(a),
        b: f(b),
    };
    vec![
        row(0, "g0", 0, 1),
        row(1, "g1", 1, 2),
        row(2, "g1", 2, 2),
        row(3, "g2", 3, 0),
        row(4, "g3", 4, 5),
        row(5, "g3", 5, 4),
    ]
}

/// (row id or group key, output) of every output row, in output order.
type Out = Vec<(String, Option<u64>)>;

async fn run(
    fx: &Fixture,
    kind: Kind,
    policy: OnError,
    rows: &[Row],
) -> udfchain::Result<(Out, RunReport)> {
    let chain = Chain::from_values_in(Arc::clone(&fx.session), rows).settings(
        Settings::new()
            .prefetch(2)
            .memory_file_limit(0)
            .parallel(2)
            .batch_size(2)
            .on_error(policy),
    );
    let params = ["id", "a", "b"];
    let chain = match kind {
        Kind::Map => chain.map_on(&params, "v", |p: Pair| async move {
            if bad(&p) {
                return Err(boom(&p.a.path));
            }
            total(&p).await
        }),
        Kind::Gen => chain.gen_on(&params, "v", |p: Pair| {
            futures::stream::once(async move {
                if bad(&p) {
                    return vec![Err(boom(&p.a.path))];
                }
                match (p.a.read().await, p.b.read().await) {
                    (Ok(a), Ok(b)) => vec![Ok(a.len() as u64), Ok(b.len() as u64)],
                    (Err(e), _) | (_, Err(e)) => vec![Err(e.into())],
                }
            })
            .flat_map(futures::stream::iter)
        }),
        Kind::BatchMap => chain.udf(Udf::BatchMap(Arc::new(Totals(Signature {
            name: "totals".into(),
            params: params.iter().map(|s| s.to_string()).collect(),
            input: None,
            output: Field::new("v", DataType::UInt64, true),
        })))),
        Kind::Agg => chain.agg(&["key"], &params, "v", |ps: Vec<Pair>| async move {
            let mut sum = 0;
            for p in &ps {
                if bad(p) {
                    return Err(boom(&p.a.path));
                }
                sum += total(p).await?;
            }
            Ok(vec![sum])
        }),
    };
    let label = if kind == Kind::Agg { "key" } else { "id" };
    let chain = chain.select([col(label), col("v")]);
    let (batches, report) = chain.collect_with_report().await?;
    #[derive(Deserialize)]
    struct ById {
        id: u64,
        v: Option<u64>,
    }
    #[derive(Deserialize)]
    struct ByKey {
        key: String,
        v: Option<u64>,
    }
    let mut out = Vec::new();
    for b in &batches {
        if kind == Kind::Agg {
            let rows: Vec<ByKey> = serde_arrow::from_record_batch(b).expect("rows");
            out.extend(rows.into_iter().map(|r| (r.key, r.v)));
        } else {
            let rows: Vec<ById> = serde_arrow::from_record_batch(b).expect("rows");
            out.extend(rows.into_iter().map(|r| (r.id.to_string(), r.v)));
        }
    }
    Ok((out, report))
}

fn out(rows: &[(&str, Option<u64>)]) -> Out {
    rows.iter().map(|(l, v)| (l.to_string(), *v)).collect()
}

fn six_files() -> Vec<(String, usize)> {
    (0..6).map(|i| (format!("f{i}.bin"), size(i))).collect()
}
