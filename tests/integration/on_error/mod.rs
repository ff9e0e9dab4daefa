//! `on_error` has one meaning for map, gen, batch_map and agg: `null` emits
//! the row (agg: the group) with a null output, `skip` drops exactly the failed
//! rows and lists them, `fail` names the UDF, the file and the row. Rows carry
//! two `File` columns read through prefetched local copies (on disk), from the
//! S3 server on loopback. Prefetch reference counts stay exact under skip and
//! null; `ordered = false` emits results as calls finish, in every operator.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tempfile::TempDir;
use udfchain::udfs::{BatchMapper, BoxError, CallError, Signature, decode_rows, encode_column};
use udfchain::{Chain, Error, File, OnError, RunReport, Session, Settings, Udf, col};

use udfchain_testkit::{CountingStore, S3Server, content, no_prefetch_dirs_soon};

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

/// What each kind gives under `null` and `skip`: (output, skip list).
fn expected(kind: Kind, policy: OnError) -> (Out, Vec<String>) {
    let t = |a: usize, b: usize| Some((size(a) + size(b)) as u64);
    let s = |i: usize| Some(size(i) as u64);
    match (kind, policy) {
        (Kind::Map | Kind::BatchMap, OnError::Null) => (
            out(&[
                ("0", t(0, 1)),
                ("1", None),
                ("2", t(2, 2)),
                ("3", None),
                ("4", t(4, 5)),
                ("5", t(5, 4)),
            ]),
            vec![],
        ),
        (Kind::Map | Kind::BatchMap, OnError::Skip) => (
            out(&[
                ("0", t(0, 1)),
                ("2", t(2, 2)),
                ("4", t(4, 5)),
                ("5", t(5, 4)),
            ]),
            vec![url("f1.bin"), url("f3.bin")],
        ),
        (Kind::Gen, OnError::Null) => (
            out(&[
                ("0", s(0)),
                ("0", s(1)),
                ("1", None),
                ("2", s(2)),
                ("2", s(2)),
                ("3", None),
                ("4", s(4)),
                ("4", s(5)),
                ("5", s(5)),
                ("5", s(4)),
            ]),
            vec![],
        ),
        (Kind::Gen, OnError::Skip) => (
            out(&[
                ("0", s(0)),
                ("0", s(1)),
                ("2", s(2)),
                ("2", s(2)),
                ("4", s(4)),
                ("4", s(5)),
                ("5", s(5)),
                ("5", s(4)),
            ]),
            vec![url("f1.bin"), url("f3.bin")],
        ),
        (Kind::Agg, OnError::Null) => (
            out(&[
                ("g0", t(0, 1)),
                ("g1", None),
                ("g2", None),
                ("g3", Some((2 * (size(4) + size(5))) as u64)),
            ]),
            vec![],
        ),
        // Every input row of a failed group is listed.
        (Kind::Agg, OnError::Skip) => (
            out(&[
                ("g0", t(0, 1)),
                ("g3", Some((2 * (size(4) + size(5))) as u64)),
            ]),
            vec![url("f1.bin"), url("f2.bin"), url("f3.bin")],
        ),
        (_, OnError::Fail) => unreachable!("fail has no output"),
    }
}

