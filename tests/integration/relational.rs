//! Relational steps through DataFusion expressions, and the output forms.

use std::sync::Arc;

use datafusion::functions_aggregate::expr_fn::{count, sum};
use serde::{Deserialize, Serialize};
use udfchain::{Chain, JoinType, Session, col, lit};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct P {
    id: i64,
    kind: String,
    score: f64,
}

fn people() -> Vec<P> {
    (0..10)
        .map(|id| P {
            id,
            kind: if id % 2 == 0 { "even" } else { "odd" }.into(),
            score: id as f64 / 2.0,
        })
        .collect()
}

fn base(s: &Arc<Session>) -> Chain {
    Chain::from_values_in(Arc::clone(s), &people())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_select_mutate_order_limit_offset() {
    let s = Session::new();
    #[derive(Debug, Deserialize, PartialEq)]
    struct R {
        id: i64,
        double: i64,
    }
    let rows: Vec<R> = base(&s)
        .filter(col("kind").eq(lit("odd")))
        .mutate("double", col("id") * lit(2))
        .select([col("id"), col("double")])
        .order_by([col("id").sort(false, false)])
        .offset(1)
        .limit(2)
        .to_rows()
        .await
        .expect("run");
    assert_eq!(rows, vec![R { id: 7, double: 14 }, R { id: 5, double: 10 }]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_union_join_group_by() {
    let s = Session::new();
    let kinds = base(&s)
        .select([col("kind")])
        .distinct()
        .count()
        .await
        .expect("distinct");
    assert_eq!(kinds, 2);

    let both = base(&s).union(base(&s)).count().await.expect("union");
    assert_eq!(both, 20);

    #[derive(Serialize, Deserialize)]
    struct Label {
        kind: String,
        label: String,
    }
    let labels = Chain::from_values_in(
        Arc::clone(&s),
        &[Label {
            kind: "even".into(),
            label: "E".into(),
        }],
    )
    .select([col("kind").alias("k"), col("label")]);
    let inner = base(&s)
        .join(labels.clone(), JoinType::Inner, &["kind"], &["k"])
        .count()
        .await
        .expect("inner");
    assert_eq!(inner, 5);
    let left = base(&s)
        .join(labels.clone(), JoinType::Left, &["kind"], &["k"])
        .count()
        .await
        .expect("left");
    assert_eq!(left, 10);
    let full = base(&s)
        .join(labels, JoinType::Full, &["kind"], &["k"])
        .count()
        .await
        .expect("full");
    assert_eq!(full, 10);

    #[derive(Debug, Deserialize, PartialEq)]
    struct G {
        kind: String,
        n: i64,
        total: f64,
    }
    let groups: Vec<G> = base(&s)
        .group_by(
            [col("kind")],
            [
                count(col("id")).alias("n"),
                sum(col("score")).alias("total"),
            ],
        )
        .order_by([col("kind").sort(true, false)])
        .to_rows()
        .await
        .expect("group by");
    assert_eq!(
        groups[0],
        G {
            kind: "even".into(),
            n: 5,
            total: 10.0
        }
    );
    assert_eq!(
        groups[1],
        G {
            kind: "odd".into(),
            n: 5,
            total: 12.5
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_table_stream_count() {
    let s = Session::new();
    let table = base(&s)
        .select([col("id"), col("kind")])
        .to_table_string(3)
        .await
        .expect("table");
    assert!(table.contains("| id | kind |"), "{table}");
    assert_eq!(
        table.lines().filter(|l| l.starts_with("| ")).count(),
        4,
        "{table}"
    );
    assert_eq!(base(&s).count().await.expect("count"), 10);
}
