//! Real scheduler and executor processes: the local rows, an executor killed mid-query.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use udfchain::{Session, Settings, col};

use udfchain_testkit::{prefetch_dirs, write_files};

use super::{Child, Cluster, free_port, kinds, server_with_files, slow};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_and_two_executor_processes_give_the_local_rows() {
    let server = server_with_files(24);
    let local = kinds(&server.session()).await;
    let cluster = Cluster::start().await;
    let session = Session::remote(&cluster.url(), server.settings().workers(2))
        .await
        .expect("connect");
    let remote = tokio::time::timeout(Duration::from_secs(300), kinds(&session))
        .await
        .expect("the cluster runs finish");
    for kind in ["map", "gen", "batch_map", "agg", "agg_all"] {
        assert_eq!(remote[kind], local[kind], "{kind}: cluster rows differ");
    }
    // workers = 2 spread a UDF's partitions over both executors: some job
    // ran a task on each (a task writes its shuffle output below `<work
    // dir>/<job id>/`; Ballista deletes the files of stages already read, the
    // job's dir stays until its data is cleaned up).
    let jobs = |w: &PathBuf| -> std::collections::BTreeSet<std::ffi::OsString> {
        std::fs::read_dir(w)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name())
                    .filter(|n| n != "udfchain" && !n.to_string_lossy().starts_with("datafusion-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (a, b) = (jobs(&cluster.work_dirs[0]), jobs(&cluster.work_dirs[1]));
    assert!(
        a.intersection(&b).next().is_some(),
        "no job ran on both: {a:?} {b:?}"
    );
}

/// `slow` over `s3://bucket/data/` in `session`, as sorted (path, length).
async fn slow_rows(session: &Arc<Session>) -> udfchain::Result<Vec<(String, u64)>> {
    #[derive(Deserialize)]
    struct R {
        path: String,
        n: u64,
    }
    let mut rows: Vec<(String, u64)> = session
        .from_storage("s3://bucket/data/")
        .settings(Settings::new().prefetch(2).parallel(1).memory_file_limit(0))
        .map("n", slow)
        .select([col("file.path").alias("path"), col("n")])
        .to_rows::<R>()
        .await?
        .into_iter()
        .map(|r| (r.path, r.n))
        .collect();
    rows.sort();
    Ok(rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_mid_query_ends_the_query_in_bounded_time_and_is_swept_on_restart() {
    let server = server_with_files(40);
    let mut cluster = Cluster::start().await;
    let session = Session::remote(&cluster.url(), server.settings().workers(2))
        .await
        .expect("connect");
    let query = tokio::spawn({
        let session = Arc::clone(&session);
        async move { slow_rows(&session).await }
    });
    // Mid-query: an executor has a prefetch dir (files of its running task)
    // with its owner lock. A dir killed between its mkdir and its lock file is
    // swept only once 60 s old (owner::GRACE), so those are not waited for.
    let roots: Vec<PathBuf> = cluster
        .work_dirs
        .iter()
        .map(|w| w.join("udfchain"))
        .collect();
    let locked = |root: &PathBuf| -> Vec<PathBuf> {
        prefetch_dirs(root)
            .into_iter()
            .filter(|d| d.join(".owner.lock").exists())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let victim = loop {
        if let Some(i) = roots.iter().position(|r| !locked(r).is_empty()) {
            break i;
        }
        assert!(Instant::now() < deadline, "no executor started a task");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    cluster.executors[victim].kill();
    let killed_at = Instant::now();
    let left = locked(&roots[victim]);
    assert!(!left.is_empty(), "SIGKILL leaves the task's prefetch dir");
    // Bound: the scheduler declares it dead after EXECUTOR_TIMEOUT and runs
    // its tasks on the other executor; either way the query ends.
    let outcome = tokio::time::timeout(Duration::from_secs(120), query)
        .await
        .expect("the query ends after the kill, no hang")
        .expect("join");
    let took = killed_at.elapsed();
    eprintln!(
        "query ended {took:?} after the kill: {:?}",
        outcome.as_ref().map(|r| r.len())
    );
    // EXECUTOR_TIMEOUT + EXPIRE_CHECK to notice, then the lost tasks again.
    assert!(
        took < Duration::from_secs(90),
        "ended {took:?} after the kill"
    );
    match outcome {
        Ok(rows) => {
            let local = slow_rows(&server.session()).await.expect("local");
            assert_eq!(rows, local, "Ballista's retry gives every row once");
        }
        Err(e) => {
            let text = e.to_string();
            assert!(!text.is_empty(), "a clear error");
        }
    }
    // Restarted on the same work dir, the executor sweeps what the killed one left.
    cluster.executors[victim] = Child::executor(cluster.port, &cluster.work_dirs[victim]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while left.iter().any(|d| d.exists()) {
        assert!(
            Instant::now() < deadline,
            "orphan prefetch dirs not swept: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the `udfchain` binary with `args` (and `stdin`), at most 120 s.
async fn cli(args: Vec<String>, stdin: Option<String>) -> std::process::Output {
    let run = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
            .args(&args)
            .env("CI", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn udfchain");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("write stdin");
        }
        child.wait_with_output().expect("udfchain output")
    });
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("udfchain ends")
        .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_runs_queries_and_scripts_on_a_cluster_of_cli_processes() {
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    write_files(&data, 6, |i| 10 + i);
    let root = dir.path().join("root");
    let port = free_port();
    let _scheduler = Child::scheduler(port);
    let work = dir.path().join("exec");
    let _executor = Child::cli_executor(port, &work, 2).await;
    let url = format!("df://127.0.0.1:{port}");
    let base = |extra: &[&str]| {
        let mut a: Vec<String> = vec!["--root".into(), root.display().to_string()];
        a.extend(["--format".into(), "csv".into()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let sql = format!(
        "SELECT file.path AS path, sha256(file) AS h FROM read_storage('{}') ORDER BY path",
        data.display()
    );
    let local = cli(base(&["query", &sql]), None).await;
    let remote = cli(base(&["--cluster", &url, "query", &sql]), None).await;
    assert!(
        remote.status.success(),
        "{}",
        String::from_utf8_lossy(&remote.stderr)
    );
    let local = String::from_utf8_lossy(&local.stdout).to_string();
    assert_eq!(local.lines().count(), 7, "{local}");
    assert_eq!(String::from_utf8_lossy(&remote.stdout), local);

    // row_hash (SQL's shuffle / chunk) travels in the plan to real processes.
    let sql = format!(
        "SELECT file.path AS path, row_hash(3, file.path) % 2 AS half FROM read_storage('{}') \
         ORDER BY row_hash(3, file.path)",
        data.display()
    );
    let local = cli(base(&["query", &sql]), None).await;
    let remote = cli(base(&["--cluster", &url, "query", &sql]), None).await;
    assert!(
        remote.status.success(),
        "{}",
        String::from_utf8_lossy(&remote.stderr)
    );
    let local = String::from_utf8_lossy(&local.stdout).to_string();
    assert_eq!(local.lines().count(), 7, "{local}");
    assert_eq!(String::from_utf8_lossy(&remote.stdout), local);

    // A script switching to the cluster, saving a dataset there (committed here).
    let script = format!(
        "SET cluster = '{url}';\nSET workers = 2;\n\
         CREATE DATASET hashes AS SELECT file.path AS path, sha256(file) AS h FROM read_storage('{}');\n\
         SELECT count(*) AS n FROM read_dataset('hashes');",
        data.display()
    );
    let out = cli(base(&["run", "-"]), Some(script)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("saved dataset hashes version 1 (6 rows)"),
        "{stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "n\n6");

    // A scheduler that is down: a one-line error, soon.
    let started = Instant::now();
    let down = format!("df://127.0.0.1:{}", free_port());
    let out = cli(base(&["--cluster", &down, "query", "SELECT 1"]), None).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cannot connect to the scheduler"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}