fn six_files() -> Vec<(String, usize)> {
    (0..6).map(|i| (format!("f{i}.bin"), size(i))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_under_every_policy() {
    let objects = six_files();
    let objects: Vec<(&str, usize)> = objects.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let fx = Fixture::new(&objects);
    for kind in [Kind::Map, Kind::Gen, Kind::BatchMap, Kind::Agg] {
        for policy in [OnError::Null, OnError::Skip] {
            let case = format!("{kind:?} x {policy:?}");
            let (got, report) = run(&fx, kind, policy, &rows()).await.expect(&case);
            let (want, skipped) = expected(kind, policy);
            assert_eq!(got, want, "{case}: output rows");
            assert_eq!(report.skipped, skipped, "{case}: skip list");
            assert_eq!(report.skipped_unlisted, 0, "{case}");
            let op = match kind {
                Kind::Map => "MapExec",
                Kind::Gen => "GenerateExec",
                Kind::BatchMap => "BatchMapExec",
                Kind::Agg => "AggregateExec",
            };
            assert_eq!(
                report.metric(op, "skipped_rows"),
                skipped.len(),
                "{case}: skipped_rows"
            );
            assert_eq!(report.metric(op, "copies_left"), 0, "{case}: copies left");
            assert!(
                report.metric("PrefetchExec", "files_fetched") >= 6,
                "{case}: files came through the prefetch"
            );
            let left = no_prefetch_dirs_soon(&fx.tmp()).await;
            assert!(left.is_empty(), "{case}: temp dirs left: {left:?}");
        }
        // `fail`: the first failing row (row 1; for agg the first row of
        // group g1, row 1 of the sorted input), its first file and the UDF.
        let case = format!("{kind:?} x Fail");
        let err = run(&fx, kind, OnError::Fail, &rows())
            .await
            .expect_err(&case);
        let udf_name = match kind {
            Kind::BatchMap => "totals",
            _ => "v",
        };
        match &err {
            Error::Udf { udf, file, row, .. } => {
                assert_eq!(udf, udf_name, "{case}");
                assert_eq!(file.as_deref(), Some(url("f1.bin").as_str()), "{case}");
                assert_eq!(*row, Some(1), "{case}");
            }
            other => panic!("{case}: expected a UDF error, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("cannot decode f1.bin"), "{case}: {msg}");
        if kind == Kind::Agg {
            assert!(msg.contains("call of 2 rows"), "{case}: {msg}");
        }
        let left = no_prefetch_dirs_soon(&fx.tmp()).await;
        assert!(left.is_empty(), "{case}: temp dirs left: {left:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_call_failing_as_a_whole_nulls_or_skips_its_rows() {
    let objects = six_files();
    let objects: Vec<(&str, usize)> = objects.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let fx = Fixture::new(&objects);
    let chain = |policy| {
        Chain::from_values_in(Arc::clone(&fx.session), &rows())
            .settings(Settings::new().batch_size(2).parallel(2).on_error(policy))
            .batch_map_on(&["id", "a", "b"], "v", |ps: Vec<Pair>| async move {
                let mut out = Vec::new();
                for p in &ps {
                    if bad(p) {
                        return Err(boom(&p.a.path));
                    }
                    out.push(total(p).await?);
                }
                Ok(out)
            })
            .select([col("id"), col("v")])
    };
    #[derive(Deserialize, Debug, PartialEq)]
    struct R {
        id: u64,
        v: Option<u64>,
    }
    let t = |a: usize, b: usize| Some((size(a) + size(b)) as u64);
    // Calls [0, 1], [2, 3], [4, 5]: the first two fail as a whole.
    let nulls: Vec<R> = chain(OnError::Null).to_rows().await.expect("null");
    let want = [
        (0, None),
        (1, None),
        (2, None),
        (3, None),
        (4, t(4, 5)),
        (5, t(5, 4)),
    ];
    assert_eq!(
        nulls,
        want.map(|(id, v)| R { id, v })
            .into_iter()
            .collect::<Vec<_>>()
    );
    let (batches, report) = chain(OnError::Skip)
        .collect_with_report()
        .await
        .expect("skip");
    let kept: Vec<R> = batches
        .iter()
        .flat_map(|b| serde_arrow::from_record_batch::<Vec<R>>(b).expect("rows"))
        .collect();
    assert_eq!(kept, vec![R { id: 4, v: t(4, 5) }, R { id: 5, v: t(5, 4) }]);
    let want: Vec<String> = (0..4).map(|i| url(&rows()[i].a.path)).collect();
    assert_eq!(report.skipped, want);
    let err = chain(OnError::Fail).collect().await.expect_err("fail");
    let msg = err.to_string();
    assert!(
        msg.contains("on s3://bucket/onerr/f0.bin (row 0)")
            && msg.contains("call of 2 rows")
            && msg.contains("cannot decode f1.bin"),
        "{msg}"
    );
}

/// Downloads that fail (missing objects) in the first or the second `File`
/// column, under every kind: `skip` drops those rows (listed by the
/// prefetch), `null` lets the UDF's read fail into a null; either way every
/// prefetched copy is released by the end of the output (`copies_left = 0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_downloads_under_every_kind_leave_no_copy_held() {
    let objects = six_files();
    let objects: Vec<(&str, usize)> = objects.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let fx = Fixture::new(&objects);
    let f = |i: usize| file(&format!("f{i}.bin"), size(i));
    let row = |id: u64, key: &str, a: File, b: File| Row {
        id,
        key: key.to_string(),
        a,
        b,
    };
    let rows = vec![
        row(0, "g0", f(0), f(1)),
        row(1, "g1", file("gone.x1", 100), f(2)),
        row(2, "g1", f(2), f(4)),
        row(3, "g2", f(5), file("gone.x3", 100)),
        row(4, "g3", f(0), f(0)),
    ];
    let t = |a: usize, b: usize| Some((size(a) + size(b)) as u64);
    let s = |i: usize| Some(size(i) as u64);
    for kind in [Kind::Map, Kind::Gen, Kind::BatchMap, Kind::Agg] {
        for policy in [OnError::Skip, OnError::Null] {
            let case = format!("{kind:?} x {policy:?}");
            let want = match (kind, policy) {
                (Kind::Map | Kind::BatchMap, OnError::Skip) => {
                    out(&[("0", t(0, 1)), ("2", t(2, 4)), ("4", t(0, 0))])
                }
                (Kind::Map | Kind::BatchMap, _) => out(&[
                    ("0", t(0, 1)),
                    ("1", None),
                    ("2", t(2, 4)),
                    ("3", None),
                    ("4", t(0, 0)),
                ]),
                (Kind::Gen, OnError::Skip) => out(&[
                    ("0", s(0)),
                    ("0", s(1)),
                    ("2", s(2)),
                    ("2", s(4)),
                    ("4", s(0)),
                    ("4", s(0)),
                ]),
                (Kind::Gen, _) => out(&[
                    ("0", s(0)),
                    ("0", s(1)),
                    ("1", None),
                    ("2", s(2)),
                    ("2", s(4)),
                    ("3", None),
                    ("4", s(0)),
                    ("4", s(0)),
                ]),
                // Group g1 loses row 1 under skip, and fails under null.
                (Kind::Agg, OnError::Skip) => {
                    out(&[("g0", t(0, 1)), ("g1", t(2, 4)), ("g3", t(0, 0))])
                }
                (Kind::Agg, _) => {
                    out(&[("g0", t(0, 1)), ("g1", None), ("g2", None), ("g3", t(0, 0))])
                }
            };
            let (got, report) = run(&fx, kind, policy, &rows).await.expect(&case);
            assert_eq!(got, want, "{case}");
            let skipped = if policy == OnError::Skip {
                vec![url("gone.x1"), url("gone.x3")]
            } else {
                vec![]
            };
            assert_eq!(report.skipped, skipped, "{case}");
            assert_eq!(
                report.metric("PrefetchExec", "skipped_files"),
                skipped.len(),
                "{case}"
            );
            let op = match kind {
                Kind::Map => "MapExec",
                Kind::Gen => "GenerateExec",
                Kind::BatchMap => "BatchMapExec",
                Kind::Agg => "AggregateExec",
            };
            assert_eq!(report.metric(op, "copies_left"), 0, "{case}: copies left");
            let left = no_prefetch_dirs_soon(&fx.tmp()).await;
            assert!(left.is_empty(), "{case}: temp dirs left: {left:?}");
        }
    }
}

/// Names of the objects whose copies are in the prefetch temp dirs under
/// `tmp`, by extension (`c4.e4` is downloaded to `<n>.e4`).
fn held(tmp: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for dir in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = f.file_name().to_string_lossy().to_string();
            if let Some((_, ext)) = name.rsplit_once('.')
                && f.file_name() != udfchain::testing::LOCK_FILE
            {
                out.insert(ext.to_string());
            }
        }
    }
    out
}

/// A row id and the objects held in the temp dir when its UDF started.
type Sample = (u64, BTreeSet<String>);

/// Extensions of the objects of `row` (`c4.e4` -> `e4`).
fn exts(row: &Row) -> BTreeSet<String> {
    [&row.a, &row.b]
        .into_iter()
        .filter_map(|f| f.path.rsplit_once('.').map(|(_, e)| e.to_string()))
        .collect()
}

/// Whether `tmp` holds a complete copy (`len` bytes) of the object with extension `ext`.
fn holds_complete(tmp: &Path, ext: &str, len: u64) -> bool {
    std::fs::read_dir(tmp)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .any(|f| {
            f.file_name()
                .to_string_lossy()
                .ends_with(&format!(".{ext}"))
                && f.metadata().is_ok_and(|m| m.len() == len)
        })
}

/// Prefetch reference counts under `skip` and `null`, with copies on disk:
/// rows sharing a file, a row with one file in both columns, a download that
/// fails in the first or the second column of a row, and a UDF that fails.
/// While each row's UDF runs, the temp dir holds the row's own copies (none
/// deleted early) and nothing but the copies of this row, of the two rows
/// after it and of earlier rows not called yet (rows are called as their
/// downloads finish; none held past its row); every object is downloaded
/// once; the temp dir is gone after the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_copies_are_released_exactly_once_per_row() {
    // Object `c<i>.e<i>` has i + 1000 bytes; `gone.x3`, `gone.x5` do not exist.
    let names: Vec<String> = (0..14).map(|i| format!("c{i}.e{i}")).collect();
    let objects: Vec<(&str, usize)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), 1000 + i))
        .collect();
    let fx = Fixture::new(&objects);
    let c = |i: usize| file(&names[i], 1000 + i);
    let gone = |ext: &str| file(&format!("gone.{ext}"), 1000);
    let row = |id: u64, a: File, b: File| Row {
        id,
        key: String::new(),
        a,
        b,
    };
    let rows = vec![
        row(0, c(0), c(0)),       // one file in both columns
        row(1, c(1), c(2)),       // c2 shared with the next row
        row(2, c(2), c(3)),       //
        row(3, gone("x3"), c(4)), // first column fails; c4 shared with row 4
        row(4, c(5), c(4)),       //
        row(5, c(6), gone("x5")), // second column fails after c6 was fetched
        row(6, c(7), c(8)),       // the UDF fails on c7
        row(7, c(9), c(10)),      //
        row(8, c(11), c(12)),     //
        row(9, c(13), c(13)),     //
    ];

    for policy in [OnError::Skip, OnError::Null] {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let (tmp, seen) = (fx.tmp(), Arc::clone(&samples));
        let gets_before: Vec<usize> = names.iter().map(|n| fx.store.get_starts(n).len()).collect();
        let chain = Chain::from_values_in(Arc::clone(&fx.session), &rows)
            .settings(
                Settings::new()
                    .prefetch(2)
                    .parallel(1)
                    .memory_file_limit(0)
                    .on_error(policy),
            )
            .map_on(&["id", "a", "b"], "v", move |p: Pair| {
                let (tmp, seen) = (tmp.clone(), Arc::clone(&seen));
                async move {
                    seen.lock().expect("samples").push((p.id, held(&tmp)));
                    if p.id == 3 {
                        // Let row 4 hold its copy of c4 before this row is released.
                        let deadline = Instant::now() + Duration::from_secs(10);
                        while !holds_complete(&tmp, "e4", 1004) && Instant::now() < deadline {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    if p.a.path == "c7.e7" {
                        return Err(boom("c7"));
                    }
                    total(&p).await
                }
            })
            .select([col("id"), col("v")]);
        let (batches, report) = chain.collect_with_report().await.expect("run");
        #[derive(Deserialize)]
        struct R {
            id: u64,
            v: Option<u64>,
        }
        let got: Vec<(u64, Option<u64>)> = batches
            .iter()
            .flat_map(|b| serde_arrow::from_record_batch::<Vec<R>>(b).expect("rows"))
            .map(|r| (r.id, r.v))
            .collect();
        let t = |a: usize, b: usize| Some(2000 + a as u64 + b as u64);
        let case = format!("{policy:?}");
        match policy {
            OnError::Skip => {
                assert_eq!(
                    got,
                    vec![
                        (0, t(0, 0)),
                        (1, t(1, 2)),
                        (2, t(2, 3)),
                        (4, t(5, 4)),
                        (7, t(9, 10)),
                        (8, t(11, 12)),
                        (9, t(13, 13)),
                    ],
                    "{case}"
                );
                // The UDF's skip first (top of the plan), then the prefetch's.
                assert_eq!(
                    report.skipped,
                    vec![url("c7.e7"), url("gone.x3"), url("gone.x5")],
                    "{case}"
                );
            }
            _ => {
                let want: Vec<(u64, Option<u64>)> = vec![
                    (0, t(0, 0)),
                    (1, t(1, 2)),
                    (2, t(2, 3)),
                    (3, None),
                    (4, t(5, 4)),
                    (5, None),
                    (6, None),
                    (7, t(9, 10)),
                    (8, t(11, 12)),
                    (9, t(13, 13)),
                ];
                assert_eq!(got, want, "{case}");
            }
        }
        let samples = samples.lock().expect("samples").clone();
        assert_eq!(
            samples.len(),
            got.len() + usize::from(policy == OnError::Skip),
            "{case}"
        );
        let mut called = BTreeSet::new();
        for (id, present) in &samples {
            let k = *id as usize;
            let own: BTreeSet<String> = exts(&rows[k])
                .into_iter()
                .filter(|e| e.starts_with('e'))
                .collect();
            assert!(
                own.is_subset(present),
                "{case}: row {k} runs without its own copies {own:?}: {present:?}"
            );
            // Rows reach the UDF as their downloads finish (`ordered = true`
            // reorders the results): an earlier row may still be downloading,
            // but a row called before holds nothing any more.
            let window: BTreeSet<String> = rows[..(k + 3).min(rows.len())]
                .iter()
                .filter(|r| !called.contains(&r.id))
                .flat_map(exts)
                .collect();
            called.insert(*id);
            assert!(
                present.is_subset(&window),
                "{case}: while row {k} runs, copies beyond its window are held: {present:?} (window {window:?})"
            );
        }
        assert_eq!(report.metric("MapExec", "copies_left"), 0, "{case}");
        for (i, n) in names.iter().enumerate() {
            let gets = fx.store.get_starts(n).len() - gets_before[i];
            // c2 is in rows 1 and 2 with nothing holding row 1 back: when row 1
            // is done and released before row 2's fetch starts (a loaded
            // machine), c2 is rightly gone and fetched again. Every other
            // object is fetched once (row 3 waits until row 4 holds c4).
            let allowed = if n.starts_with("c2.") { 1..=2 } else { 1..=1 };
            assert!(
                allowed.contains(&gets),
                "{case}: {n} downloaded {gets} times"
            );
        }
        let left = no_prefetch_dirs_soon(&fx.tmp()).await;
        assert!(left.is_empty(), "{case}: temp dirs left: {left:?}");
    }
}

/// One slow row among fast ones: `ordered = false` emits it last, `ordered =
/// true` keeps input order, in every operator. The slow call waits until every
/// other call has finished (no timing), then a little more so their results
/// are ready first.
async fn slow_first(kind: Kind, ordered: bool) -> Vec<u64> {
    const N: usize = 6;
    let rows: Vec<Row> = (0..N as u64)
        .map(|id| Row {
            id,
            key: format!("k{id}"),
            a: file("x.bin", 1),
            b: file("y.bin", 1),
        })
        .collect();
    let done = Arc::new(AtomicUsize::new(0));
    let wait = move |id: u64, done: Arc<AtomicUsize>| async move {
        if id == 0 {
            let deadline = Instant::now() + Duration::from_secs(20);
            while done.load(Ordering::SeqCst) < N - 1 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        } else {
            done.fetch_add(1, Ordering::SeqCst);
        }
    };
    // No prefetch: the UDFs read no file, but the `File` columns make map
    // call one row at a time.
    let chain = Chain::from_values_in(Session::new(), &rows).settings(
        Settings::new()
            .prefetch(0)
            .parallel(N)
            .batch_size(1)
            .ordered(ordered),
    );
    let chain = match kind {
        Kind::Map => chain.map_on(&["id"], "v", move |id: u64| {
            let done = Arc::clone(&done);
            async move {
                wait(id, done).await;
                Ok::<_, std::io::Error>(id)
            }
        }),
        Kind::BatchMap => chain.batch_map_on(&["id"], "v", move |ids: Vec<u64>| {
            let done = Arc::clone(&done);
            async move {
                for &id in &ids {
                    wait(id, Arc::clone(&done)).await;
                }
                Ok::<_, std::io::Error>(ids)
            }
        }),
        Kind::Gen => chain.gen_on(&["id"], "v", move |id: u64| {
            let done = Arc::clone(&done);
            futures::stream::once(async move {
                wait(id, done).await;
                Ok::<_, std::io::Error>(id)
            })
        }),
        Kind::Agg => chain.agg(&["key"], &["id"], "v", move |ids: Vec<u64>| {
            let done = Arc::clone(&done);
            async move {
                for &id in &ids {
                    wait(id, Arc::clone(&done)).await;
                }
                Ok::<_, std::io::Error>(ids)
            }
        }),
    };
    #[derive(Deserialize)]
    struct R {
        v: u64,
    }
    chain
        .select([col("v")])
        .to_rows::<R>()
        .await
        .expect("run")
        .into_iter()
        .map(|r| r.v)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_emits_the_slow_row_last_ordered_keeps_input_order() {
    for kind in [Kind::Map, Kind::BatchMap, Kind::Gen, Kind::Agg] {
        assert_eq!(
            slow_first(kind, true).await,
            vec![0, 1, 2, 3, 4, 5],
            "{kind:?} ordered"
        );
        let got = slow_first(kind, false).await;
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            vec![0, 1, 2, 3, 4, 5],
            "{kind:?} unordered: {got:?}"
        );
        assert_eq!(got.last(), Some(&0), "{kind:?} unordered: {got:?}");
    }
}

/// A generator that fails after streaming part of its expansion: the batches
/// already emitted stay (an expansion is never held whole); `null` adds one
/// row with a null output for the failed row, `skip` lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generator_failing_midway_keeps_what_it_streamed() {
    #[derive(Serialize, Deserialize)]
    struct N {
        n: u64,
    }
    let chain = |policy| {
        Chain::from_values_in(Session::new(), &[N { n: 1 }, N { n: 2 }, N { n: 3 }])
            .settings(Settings::new().batch_size(1).parallel(2).on_error(policy))
            .gen_on(&["n"], "v", |n: u64| {
                futures::stream::iter((0..3).map(move |i| {
                    if n == 2 && i == 2 {
                        Err(std::io::Error::other("truncated"))
                    } else {
                        Ok(n * 10 + i)
                    }
                }))
            })
            .select([col("n"), col("v")])
    };
    #[derive(Deserialize, Debug, PartialEq)]
    struct R {
        n: u64,
        v: Option<u64>,
    }
    let r = |n, v| R { n, v };
    let nulls: Vec<R> = chain(OnError::Null).to_rows().await.expect("null");
    assert_eq!(
        nulls,
        vec![
            r(1, Some(10)),
            r(1, Some(11)),
            r(1, Some(12)),
            r(2, Some(20)),
            r(2, Some(21)),
            r(2, None),
            r(3, Some(30)),
            r(3, Some(31)),
            r(3, Some(32)),
        ]
    );
    let (batches, report) = chain(OnError::Skip)
        .collect_with_report()
        .await
        .expect("skip");
    let kept: Vec<R> = batches
        .iter()
        .flat_map(|b| serde_arrow::from_record_batch::<Vec<R>>(b).expect("rows"))
        .collect();
    assert_eq!(kept.len(), 8, "{kept:?}");
    assert_eq!(report.skipped, vec!["v row 1".to_string()]);
}

