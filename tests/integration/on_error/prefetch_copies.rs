//! Prefetched copies under `skip` and `null` are released once per row, pins at once.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use udfchain::udfs::BoxError;
use udfchain::{Chain, File, OnError, Settings, col};

use udfchain_testkit::no_prefetch_dirs_soon;

use super::{Fixture, Kind, Pair, Row, boom, file, out, run, six_files, size, total, url};

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
