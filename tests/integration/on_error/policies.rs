//! `null`, `skip` and `fail` under every UDF kind, whole batch calls and failing generators.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use udfchain::{Chain, Error, OnError, Session, Settings, col};

use udfchain_testkit::no_prefetch_dirs_soon;

use super::{Fixture, Kind, Out, Pair, bad, boom, out, rows, run, six_files, size, total, url};

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
