//! Golden script tests: script in, expected table out; statements recognised
//! whatever their case, whitespace and comments; errors located in the script.

use udfchain::{Error, Output, ScriptRunner, Session};

use udfchain_testkit::{S3Server, golden, last_table, runner};

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
    assert!(err.to_string().contains("must be true or false"), "{err}");
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

/// The messages of a run (SET, CREATE DATASET), in order.
async fn messages(r: &ScriptRunner, script: &str) -> Vec<String> {
    r.run(script)
        .await
        .unwrap_or_else(|e| panic!("{script:?}: {e}"))
        .into_iter()
        .filter_map(|o| match o {
            Output::Message(m) => Some(m),
            Output::Table(_) => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_with_any_whitespace_comments_and_case() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    for (i, create) in [
        "CREATE  DATASET  d0  AS  SELECT 0 AS n",
        "CREATE\tDATASET\td1\tAS\tSELECT 1 AS n",
        "CREATE\nDATASET\r\nd2\n  AS\n  SELECT 2 AS n",
        "CREATE /* a */ DATASET -- b\n d3 /* c */ AS -- d\n SELECT 3 AS n -- at the end",
        "create dataset d4 as select 4 as n",
        "Create Dataset \"d5\" As Select 5 AS n /* at the end */",
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(
            messages(&r, &format!("{create};")).await,
            [format!("saved dataset d{i} version 1 (1 rows)")],
            "{create:?}"
        );
        golden(
            &last_table(&r, &format!("select n from read_dataset('d{i}')")).await,
            &format!("+---+\n| n |\n+---+\n| {i} |\n+---+"),
        );
    }
    // A final comment after the last `;`, and `show datasets` in lower case.
    let shown = last_table(&r, "show\tdatasets; -- the end").await;
    assert!(shown.contains("| d5   | 1       | 1    |"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semicolons_inside_strings_identifiers_and_comments() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    golden(
        &last_table(
            &r,
            "SELECT 'a;b' AS \"x;y\" -- c;d\n /* e;f */ ; SELECT ';' AS s, 'it''s;' AS t;",
        )
        .await,
        "
+---+-------+
| s | t     |
+---+-------+
| ; | it's; |
+---+-------+",
    );
    let out = r
        .run("SELECT 'a;b' AS \"x;y\"")
        .await
        .expect("one statement");
    assert_eq!(out.len(), 1);
    assert_eq!(
        messages(
            &r,
            "SET storage.region = 'eu;west' ; SET on_error TO 'skip';"
        )
        .await,
        ["set storage.region = eu;west", "set on_error = skip"]
    );
    let s = r.settings();
    assert_eq!(
        s.get_storage_options().get("region").map(String::as_str),
        Some("eu;west")
    );
    assert_eq!(s.get_on_error(), udfchain::OnError::Skip);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_never_echoes_a_credential() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    assert_eq!(
        messages(
            &r,
            "SET storage.secret_access_key = 'hunter2;x'; SET Storage.Session_Token = 'tok';\
             SET storage.region = 'eu-1';"
        )
        .await,
        [
            "set storage.secret_access_key = ***",
            "set Storage.Session_Token = ***",
            "set storage.region = eu-1"
        ]
    );
    let options = r.settings().get_storage_options().clone();
    assert_eq!(
        options.get("secret_access_key").map(String::as_str),
        Some("hunter2;x")
    );
    assert_eq!(
        options.get("session_token").map(String::as_str),
        Some("tok")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_dataset_names() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    assert_eq!(
        messages(&r, "CREATE DATASET \"my-set.v2\" AS SELECT 7 AS n;").await,
        ["saved dataset my-set.v2 version 1 (1 rows)"]
    );
    golden(
        &last_table(&r, "SELECT n FROM read_dataset('my-set.v2')").await,
        "+---+\n| n |\n+---+\n| 7 |\n+---+",
    );
    let err = r
        .run("SELECT 1;\n  CREATE DATASET \"my set\" AS SELECT 1")
        .await
        .expect_err("space in name");
    let msg = err.to_string();
    assert!(
        msg.starts_with("line 2, column 3: invalid dataset name \"my set\""),
        "{msg}"
    );
    let err = r
        .run("CREATE DATASET my set AS SELECT 1")
        .await
        .expect_err("two words");
    assert!(
        err.to_string()
            .starts_with("line 1, column 1: syntax error: a dataset name is one word"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_scripts_are_located_and_run_nothing() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    for (script, at, what) in [
        (
            "CREATE DATASET first AS SELECT 1 AS n;\nSELECT 'abc",
            (2, 8),
            "syntax error: unterminated string literal",
        ),
        (
            "CREATE DATASET first AS SELECT 1 AS n;\n  /* never closed",
            (2, 3),
            "syntax error: unexpected EOF while in a multi-line comment",
        ),
        (
            "CREATE DATASET first AS SELECT 1 AS n;\n\tSET prefetch 4",
            (2, 2),
            "syntax error: SET needs `name = value`",
        ),
    ] {
        let err = r.run(script).await.expect_err(script);
        match &err {
            Error::Script { line, column, .. } => {
                assert_eq!((*line, *column), at, "{script:?}: {err}")
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().ends_with(what), "{err}");
    }
    // Nothing ran: the first statement of each script saved nothing.
    let shown = last_table(&r, "SHOW DATASETS").await;
    assert!(!shown.contains("first"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_inside_a_dataset_query_point_into_it() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    // The stray number is at column 30 of line 1, and column 5 of line 3.
    for (script, at) in [
        ("CREATE DATASET d AS SELECT 1 2", (1, 30)),
        (
            "SELECT 1;\nCREATE DATASET d AS SELECT 1 AS n,\n  2 3",
            (3, 5),
        ),
    ] {
        match r.run(script).await.expect_err(script) {
            Error::Script { line, column, .. } => assert_eq!((line, column), at, "{script:?}"),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_create_dataset_explains_its_query_and_saves_nothing() {
    let root = tempfile::tempdir().expect("root");
    let data = data_dir();
    let r = runner(root.path());
    let plan = last_table(
        &r,
        &format!(
            "SET prefetch = 3;\nexplain\n  CREATE DATASET never AS SELECT sha256(file) AS h FROM read_storage('{}');",
            data.path().display()
        ),
    )
    .await;
    assert!(
        plan.contains("PrefetchExec: prefetch=3") && plan.contains("MapExec: udf=sha256"),
        "{plan}"
    );
    let shown = last_table(&r, "SHOW DATASETS").await;
    assert!(!shown.contains("never"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_out_of_range_say_what_is_accepted() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    let err = r
        .run("SET parallel = 2;\nSET batch_size = 0;")
        .await
        .expect_err("batch_size 0");
    assert_eq!(
        err.to_string(),
        "line 2, column 1: batch_size must be a whole number from 1 to 16777216, got \"0\""
    );
    match &err {
        Error::Script { source, .. } => assert!(
            matches!(&**source, Error::Setting { name, value, .. } if name == "batch_size" && value == "0"),
            "{source:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.settings().get_batch_size(), 1000, "not applied");
    let err = r.run("SET prefetch = -1").await.expect_err("negative");
    assert!(
        err.to_string()
            .ends_with("prefetch must be a whole number from 0 to 65536 or \"auto\", got \"-1\""),
        "{err}"
    );
}
