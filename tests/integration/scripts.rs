//! Golden script tests: script in, expected table out.

use datafusion::arrow::util::pretty::pretty_format_batches;
use udfchain::{Error, Output, ScriptRunner, Session, Settings};

use crate::support::S3Server;

fn data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.txt"), "hello\nworld\n").expect("write");
    std::fs::write(dir.path().join("b.txt"), "x").expect("write");
    // A 3x2 PNG: signature and the IHDR chunk are all `image_size` reads.
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    png.extend_from_slice(&3u32.to_be_bytes());
    png.extend_from_slice(&2u32.to_be_bytes());
    png.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
    std::fs::create_dir_all(dir.path().join("img")).expect("mkdir");
    std::fs::write(dir.path().join("img/p.png"), png).expect("write");
    dir
}

fn runner(root: &std::path::Path) -> ScriptRunner {
    ScriptRunner::new(Session::with_settings(Settings::new().root(root)))
}

/// Runs `script` and returns the last table, pretty-printed.
async fn last_table(r: &ScriptRunner, script: &str) -> String {
    let outputs = r.run(script).await.unwrap_or_else(|e| panic!("{e}"));
    let batches = outputs
        .into_iter()
        .rev()
        .find_map(|o| match o {
            Output::Table(b) => Some(b),
            Output::Message(_) => None,
        })
        .expect("a table");
    pretty_format_batches(&batches).expect("format").to_string()
}

