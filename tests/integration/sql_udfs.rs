//! UDFs anywhere an expression stands in a script: golden tables for each
//! position (aggregate argument, WHERE, ORDER BY, GROUP BY, HAVING, JOIN ON,
//! nested expressions, subqueries, CTEs), a repeated call that runs once per
//! row, one UDF node and one `PrefetchExec` per distinct call in EXPLAIN, and
//! the error for a call on something that is not a File column.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use udfchain::{ScriptRunner, Session};

use udfchain_testkit::{S3Server, golden, last_table, runner};

/// a.txt: 2 lines, 12 bytes; b.txt: 1 line, 1 byte; c.txt: 2 lines, 8 bytes.
fn data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.txt"), "hello\nworld\n").expect("write");
    std::fs::write(dir.path().join("b.txt"), "x").expect("write");
    std::fs::write(dir.path().join("c.txt"), "one\ntwo\n").expect("write");
    dir
}

/// `read_storage` over the test files, for `format!`.
fn src(data: &tempfile::TempDir) -> String {
    format!("read_storage('{}', '*.txt')", data.path().display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_inside_aggregates() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let q = format!(
        "SELECT count(sha256(file)) AS n, sum(line_count(file)) AS lines, \
         max(file_size(file)) AS biggest FROM {}",
        src(&data)
    );
    golden(
        &last_table(&r, &q).await,
        "
+---+-------+---------+
| n | lines | biggest |
+---+-------+---------+
| 3 | 5     | 12      |
+---+-------+---------+",
    );
    // Unaliased, the column keeps the name DataFusion gives the call.
    let q = format!("SELECT count(sha256(file)) FROM {}", src(&data));
    golden(
        &last_table(&r, &q).await,
        "
+------------------------------------+
| count(sha256(read_storage().file)) |
+------------------------------------+
| 3                                  |
+------------------------------------+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_in_where_and_order_by() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let q = format!(
        "SELECT file.path AS path FROM {} WHERE line_count(file) > 1 ORDER BY path",
        src(&data)
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+
| path  |
+-------+
| a.txt |
| c.txt |
+-------+",
    );
    let q = format!(
        "SELECT file.path AS path FROM {} ORDER BY file_size(file)",
        src(&data)
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+
| path  |
+-------+
| b.txt |
| c.txt |
| a.txt |
+-------+",
    );
    let q = format!(
        "SELECT file.path AS path, md5(file) AS md5 FROM {} \
         WHERE read_text(file) LIKE '%o%' ORDER BY line_count(file) DESC, file_size(file) LIMIT 1",
        src(&data)
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+----------------------------------+
| path  | md5                              |
+-------+----------------------------------+
| c.txt | 2094b601daac3d68f5aed51d3c20f7cd |
+-------+----------------------------------+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_in_group_by_and_having() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let q = format!(
        "SELECT line_count(file) AS lines, count(*) AS n, sum(file_size(file)) AS bytes \
         FROM {} GROUP BY line_count(file) ORDER BY lines",
        src(&data)
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+---+-------+
| lines | n | bytes |
+-------+---+-------+
| 1     | 1 | 1     |
| 2     | 2 | 20    |
+-------+---+-------+",
    );
    let q = format!(
        "SELECT line_count(file) AS lines, count(*) AS n FROM {} \
         GROUP BY line_count(file) HAVING max(file_size(file)) > 5",
        src(&data)
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+---+
| lines | n |
+-------+---+
| 2     | 2 |
+-------+---+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_in_join_on() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    // Both sides have a column `file`: each call reads its own side's.
    let q = format!(
        "SELECT a.file.path AS x, b.file.path AS y, file_size(b.file) AS y_size \
         FROM {s} a JOIN {s} b \
         ON line_count(a.file) = line_count(b.file) AND a.file.path < b.file.path",
        s = src(&data)
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+-------+--------+
| x     | y     | y_size |
+-------+-------+--------+
| a.txt | c.txt | 8      |
+-------+-------+--------+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_nested_in_expressions() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let q = format!(
        "SELECT file.path AS path, line_count(file) * 2 + 1 AS n, \
         upper(substr(read_text(file), 1, 3)) AS head, \
         CASE WHEN file_size(file) > 5 THEN 'big' ELSE 'small' END AS kind, \
         coalesce(length(sha256(file)), 0) AS hex \
         FROM {} WHERE line_count(file) * 2 + 1 > 3 OR upper(read_text(file)) = 'X' \
         ORDER BY path",
        src(&data)
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+---+------+-------+-----+
| path  | n | head | kind  | hex |
+-------+---+------+-------+-----+
| a.txt | 5 | HEL  | big   | 64  |
| b.txt | 3 | X    | small | 64  |
| c.txt | 5 | ONE  | big   | 64  |
+-------+---+------+-------+-----+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_in_subqueries() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let s = src(&data);
    let q = format!(
        "SELECT file.path AS path FROM {s} \
         WHERE sha256(file) IN (SELECT sha256(file) FROM {s} WHERE line_count(file) = 1)"
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+
| path  |
+-------+
| b.txt |
+-------+",
    );
    let q = format!(
        "SELECT file.path AS path FROM {s} \
         WHERE file_size(file) = (SELECT max(file_size(file)) FROM {s})"
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+
| path  |
+-------+
| a.txt |
+-------+",
    );
    let q = format!(
        "SELECT count(*) AS n FROM {s} \
         WHERE EXISTS (SELECT 1 FROM {s} WHERE line_count(file) > 5)"
    );
    golden(
        &last_table(&r, &q).await,
        "
+---+
| n |
+---+
| 0 |
+---+",
    );
    // Correlated: the call over the outer query's column runs in the outer query.
    let t = format!("WITH t AS (SELECT file, file.path AS p FROM {s})");
    let q = format!(
        "{t} SELECT a.p AS path FROM t a WHERE EXISTS \
         (SELECT 1 FROM t b WHERE line_count(b.file) = line_count(a.file) AND b.p <> a.p) \
         ORDER BY path"
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+
| path  |
+-------+
| a.txt |
| c.txt |
+-------+",
    );
    let q = format!(
        "{t} SELECT a.p AS path, \
         (SELECT max(file_size(b.file)) FROM t b WHERE line_count(b.file) = line_count(a.file)) \
         AS biggest FROM t a ORDER BY path"
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+---------+
| path  | biggest |
+-------+---------+
| a.txt | 12      |
| b.txt | 1       |
| c.txt | 12      |
+-------+---------+",
    );
    let q = format!(
        "SELECT path FROM (SELECT file.path AS path, line_count(file) AS lines FROM {s}) t \
         WHERE lines = 1"
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+
| path  |
+-------+
| b.txt |
+-------+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_in_ctes() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let s = src(&data);
    let q = format!(
        "WITH t AS (SELECT file.path AS path, line_count(file) AS lines FROM {s}) \
         SELECT sum(lines) AS total FROM t WHERE lines > 1"
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+
| total |
+-------+
| 4     |
+-------+",
    );
    let q = format!(
        "WITH t AS (SELECT file FROM {s} WHERE file_size(file) > 1) \
         SELECT sum(line_count(file)) AS lines FROM t"
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+
| lines |
+-------+
| 4     |
+-------+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_call_runs_once_per_row() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    r.register_map("counted", false, move |p, o| {
        let counter = Arc::clone(&counter);
        udfchain::udfs::map_fn(&[p], o, move |f: udfchain::File| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, udfchain::udfs::UdfError>(f.size) }
        })
    })
    .expect("register");
    let s = src(&data);
    let cases = [
        format!("SELECT counted(file) AS c FROM {s} WHERE counted(file) > 0 ORDER BY c"),
        format!("SELECT count(counted(file)) AS n, min(counted(file)) AS c FROM {s}"),
        format!("SELECT counted(file) + counted(file) AS c FROM {s} ORDER BY counted(file)"),
    ];
    let want = [
        "
+----+
| c  |
+----+
| 1  |
| 8  |
| 12 |
+----+",
        "
+---+---+
| n | c |
+---+---+
| 3 | 1 |
+---+---+",
        "
+----+
| c  |
+----+
| 2  |
| 16 |
| 24 |
+----+",
    ];
    for (q, want) in cases.iter().zip(want) {
        calls.store(0, Ordering::SeqCst);
        golden(&last_table(&r, q).await, want);
        assert_eq!(calls.load(Ordering::SeqCst), 3, "one call per file: {q}");
    }
    // A condition without UDF filters before it: b.txt (1 byte) is never read.
    calls.store(0, Ordering::SeqCst);
    let q = format!("SELECT count(*) AS n FROM {s} WHERE counted(file) > 0 AND file.size > 1");
    golden(
        &last_table(&r, &q).await,
        "
+---+
| n |
+---+
| 2 |
+---+",
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2, "{q}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_call_gets_each_object_once_on_the_s3_server() {
    let root = tempfile::tempdir().expect("root");
    let s3 = S3Server::start();
    let dir = s3.bucket_dir().join("t");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for (name, body) in [
        ("one", "1\n2\n3\n"),
        ("two", "x"),
        ("three", "abc"),
        ("four", "hi"),
    ] {
        std::fs::write(dir.join(format!("{name}.txt")), body).expect("write");
    }
    let r = ScriptRunner::new(Session::with_settings(s3.settings().root(root.path())));
    let before = s3.object_gets();
    let q = "SELECT count(sha256(file)) AS n, count(DISTINCT sha256(file)) AS d \
             FROM read_storage('s3://bucket/t') WHERE sha256(file) <> '' AND file.size > 1";
    golden(
        &last_table(&r, q).await,
        "
+---+---+
| n | d |
+---+---+
| 3 | 3 |
+---+---+",
    );
    // Three calls of sha256 over the three files left by `file.size > 1`: one GET each.
    assert_eq!(s3.object_gets() - before, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_one_udf_node_per_distinct_call() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let q = format!(
        "EXPLAIN SELECT sha256(file) AS h, count(*) AS n FROM {} \
         WHERE sha256(file) <> '' AND line_count(file) > 0 \
         GROUP BY sha256(file) ORDER BY sha256(file)",
        src(&data)
    );
    let plan = last_table(&r, &format!("SET prefetch = 5; {q}")).await;
    let count = |s: &str| plan.matches(s).count();
    assert_eq!(count("Udf: kind=map, name=sha256"), 1, "{plan}");
    assert_eq!(count("Udf: kind=map, name=line_count"), 1, "{plan}");
    assert_eq!(count("MapExec: udf=sha256"), 1, "{plan}");
    assert_eq!(count("MapExec: udf=line_count"), 1, "{plan}");
    assert_eq!(count("PrefetchExec: prefetch=5"), 2, "{plan}");
    // The filter reads the UDF outputs above their nodes: nothing pushed below.
    let physical = &plan[plan.find("physical_plan").expect("physical plan")..];
    let filter = physical.find("FilterExec").expect("a FilterExec");
    let map = physical.find("MapExec").expect("a MapExec");
    assert!(filter < map, "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udf_on_something_not_a_file_column_says_what_it_takes() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let s = src(&data);
    for (udf, q, got) in [
        (
            "sha256",
            format!("SELECT sha256(1) FROM {s}"),
            "got Int64(1)",
        ),
        (
            "line_count",
            format!("SELECT count(*) FROM {s} WHERE line_count(file.path) > 1"),
            "got get_field",
        ),
        (
            "md5",
            format!("SELECT md5(p) FROM (SELECT file.path AS p FROM {s})"),
            "is Utf8",
        ),
        (
            "read_text",
            format!("SELECT read_text(file, file) FROM {s}"),
            "got 2 arguments",
        ),
    ] {
        let err = r.run(&q).await.expect_err("not a file column").to_string();
        assert!(
            err.contains(&format!("{udf}() takes a File column, e.g. {udf}(file)"))
                && err.contains(got),
            "{q}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_in_windows_unions_distinct_views_and_datasets() {
    let (root, data) = (tempfile::tempdir().expect("root"), data_dir());
    let r = runner(root.path());
    let s = src(&data);
    let q = format!(
        "SELECT file.path AS path, sum(line_count(file)) OVER () AS total, \
         rank() OVER (ORDER BY file_size(file) DESC) AS by_size FROM {s} ORDER BY path"
    );
    golden(
        &last_table(&r, &q).await,
        "
+-------+-------+---------+
| path  | total | by_size |
+-------+-------+---------+
| a.txt | 5     | 1       |
| b.txt | 5     | 3       |
| c.txt | 5     | 2       |
+-------+-------+---------+",
    );
    let q = format!(
        "SELECT DISTINCT line_count(file) AS n FROM {s} \
         UNION ALL SELECT file_size(file) FROM {s} WHERE line_count(file) = 1 ORDER BY n"
    );
    golden(
        &last_table(&r, &q).await,
        "
+---+
| n |
+---+
| 1 |
| 1 |
| 2 |
+---+",
    );
    let script = format!(
        "CREATE VIEW long AS SELECT * FROM {s} WHERE line_count(file) > 1;\n\
         CREATE DATASET sizes AS SELECT file.path AS path, file_size(file) AS size FROM long \
         WHERE sha256(file) <> '' LIMIT 5;\n\
         SELECT * FROM read_dataset('sizes') ORDER BY path;"
    );
    golden(
        &last_table(&r, &script).await,
        "
+-------+------+
| path  | size |
+-------+------+
| a.txt | 12   |
| c.txt | 8    |
+-------+------+",
    );
}
