//! Dataset verbs (diff, file_diff, subtract, shuffle, sample, chunk), each
//! checked against the same result computed another way (Rust sets and maps).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use udfchain::{Chain, Diff, Session, Settings, col};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Row {
    id: i64,
    value: Option<String>,
    n: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
struct WithStatus {
    id: i64,
    value: Option<String>,
    n: i64,
    status: String,
}

/// Two versions: ids 0..40 and 10..50; values change for some ids, some null.
fn versions() -> (Vec<Row>, Vec<Row>) {
    let value = |id: i64, v: i64| match (id + v) % 7 {
        0 => None,
        _ if id % 5 == 0 => Some(format!("v{v}-{id}")),
        _ => Some(format!("{id}")),
    };
    let new = (0..40)
        .map(|id| Row {
            id,
            value: value(id, 1),
            n: id,
        })
        .collect();
    let old = (10..50)
        .map(|id| Row {
            id,
            value: value(id, 2),
            n: id,
        })
        .collect();
    (new, old)
}

/// The expected diff: by id; a null value on either side is modified.
fn expected(new: &[Row], old: &[Row], keep: &str) -> BTreeSet<WithStatus> {
    let by_id =
        |rows: &[Row]| -> BTreeMap<i64, Row> { rows.iter().map(|r| (r.id, r.clone())).collect() };
    let (n, o) = (by_id(new), by_id(old));
    let mut out = BTreeSet::new();
    let mut push = |r: &Row, s: &str| {
        if keep.contains(s) {
            out.insert(WithStatus {
                id: r.id,
                value: r.value.clone(),
                n: r.n,
                status: s.to_string(),
            });
        }
    };
    for (id, r) in &n {
        match o.get(id) {
            None => push(r, "A"),
            Some(x)
                if r.value.is_none() || x.value.is_none() || r.value != x.value || r.n != x.n =>
            {
                push(r, "M")
            }
            Some(_) => push(r, "S"),
        }
    }
    for (id, r) in &o {
        if !n.contains_key(id) {
            push(r, "D");
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_equals_a_set_difference_of_two_versions() {
    let s = Session::new();
    let (new, old) = versions();
    for keep in ["ADM", "ADMS", "A", "D", "M", "S", "AS", ""] {
        let d = Diff::on(&["id"])
            .added(keep.contains('A'))
            .deleted(keep.contains('D'))
            .modified(keep.contains('M'))
            .same(keep.contains('S'))
            .status_col("status");
        let got: BTreeSet<WithStatus> = Chain::from_values_in(Arc::clone(&s), &new)
            .diff(Chain::from_values_in(Arc::clone(&s), &old), d)
            .to_rows::<WithStatus>()
            .await
            .expect("diff")
            .into_iter()
            .collect();
        assert_eq!(got, expected(&new, &old, keep), "keep {keep}");
    }
    // Without status_col: this chain's columns only; compare narrows what is modified.
    let rows: Vec<Row> = Chain::from_values_in(Arc::clone(&s), &new)
        .diff(
            Chain::from_values_in(Arc::clone(&s), &old),
            Diff::on(&["id"])
                .compare(&["n"])
                .added(false)
                .deleted(false),
        )
        .to_rows()
        .await
        .expect("diff");
    assert!(rows.is_empty(), "n never changes: {rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_with_other_key_names_fills_deleted_rows_from_the_other_side() {
    #[derive(Serialize, Deserialize)]
    struct Old {
        key: i64,
        val: Option<String>,
        n: i64,
    }
    let s = Session::new();
    let (new, old) = versions();
    let renamed: Vec<Old> = old
        .iter()
        .map(|r| Old {
            key: r.id,
            val: r.value.clone(),
            n: r.n,
        })
        .collect();
    let got: BTreeSet<WithStatus> = Chain::from_values_in(Arc::clone(&s), &new)
        .diff(
            Chain::from_values_in(Arc::clone(&s), &renamed),
            Diff::on(&["id"])
                .right_on(&["key"])
                .compare(&["value", "n"])
                .right_compare(&["val", "n"])
                .same(true)
                .status_col("status"),
        )
        .to_rows::<WithStatus>()
        .await
        .expect("diff")
        .into_iter()
        .collect();
    assert_eq!(got, expected(&new, &old, "ADMS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_diff_finds_added_and_rewritten_files() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    for i in 0..6 {
        std::fs::write(data.path().join(format!("f{i}.txt")), format!("one {i}")).expect("write");
    }
    let s = Session::with_settings(Settings::new().root(root.path()));
    let uri = data.path().display().to_string();
    s.from_storage(&uri).save("files").await.expect("save v1");
    // f0 rewritten (another size), f5 deleted, f6 added; the rest untouched.
    std::fs::write(data.path().join("f0.txt"), "rewritten, longer").expect("write");
    std::fs::remove_file(data.path().join("f5.txt")).expect("rm");
    std::fs::write(data.path().join("f6.txt"), "new").expect("write");
    #[derive(Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
    struct P {
        path: String,
        status: String,
    }
    let paths = |diff: Diff| {
        let s = Arc::clone(&s);
        let uri = uri.clone();
        async move {
            let mut rows: Vec<P> = s
                .from_storage(&uri)
                .file_diff(s.from_dataset("files"), diff.status_col("status"))
                .select([col("file.path").alias("path"), col("status")])
                .to_rows()
                .await
                .expect("file_diff");
            rows.sort();
            rows.into_iter()
                .map(|p| format!("{} {}", p.status, p.path))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(paths(Diff::files("file")).await, ["M f0.txt", "A f6.txt"]);
    assert_eq!(
        paths(Diff::files("file").deleted(true).same(true)).await,
        [
            "M f0.txt", "S f1.txt", "S f2.txt", "S f3.txt", "S f4.txt", "D f5.txt", "A f6.txt"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subtract_is_a_set_difference() {
    let s = Session::new();
    let (new, old) = versions();
    let got: BTreeSet<Row> = Chain::from_values_in(Arc::clone(&s), &new)
        .subtract(
            Chain::from_values_in(Arc::clone(&s), &old),
            Some(&["id"]),
            None,
        )
        .to_rows::<Row>()
        .await
        .expect("subtract")
        .into_iter()
        .collect();
    let old_ids: BTreeSet<i64> = old.iter().map(|r| r.id).collect();
    let want: BTreeSet<Row> = new
        .iter()
        .filter(|r| !old_ids.contains(&r.id))
        .cloned()
        .collect();
    assert_eq!(got, want);
    // All columns: rows equal in every column (a null value equals nothing).
    let got: BTreeSet<Row> = Chain::from_values_in(Arc::clone(&s), &new)
        .subtract(Chain::from_values_in(Arc::clone(&s), &old), None, None)
        .to_rows::<Row>()
        .await
        .expect("subtract")
        .into_iter()
        .collect();
    let same: BTreeSet<&Row> = old.iter().filter(|r| r.value.is_some()).collect();
    let want: BTreeSet<Row> = new.iter().filter(|r| !same.contains(r)).cloned().collect();
    assert_eq!(got, want);
}

fn ids(n: i64) -> Vec<Row> {
    (0..n)
        .map(|id| Row {
            id,
            value: Some(format!("r{id}")),
            n: id % 3,
        })
        .collect()
}

async fn id_list(c: Chain) -> Vec<i64> {
    c.to_rows::<Row>()
        .await
        .expect("run")
        .into_iter()
        .map(|r| r.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffle_and_sample_repeat_for_a_seed() {
    let s = Session::new();
    let rows = ids(200);
    let base = || Chain::from_values_in(Arc::clone(&s), &rows);
    let a = id_list(base().shuffle(Some(7))).await;
    let b = id_list(base().shuffle(Some(7))).await;
    let c = id_list(base().shuffle(Some(8))).await;
    assert_eq!(a, b, "same seed, same order");
    assert_ne!(a, c, "another seed, another order");
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..200).collect::<Vec<_>>(), "a permutation");
    assert_ne!(a, sorted);

    let s1 = id_list(base().sample(17, Some(3))).await;
    let s2 = id_list(base().sample(17, Some(3))).await;
    assert_eq!(s1.len(), 17);
    assert_eq!(s1, s2);
    assert_eq!(
        s1.iter().collect::<BTreeSet<_>>().len(),
        17,
        "distinct rows"
    );
    // The sample is the shuffle's first n rows.
    assert_eq!(s1, id_list(base().shuffle(Some(3))).await[..17]);
    assert_eq!(base().sample(1000, None).count().await.expect("all"), 200);
    assert_eq!(base().sample(0, Some(1)).count().await.expect("none"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_hold_every_row_exactly_once() {
    let s = Session::new();
    let rows = ids(301);
    for total in 1..=7 {
        let mut seen = Vec::new();
        let mut sizes = Vec::new();
        for index in 0..total {
            let part =
                id_list(Chain::from_values_in(Arc::clone(&s), &rows).chunk(index, total)).await;
            // Stable: the same part again.
            let again =
                id_list(Chain::from_values_in(Arc::clone(&s), &rows).chunk(index, total)).await;
            assert_eq!(part, again);
            sizes.push(part.len());
            seen.extend(part);
        }
        seen.sort();
        assert_eq!(seen, (0..301).collect::<Vec<_>>(), "total {total}");
        if total > 1 {
            assert!(sizes.iter().all(|&n| n > 0), "total {total}: {sizes:?}");
        }
    }
    let err = Chain::from_values_in(Arc::clone(&s), &rows)
        .chunk(3, 3)
        .count()
        .await
        .expect_err("out of range");
    assert!(err.to_string().contains("chunk(3, 3)"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_is_a_left_inner_or_full_join_with_renamed_right_columns() {
    #[derive(Serialize, Deserialize)]
    struct L {
        id: i64,
        name: String,
    }
    #[derive(Serialize, Deserialize)]
    struct R {
        id: i64,
        name: String,
        score: i64,
    }
    #[derive(Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
    struct M {
        id: Option<i64>,
        name: Option<String>,
        right_id: Option<i64>,
        right_name: Option<String>,
        score: Option<i64>,
    }
    let s = Session::new();
    let left: Vec<L> = (0..6)
        .map(|id| L {
            id,
            name: format!("l{id}"),
        })
        .collect();
    let right: Vec<R> = (3..9)
        .map(|id| R {
            id,
            name: format!("r{id}"),
            score: id * 10,
        })
        .collect();
    let run = |how| {
        let s = Arc::clone(&s);
        let (l, r) = (
            Chain::from_values_in(Arc::clone(&s), &left),
            Chain::from_values_in(Arc::clone(&s), &right),
        );
        async move {
            let mut rows: Vec<M> = l
                .merge(r, &["id"], &[], how, "right_")
                .to_rows()
                .await
                .expect("merge");
            rows.sort();
            rows
        }
    };
    // The same joins computed by hand.
    let matched = |id: i64| (3..9).contains(&id);
    let row = |l: Option<i64>, r: Option<i64>| M {
        id: l,
        name: l.map(|i| format!("l{i}")),
        right_id: r,
        right_name: r.map(|i| format!("r{i}")),
        score: r.map(|i| i * 10),
    };
    let mut want_left: Vec<M> = (0..6)
        .map(|i| row(Some(i), matched(i).then_some(i)))
        .collect();
    want_left.sort();
    assert_eq!(run(udfchain::JoinType::Left).await, want_left);
    let mut want_inner: Vec<M> = (3..6).map(|i| row(Some(i), Some(i))).collect();
    want_inner.sort();
    assert_eq!(run(udfchain::JoinType::Inner).await, want_inner);
    let mut want_full = want_left;
    want_full.extend((6..9).map(|i| row(None, Some(i))));
    want_full.sort();
    assert_eq!(run(udfchain::JoinType::Full).await, want_full);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_hash_in_sql_splits_and_orders_like_the_chain() {
    let s = Session::new();
    let rows = ids(120);
    s.context()
        .register_table(
            "t",
            Arc::new(
                udfchain::datafusion::datasource::MemTable::try_new(
                    Chain::from_values_in(Arc::clone(&s), &rows)
                        .collect()
                        .await
                        .expect("rows")[0]
                        .schema(),
                    vec![
                        Chain::from_values_in(Arc::clone(&s), &rows)
                            .collect()
                            .await
                            .expect("rows"),
                    ],
                )
                .expect("table"),
            ),
        )
        .expect("register");
    let sql_ids = |q: String| {
        let s = Arc::clone(&s);
        async move {
            let plan = s
                .context()
                .sql(&q)
                .await
                .expect("sql")
                .into_unoptimized_plan();
            id_list(Chain::from_plan(Arc::clone(&s), plan)).await
        }
    };
    let mut seen = Vec::new();
    for i in 0..3 {
        let part = sql_ids(format!(
            "SELECT * FROM t WHERE row_hash(0, t.id, t.value, t.n) % 3 = {i}"
        ))
        .await;
        let chain = id_list(Chain::from_values_in(Arc::clone(&s), &rows).chunk(i, 3)).await;
        assert_eq!(
            part.iter().collect::<BTreeSet<_>>(),
            chain.iter().collect::<BTreeSet<_>>()
        );
        seen.extend(part);
    }
    seen.sort();
    assert_eq!(seen, (0..120).collect::<Vec<_>>());
    let ordered = sql_ids("SELECT * FROM t ORDER BY row_hash(9, t.id, t.value, t.n)".into()).await;
    assert_eq!(
        ordered,
        id_list(Chain::from_values_in(Arc::clone(&s), &rows).shuffle(Some(9))).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explode_reads_json_texts_as_structs_like_serde_json() {
    #[derive(Serialize, Deserialize)]
    struct J {
        id: i64,
        j: Option<String>,
    }
    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        a: Option<i64>,
        b: Option<String>,
    }
    #[derive(Debug, Deserialize, PartialEq)]
    struct Out {
        id: i64,
        j_expl: Option<Inner>,
    }
    let s = Session::new();
    let rows: Vec<J> = (0..50)
        .map(|id| J {
            id,
            j: (id % 7 != 3).then(|| match id % 3 {
                0 => format!(r#"{{"a": {id}, "b": "t{id}"}}"#),
                1 => format!(r#"{{"b": "only {id}", "extra": [1, 2]}}"#),
                _ => format!(r#"{{"a": {id}}}"#),
            }),
        })
        .collect();
    let mut got: Vec<Out> = Chain::from_values_in(Arc::clone(&s), &rows)
        .explode("j", None, 1)
        .select([col("id"), col("j_expl")])
        .to_rows()
        .await
        .expect("explode");
    got.sort_by_key(|o| o.id);
    // The other way: serde_json per row, keeping the sample's fields (a, b).
    let want: Vec<Out> = rows
        .iter()
        .map(|r| Out {
            id: r.id,
            j_expl: r.j.as_ref().map(|t| {
                let v: serde_json::Value = serde_json::from_str(t).expect("json");
                Inner {
                    a: v.get("a").and_then(|x| x.as_i64()),
                    b: v.get("b").and_then(|x| x.as_str()).map(str::to_string),
                }
            }),
        })
        .collect();
    assert_eq!(got, want);
    // A row that does not parse fails the run naming it.
    let mut bad = rows;
    bad[20].j = Some("{not json".to_string());
    let err = Chain::from_values_in(Arc::clone(&s), &bad)
        .explode("j", Some("x"), 1)
        .collect()
        .await
        .expect_err("bad row");
    let text = err.to_string();
    assert!(
        text.contains("explode(j): row 20") && text.contains("{not json"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sum_avg_min_max_equal_the_values_computed_in_rust() {
    use udfchain::datafusion::common::ScalarValue;
    let rows = versions().0;
    let ns: Vec<i64> = rows.iter().map(|r| r.n).collect();
    let chain = Chain::from_values(&rows);
    assert_eq!(
        chain.sum("n").await.expect("sum"),
        ScalarValue::Int64(Some(ns.iter().sum()))
    );
    assert_eq!(
        chain.avg("n").await.expect("avg"),
        ScalarValue::Float64(Some(ns.iter().sum::<i64>() as f64 / ns.len() as f64))
    );
    assert_eq!(
        chain.min("n").await.expect("min"),
        ScalarValue::Int64(ns.iter().min().copied())
    );
    assert_eq!(
        chain.max("value").await.expect("max of text"),
        ScalarValue::Utf8(rows.iter().filter_map(|r| r.value.clone()).max())
    );
    // No rows: null, as SQL's aggregates give.
    let none = chain.clone().filter(col("n").lt(udfchain::lit(0i64)));
    assert!(none.sum("n").await.expect("empty sum").is_null());
    assert!(none.max("n").await.expect("empty max").is_null());
    // A struct field by its dotted name.
    let dir = tempfile::tempdir().expect("dir");
    let sizes = udfchain_testkit::write_files(dir.path(), 5, |i| 10 * (i + 1));
    assert_eq!(sizes.len(), 5);
    let total = Chain::from_storage(dir.path().to_str().expect("utf8"))
        .sum("file.size")
        .await
        .expect("sum of sizes");
    assert_eq!(total, ScalarValue::UInt64(Some(10 + 20 + 30 + 40 + 50)));
}