/// More skipped rows than a skip list keeps: the first 1,000 are listed, the
/// rest counted; `skipped_rows` counts every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_lists_are_bounded_and_the_overflow_counted() {
    const N: u64 = 1_005;
    let ids: Vec<u64> = (0..N).collect();
    let (batches, report) = Chain::from_values_in(Session::new(), &ids)
        .settings(Settings::new().parallel(4).on_error(OnError::Skip))
        .map_on(&["value"], "v", |id: u64| async move {
            if id.is_multiple_of(2) || id > 10 {
                Err(std::io::Error::other("no"))
            } else {
                Ok(id)
            }
        })
        .collect_with_report()
        .await
        .expect("run");
    let kept: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(kept, 5, "ids 1, 3, 5, 7, 9");
    let skipped = N as usize - 5;
    assert_eq!(report.skipped.len(), 1_000);
    assert_eq!(report.skipped[..3], ["v row 0", "v row 2", "v row 4"]);
    assert_eq!(report.skipped_unlisted, skipped - 1_000);
    assert_eq!(report.metric("MapExec", "skipped_rows"), skipped);
}

/// Under `on_error = skip` with `cache = true`, a row dropped because its
/// second file failed to download releases its first file's shared-cache pin
/// at once, not when the stream ends (as it would if that file went back
/// through the temp cache only). Here `K` such rows come first; when the last
/// row's UDF runs, a prune of the whole cache removes every entry but the
/// pinned ones (the window's few rows), so fewer than `K` may be left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_skipped_under_cache_release_their_shared_cache_pins_at_once() {
    const K: usize = 10;
    const GOOD: usize = 6;
    let names: Vec<String> = (0..K + 2 * GOOD).map(|i| format!("p{i}.bin")).collect();
    let objects: Vec<(&str, usize)> = names.iter().map(|n| (n.as_str(), 200)).collect();
    let fx = Fixture::new(&objects);
    let f = |i: usize| file(&names[i], 200);
    let mut rows: Vec<Row> = (0..K)
        .map(|i| Row {
            id: i as u64,
            key: "k".into(),
            a: f(i),
            b: file(&format!("gone{i}.bin"), 100),
        })
        .collect();
    rows.extend((0..GOOD).map(|j| Row {
        id: (K + j) as u64,
        key: "k".into(),
        a: f(K + 2 * j),
        b: f(K + 2 * j + 1),
    }));
    let cache_dir = fx.root.path().join("cache");
    let last = (K + GOOD - 1) as u64;
    let left: Arc<Mutex<Option<u64>>> = Arc::default();
    let seen = Arc::clone(&left);
    let chain = Chain::from_values_in(Arc::clone(&fx.session), &rows)
        .settings(
            Settings::new()
                .prefetch(2)
                .parallel(1)
                .cache(true)
                .on_error(OnError::Skip),
        )
        .map_on(&["id", "a", "b"], "v", move |p: Pair| {
            let (cache_dir, seen) = (cache_dir.clone(), Arc::clone(&seen));
            async move {
                let n = total(&p).await?;
                if p.id == last {
                    let cache = udfchain::SharedCache::open(&cache_dir, None)?;
                    cache.prune_to(0)?;
                    *seen.lock().expect("lock") = Some(cache.du()?.files);
                }
                Ok::<u64, BoxError>(n)
            }
        });
    let (batches, report) = chain.collect_with_report().await.expect("run");
    let kept: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(kept, GOOD);
    assert_eq!(report.skipped.len(), K);
    let left = left.lock().expect("lock").expect("the last row ran");
    assert!(
        (left as usize) < K,
        "{left} cache entries still pinned while the last row ran: the skipped rows' pins were kept"
    );
}
