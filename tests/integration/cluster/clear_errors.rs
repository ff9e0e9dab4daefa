//! Failures on a cluster reach the user as one clear error, at once.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use udfchain::cluster::UdfRegistry;
use udfchain::{Session, Settings};

use super::{Child, free_port, meta, picky, registry, server_with_files};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udf_the_executor_lacks_fails_at_once_naming_it_and_the_executor() {
    let server = server_with_files(4);
    let lacking = UdfRegistry::new().register_map("other", meta);
    let cluster = Session::standalone(server.settings(), lacking, 1)
        .await
        .expect("standalone cluster");
    let started = Instant::now();
    let chain = cluster.from_storage("s3://bucket/data/").map("meta", meta);
    let run = chain.collect();
    let err = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("no hang")
        .expect_err("the executor has no UDF meta");
    let text = err.to_string();
    assert!(text.contains("UDF meta"), "{text}");
    assert!(text.contains("standalone executor"), "{text}");
    assert!(text.contains("other"), "names what it has: {text}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_that_is_down_is_a_clear_error_at_once() {
    let port = free_port();
    let started = Instant::now();
    let err = Session::remote(&format!("df://127.0.0.1:{port}"), Settings::new())
        .await
        .expect_err("nothing listens there");
    let text = err.to_string();
    assert!(text.contains("cannot connect to the scheduler"), "{text}");
    assert!(text.contains(&port.to_string()), "{text}");
    assert!(started.elapsed() <= udfchain::cluster::CONNECT_TIMEOUT + Duration::from_secs(1));
    let bad = Session::remote("df://no-port", Settings::new())
        .await
        .expect_err("no port");
    assert!(bad.to_string().contains("df://HOST:PORT"), "{bad}");
}

/// A UDF failing on an executor (on_error = fail) reaches the client as one
/// readable line naming the UDF, the file and the cause, as locally, not as
/// Ballista's nested `Debug` text (which stays in the error's sources).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_error_reaches_the_client_as_one_readable_line() {
    let server = server_with_files(4);
    let cluster = Session::standalone(server.settings().workers(1), registry(), 1)
        .await
        .expect("standalone cluster");
    let err = cluster
        .from_storage("s3://bucket/data/")
        .settings(Settings::new().on_error(udfchain::OnError::Fail))
        .map("n", picky)
        .collect()
        .await
        .expect_err("odd lengths fail");
    let text = err.to_string();
    eprintln!("{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    for part in ["picky", "s3://bucket/data/", "odd length"] {
        assert!(text.contains(part), "{part}: {text}");
    }
    for noise in ["Execution(", "\\\"", "DataFusionError"] {
        assert!(!text.contains(noise), "{noise}: {text}");
    }
    let mut sources = String::new();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        sources.push_str(&s.to_string());
        source = s.source();
    }
    assert!(sources.contains("Execution("), "the raw report: {sources}");
}

/// A query on a cluster whose scheduler has no executor. Run by the CLI in
/// a pseudo-terminal (util-linux `script`), where the live display draws: it
/// says "waiting for an executor", and after `cluster_executor_timeout` the
/// query fails with an error saying so, instead of waiting silently forever
/// (the test's own bound fails a run that never ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_on_a_cluster_without_executors_says_so_and_gives_up() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let _scheduler = Child::scheduler(port);
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let cmd = [
        env!("CARGO_BIN_EXE_udfchain"),
        "--root",
        dir.path().to_str().expect("utf8 dir"),
        "--cluster",
        &format!("df://127.0.0.1:{port}"),
        "--set",
        "cluster_executor_timeout=3s",
        "query",
        "SELECT 1 AS one",
    ]
    .map(quote)
    .join(" ");
    let run = tokio::task::spawn_blocking(move || {
        Command::new("script")
            .args(["-qfec", &cmd, "/dev/null"])
            .stdin(Stdio::null())
            .env_remove("CI")
            .output()
            .expect("util-linux `script` runs the CLI in a pty")
    });
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the query ends although no executor ever registers")
        .expect("join");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("waiting for an executor"), "{text}");
    assert!(
        text.contains("no executor registered at the scheduler for 3s (cluster_executor_timeout)"),
        "{text}"
    );
}