fn golden(got: &str, want: &str) {
    let want = want.trim();
    assert_eq!(
        got.trim(),
        want,
        "\n--- got ---\n{got}\n--- want ---\n{want}\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtins_over_read_storage() {
    let root = tempfile::tempdir().expect("root");
    let data = data_dir();
    let r = runner(root.path());
    let script = format!(
        "-- every built-in over a local dir\n\
         SET parallel = 2;\n\
         SELECT file.path AS path, file_size(file) AS size, line_count(file) AS lines,\n\
                read_text(file) = 'x' AS is_x, sha256(file) AS sha, md5(file) AS md5\n\
         FROM read_storage('{}', '*.txt') ORDER BY path;",
        data.path().display()
    );
    golden(
        &last_table(&r, &script).await,
        "
+-------+------+-------+-------+------------------------------------------------------------------+----------------------------------+
| path  | size | lines | is_x  | sha                                                              | md5                              |
+-------+------+-------+-------+------------------------------------------------------------------+----------------------------------+
| a.txt | 12   | 2     | false | 4a1e67f2fe1d1cc7b31d0ca2ec441da4778203a036a77da10344c85e24ff0f92 | 0f723ae7f9bf07744445e93ac5595156 |
| b.txt | 1    | 1     | true  | 2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881 | 9dd4e461268c8034f5c8564e155c67a6 |
+-------+------+-------+-------+------------------------------------------------------------------+----------------------------------+",
    );
    let script = format!(
        "SELECT image_size(file) AS size FROM read_storage('{}/img');",
        data.path().display()
    );
    golden(
        &last_table(&r, &script).await,
        "
+-----------------------+
| size                  |
+-----------------------+
| {width: 3, height: 2} |
+-----------------------+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_applies_to_the_statements_after_it() {
    let root = tempfile::tempdir().expect("root");
    let data = data_dir();
    let r = runner(root.path());
    let q = format!(
        "EXPLAIN SELECT sha256(file) FROM read_storage('{}')",
        data.path().display()
    );
    let plan = last_table(&r, &format!("SET prefetch = 0; {q};")).await;
    assert!(!plan.contains("PrefetchExec"), "{plan}");
    assert!(plan.contains("MapExec: udf=sha256"), "{plan}");
    let plan = last_table(&r, &format!("SET prefetch = 5; SET ordered = false; {q};")).await;
    assert!(
        plan.contains("PrefetchExec: prefetch=5, ordered=false"),
        "{plan}"
    );
    // image_size reads headers only: never prefetched.
    let plan = last_table(
        &r,
        &format!(
            "EXPLAIN SELECT image_size(file) FROM read_storage('{}')",
            data.path().display()
        ),
    )
    .await;
    assert!(
        !plan.contains("PrefetchExec") && plan.contains("MapExec: udf=image_size"),
        "{plan}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_storage_on_the_s3_server() {
    let root = tempfile::tempdir().expect("root");
    let s3 = S3Server::start();
    std::fs::create_dir_all(s3.bucket_dir().join("t")).expect("mkdir");
    std::fs::write(s3.bucket_dir().join("t/one.txt"), "1\n2\n3\n").expect("write");
    std::fs::write(s3.bucket_dir().join("t/two.txt"), "x").expect("write");
    let r = ScriptRunner::new(Session::with_settings(s3.settings().root(root.path())));
    golden(
        &last_table(&r, "SELECT file.path AS path, line_count(file) AS n FROM read_storage('s3://bucket/t') ORDER BY path;").await,
        "
+---------+---+
| path    | n |
+---------+---+
| one.txt | 3 |
| two.txt | 1 |
+---------+---+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_members_generator_and_datasets() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    let mut b = tar::Builder::new(Vec::new());
    for (name, body) in [
        ("d/s1.cls", "cat"),
        ("d/s1.txt", "a cat"),
        ("d/s2.cls", "dog"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, body.as_bytes())
            .expect("append");
    }
    std::fs::write(data.path().join("shard.tar"), b.into_inner().expect("tar")).expect("write");
    let r = runner(root.path());
    let script = format!(
        "CREATE DATASET members AS
           SELECT member.location AS location, read_text(member) AS text, file_size(member) AS size
           FROM tar_members('{}');
         SELECT text, size FROM read_dataset('members') ORDER BY text;",
        data.path().display()
    );
    golden(
        &last_table(&r, &script).await,
        "
+-------+------+
| text  | size |
+-------+------+
| a cat | 5    |
| cat   | 3    |
| dog   | 3    |
+-------+------+",
    );
    let samples = format!(
        "SELECT sample.key AS key, array_length(sample.members) AS n FROM webdataset('{}') ORDER BY key;",
        data.path().display()
    );
    golden(
        &last_table(&r, &samples).await,
        "
+------+---+
| key  | n |
+------+---+
| d/s1 | 2 |
| d/s2 | 1 |
+------+---+",
    );
    let shown = last_table(&r, "SHOW DATASETS;").await;
    assert!(shown.contains("| members | 1       | 3    |"), "{shown}");
    let again = r
        .run("CREATE DATASET members AS SELECT 1 AS one;")
        .await
        .expect("v2");
    assert!(
        matches!(&again[0], Output::Message(m) if m.contains("version 2")),
        "{again:?}"
    );
    golden(
        &last_table(&r, "SELECT count(*) AS n FROM read_dataset('members', 1);").await,
        "
+---+
| n |
+---+
| 3 |
+---+",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_line_column_and_suggestions() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    let err = r
        .run("SET parallel = 2;\nSELECT 1;\nSELECT 1 2;")
        .await
        .expect_err("syntax");
    match &err {
        Error::Script { line, column, .. } => assert_eq!((*line, *column), (3, 10), "{err}"),
        other => panic!("{other:?}"),
    }
    let err = r.run("\n  SET prefech = 4;").await.expect_err("setting");
    let msg = err.to_string();
    assert!(
        msg.starts_with("line 2, column 3") && msg.contains("did you mean prefetch"),
        "{msg}"
    );
    let err = r
        .run("SELECT * FROM read_storag('/tmp');")
        .await
        .expect_err("table fn");
    assert!(
        err.to_string().contains("did you mean read_storage"),
        "{err}"
    );
    let err = r
        .run("SELECT line_cont(file) FROM read_storage('/tmp');")
        .await
        .expect_err("udf");
    assert!(err.to_string().contains("line_count"), "{err}");
    let err = r.run("SET cache = maybe;").await.expect_err("bad value");
    assert!(err.to_string().contains("expected true or false"), "{err}");
}

async fn shout(file: udfchain::File) -> Result<String, udfchain::udfs::UdfError> {
    Ok(file.read_text().await?.to_uppercase())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_udfs_registered_for_scripts() {
    let root = tempfile::tempdir().expect("root");
    let data = data_dir();
    let r = runner(root.path());
    r.register_map("shout", false, |p, o| {
        udfchain::udfs::map_fn(&[p], o, shout)
    })
    .expect("register");
    let q = format!(
        "SELECT shout(file) AS loud FROM read_storage('{}', 'b.txt');",
        data.path().display()
    );
    golden(
        &last_table(&r, &q).await,
        "
+------+
| loud |
+------+
| X    |
+------+",
    );
    let plan = last_table(&r, &format!("EXPLAIN {q}")).await;
    assert!(
        plan.contains("MapExec: udf=shout") && plan.contains("PrefetchExec"),
        "{plan}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_rows_expands_every_file() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct R {
        id: i64,
        tag: String,
    }
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    for (f, ids) in [("a.parquet", 0..3), ("sub/b.parquet", 3..5)] {
        let rows: Vec<R> = ids
            .map(|id| R {
                id,
                tag: format!("t{id}"),
            })
            .collect();
        let path = data.path().join(f).display().to_string();
        udfchain::Chain::from_values(&rows)
            .to_parquet(&path)
            .await
            .expect("write parquet");
    }
    let r = runner(root.path());
    let q = format!(
        "SELECT file.path AS path, row.id AS id, row.tag AS tag FROM parquet_rows('{}') ORDER BY id;",
        data.path().display()
    );
    golden(
        &last_table(&r, &q).await,
        "
+---------------+----+-----+
| path          | id | tag |
+---------------+----+-----+
| a.parquet     | 0  | t0  |
| a.parquet     | 1  | t1  |
| a.parquet     | 2  | t2  |
| sub/b.parquet | 3  | t3  |
| sub/b.parquet | 4  | t4  |
+---------------+----+-----+",
    );
}
