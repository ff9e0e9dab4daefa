//! Each UDF kind: map (struct output), gen (0, 1, 10,000 rows), batch_map
//! (last partial batch), agg (groups), and parallel = 4 vs 1.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::stream;
use serde::{Deserialize, Serialize};
use udfchain::{Chain, File, Session, Settings, col};

use udfchain_testkit::write_files;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Meta {
    name: String,
    len: u64,
    even: bool,
}

async fn meta(f: File) -> Result<Meta, udfchain::udfs::UdfError> {
    let bytes = f.read().await?;
    Ok(Meta {
        name: f.name().to_string(),
        len: bytes.len() as u64,
        even: bytes.len() % 2 == 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_returns_a_struct_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_files(dir.path(), 5, |i| 10 + i);
    let chain = Session::new()
        .from_storage(&dir.path().display().to_string())
        .map("meta", meta)
        .order_by([col("file.path").sort(true, false)]);
    let batches = chain.collect().await.expect("run");
    let schema = batches[0].schema();
    let field = schema.field_with_name("meta").expect("meta column");
    assert!(
        matches!(field.data_type(), datafusion::arrow::datatypes::DataType::Struct(f) if f.len() == 3)
    );

    #[derive(Deserialize)]
    struct Out {
        meta: Meta,
    }
    let mut rows: Vec<Out> = chain.to_rows().await.expect("rows");
    rows.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
    let lens: Vec<u64> = rows.iter().map(|r| r.meta.len).collect();
    assert_eq!(lens, vec![10, 11, 12, 13, 14]);
    assert!(rows[0].meta.even && !rows[1].meta.even);
    // The UDF is named after the Rust function in EXPLAIN.
    let explain = chain.explain().await.expect("explain");
    assert!(explain.contains("MapExec: udf=meta"), "{explain}");
    assert!(explain.contains("Udf: kind=map, name=meta"), "{explain}");
}

#[derive(Debug, Serialize, Deserialize)]
struct Count {
    n: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_with_zero_one_and_ten_thousand_outputs() {
    let counts = [
        Count { n: 0 },
        Count { n: 1 },
        Count { n: 10_000 },
        Count { n: 3 },
    ];
    let chain = Chain::from_values_in(Session::new(), &counts)
        .settings(Settings::new().batch_size(500).parallel(2))
        .gen_on(&["n"], "i", |n: u64| {
            stream::iter((0..n).map(Ok::<u64, std::io::Error>))
        });
    let batches = chain.collect().await.expect("run");
    let mut per_n: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for b in &batches {
        assert!(
            b.num_rows() <= 500,
            "an expansion is streamed in batches of batch_size"
        );
        #[derive(Deserialize)]
        struct R {
            n: u64,
            i: u64,
        }
        let rows: Vec<R> = serde_arrow::from_record_batch(b).expect("rows");
        for r in rows {
            per_n.entry(r.n).or_default().push(r.i);
        }
    }
    assert!(!per_n.contains_key(&0));
    assert_eq!(per_n[&1], vec![0]);
    assert_eq!(per_n[&3], vec![0, 1, 2]);
    assert_eq!(
        per_n[&10_000],
        (0..10_000).collect::<Vec<_>>(),
        "order within a row is kept"
    );
    assert!(
        batches.len() >= 20,
        "10,000 rows came in {} batches",
        batches.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_over_files_expands_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.txt"), "x\ny\nz\n").expect("write");
    std::fs::write(dir.path().join("b.txt"), "").expect("write");
    let lines: Vec<Line> = Session::new()
        .from_storage(&dir.path().display().to_string())
        .r#gen("line", |f: File| {
            stream::once(async move { f.read_text().await })
                .map(|t| match t {
                    Ok(t) => stream::iter(t.lines().map(|l| Ok(l.to_string())).collect::<Vec<_>>()),
                    Err(e) => stream::iter(vec![Err(e)]),
                })
                .flatten()
        })
        .select([col("line")])
        .to_rows()
        .await
        .expect("run");
    let got: Vec<_> = lines.into_iter().map(|l| l.line).collect();
    assert_eq!(got, vec!["x", "y", "z"]);
}

use futures::StreamExt;

#[derive(Deserialize)]
struct Line {
    line: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_map_gets_full_batches_then_the_rest() {
    let values: Vec<Count> = (0..10).map(|n| Count { n }).collect();
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&sizes);
    #[derive(Deserialize)]
    struct R {
        n: u64,
        sq: u64,
    }
    let rows: Vec<R> = Chain::from_values_in(Session::new(), &values)
        .settings(Settings::new().batch_size(4).parallel(1))
        .batch_map_on(&["n"], "sq", move |ns: Vec<u64>| {
            seen.lock().expect("lock").push(ns.len());
            async move { Ok::<_, std::io::Error>(ns.iter().map(|n| n * n).collect::<Vec<u64>>()) }
        })
        .to_rows()
        .await
        .expect("run");
    assert_eq!(*sizes.lock().expect("lock"), vec![4, 4, 2]);
    assert_eq!(rows.len(), 10);
    for r in rows {
        assert_eq!(r.sq, r.n * r.n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_map_with_wrong_output_count_fails() {
    let values: Vec<Count> = (0..3).map(|n| Count { n }).collect();
    let err = Chain::from_values_in(Session::new(), &values)
        .batch_map_on(&["n"], "bad", |_ns: Vec<u64>| async move {
            Ok::<_, std::io::Error>(vec![1u64])
        })
        .collect()
        .await
        .expect_err("wrong count must fail");
    assert!(
        err.to_string().contains("returned 1 values for 3 rows"),
        "{err}"
    );
}

#[derive(Debug, Serialize, Deserialize)]
struct Labeled {
    label: String,
    x: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agg_calls_once_per_group() {
    // Interleaved labels across several input batches: groups must still be whole.
    let values: Vec<Labeled> = (0..3000)
        .map(|i| Labeled {
            label: ["a", "b", "c", "d"][i % 4].to_string(),
            x: i as i64,
        })
        .collect();
    let calls = Arc::new(Mutex::new(0usize));
    let c = Arc::clone(&calls);
    #[derive(Debug, Deserialize, PartialEq)]
    struct R {
        label: String,
        stats: (i64, u64),
    }
    let mut rows: Vec<R> = Chain::from_values_in(Session::new(), &values)
        .agg(&["label"], &["x"], "stats", move |xs: Vec<i64>| {
            *c.lock().expect("lock") += 1;
            // Two output rows per group: (sum, count) and (max, count).
            let n = xs.len() as u64;
            let out = vec![
                (xs.iter().sum::<i64>(), n),
                (*xs.iter().max().unwrap_or(&0), n),
            ];
            async move { Ok::<_, std::io::Error>(out) }
        })
        .to_rows()
        .await
        .expect("run");
    rows.sort_by(|a, b| (&a.label, a.stats).cmp(&(&b.label, b.stats)));
    assert_eq!(*calls.lock().expect("lock"), 4);
    assert_eq!(rows.len(), 8);
    let a_sum: i64 = (0..3000).filter(|i| i % 4 == 0).sum();
    assert_eq!(
        rows[0],
        R {
            label: "a".into(),
            stats: (2996, 750)
        }
    );
    assert_eq!(
        rows[1],
        R {
            label: "a".into(),
            stats: (a_sum, 750)
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agg_groups_files_by_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_files(dir.path(), 9, |i| i + 1);
    #[derive(Debug, Deserialize)]
    struct R {
        dir: String,
        total: u64,
    }
    let mut rows: Vec<R> = Session::new()
        .from_storage(&dir.path().display().to_string())
        .mutate(
            "dir",
            datafusion::functions::expr_fn::split_part(
                col("file.path"),
                udfchain::lit("/"),
                udfchain::lit(1),
            ),
        )
        .agg(
            &["dir"],
            &["file"],
            "total",
            |files: Vec<File>| async move {
                let mut total = 0u64;
                for f in files {
                    total += f.read().await?.len() as u64;
                }
                Ok::<_, udfchain::udfs::UdfError>(vec![total])
            },
        )
        .to_rows()
        .await
        .expect("run");
    rows.sort_by(|a, b| a.dir.cmp(&b.dir));
    let totals: Vec<(String, u64)> = rows.into_iter().map(|r| (r.dir, r.total)).collect();
    // d0: files 0,3,6 (1+4+7), d1: 1,4,7 (2+5+8), d2: 2,5,8 (3+6+9)
    assert_eq!(
        totals,
        vec![("d0".into(), 12), ("d1".into(), 15), ("d2".into(), 18)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_four_gives_the_same_rows_as_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_files(dir.path(), 40, |i| 5 + i * 3);
    let uri = dir.path().display().to_string();
    let run = |parallel: usize| {
        let uri = uri.clone();
        async move {
            #[derive(Deserialize)]
            struct R {
                path: String,
                meta: Meta,
            }
            let mut rows: Vec<(String, u64)> = Session::new()
                .from_storage(&uri)
                .settings(Settings::new().parallel(parallel))
                .map("meta", meta)
                .select([col("file.path").alias("path"), col("meta")])
                .to_rows::<R>()
                .await
                .expect("run")
                .into_iter()
                .map(|r| (r.path, r.meta.len))
                .collect();
            rows.sort();
            rows
        }
    };
    let one = run(1).await;
    let four = run(4).await;
    assert_eq!(one.len(), 40);
    assert_eq!(one, four);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_on_several_columns_reads_a_struct() {
    #[derive(Serialize, Deserialize)]
    struct In {
        a: i64,
        b: String,
    }
    let vals = vec![
        In {
            a: 1,
            b: "x".into(),
        },
        In {
            a: 2,
            b: "yy".into(),
        },
    ];
    #[derive(Deserialize)]
    struct R {
        out: String,
    }
    let rows: Vec<R> = Chain::from_values_in(Session::new(), &vals)
        .map_on(&["a", "b"], "out", |i: In| async move {
            Ok::<_, std::io::Error>(format!("{}{}", i.b, i.a))
        })
        .to_rows()
        .await
        .expect("run");
    let got: Vec<_> = rows.into_iter().map(|r| r.out).collect();
    assert_eq!(got, vec!["x1", "yy2"]);
}

/// `gen` over a union (two input partitions sharing the UDF's `parallel`
/// slots) with expansions larger than a job's channel streams every row. The
/// deadlock it guards against: slots all held by jobs blocked on full
/// channels while each partition drains only its head job (waiting for a
/// slot), so no row ever comes. Whether the first jobs to take the slots are
/// heads is a race, so the run is repeated (an operator with that deadlock
/// hits it in 1 run of 2 to 4 here); the timeout makes a deadlock fail the
/// test instead of hanging it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_over_a_union_of_two_partitions_streams_every_row() {
    let rows: Vec<Count> = (0..6).map(|_| Count { n: 200 }).collect();
    let side = || {
        Chain::new()
            .settings(Settings::new().parallel(2).batch_size(4))
            .from_values(&rows)
    };
    for run in 0..20 {
        let chain = side().union(side()).gen_on(&["n"], "x", |n: u64| {
            stream::iter((0..n).map(Ok::<u64, std::io::Error>))
        });
        let batches = tokio::time::timeout(std::time::Duration::from_secs(30), chain.collect())
            .await
            .unwrap_or_else(|_| panic!("run {run}: the generator deadlocked (no result in 30 s)"))
            .expect("run");
        let total: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(total, 12 * 200, "run {run}");
        assert!(batches.iter().all(|b| b.num_rows() <= 4), "run {run}");
    }
}
