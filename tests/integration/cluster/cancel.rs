//! A dropped stream or Ctrl-C cancels the job on the cluster, in process and across processes.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use udfchain::cluster::UdfRegistry;
use udfchain::{Chain, Session, Settings};

use udfchain_testkit::{S3Server, write_files};

use super::{COUNTED, Child, Cluster, counted, free_port, server_with_files};

/// `counted` over `s3://bucket/data/` in `session`, on one partition.
fn counted_chain(session: &Arc<Session>) -> Chain {
    session
        .from_storage("s3://bucket/data/")
        .settings(Settings::new().prefetch(2).parallel(1))
        .map("n", counted)
}

/// Runs the 60-file `counted` chain for 1.5 s, drops it, and returns the
/// call counts (by `count`) 1.5 s and 3.5 s after the drop.
async fn drop_after_a_while(session: &Arc<Session>, count: impl Fn() -> usize) -> (usize, usize) {
    let run = tokio::time::timeout(
        Duration::from_millis(1500),
        counted_chain(session).collect(),
    )
    .await;
    assert!(run.is_err(), "the query takes ~6 s, it cannot end in 1.5 s");
    calls_after_the_drop(&count).await
}

/// After a cancel the executor's one slot is free: a 3-file query (on a
/// prefix of its own) is done well before the cancelled job would have been.
async fn the_slot_is_free(session: &Arc<Session>) {
    let started = Instant::now();
    let rows = session
        .from_storage("s3://bucket/few/")
        .settings(Settings::new().prefetch(2))
        .map("n", counted)
        .collect()
        .await
        .expect("a query after the cancel");
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "waited for the cancelled job: {:?}",
        started.elapsed()
    );
}

/// A client that drops a query's stream before its end (a timeout around
/// `collect`) has the job cancelled on the cluster: the executor stops
/// calling the UDF well before the 60 files are done, and its one slot is
/// free for the next query. Without the cancel the job runs to its end
/// (~6 s, the count growing after the drop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_query_is_cancelled_on_the_cluster() {
    let server = server_with_files(60);
    write_files(&server.bucket_dir().join("few"), 3, |i| 10 + i);
    let cluster = Session::standalone(
        server.settings().workers(1),
        UdfRegistry::new().register_map("counted", counted),
        1,
    )
    .await
    .expect("standalone cluster");
    let count = || COUNTED.load(std::sync::atomic::Ordering::SeqCst);
    let (after_cancel, later) = drop_after_a_while(&cluster, count).await;
    assert!(after_cancel > 0, "the job started");
    assert_eq!(later, after_cancel, "calls went on after the cancel");
    assert!(later < 60, "the whole job ran: {later} calls");
    the_slot_is_free(&cluster).await;
}

/// The same with real processes: a scheduler and two executor processes
/// of one slot each; the calls are counted in files the executors append to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_query_is_cancelled_on_a_cluster_of_processes() {
    let server = server_with_files(60);
    write_files(&server.bucket_dir().join("few"), 3, |i| 10 + i);
    let cluster = Cluster::start().await;
    let session = Session::remote(&cluster.url(), server.settings().workers(1))
        .await
        .expect("connect");
    let counts: Vec<PathBuf> = cluster
        .work_dirs
        .iter()
        .map(|w| w.with_extension("count"))
        .collect();
    let count = || {
        counts
            .iter()
            .map(|c| std::fs::metadata(c).map(|m| m.len() as usize).unwrap_or(0))
            .sum::<usize>()
    };
    let chain = counted_chain(&session);
    let run = tokio::spawn(async move { chain.collect().await });
    // The job, named by its shuffle dir `<work dir>/<job id>/`, runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    let job = loop {
        let jobs: Vec<String> = cluster
            .work_dirs
            .iter()
            .filter_map(|w| std::fs::read_dir(w).ok())
            .flat_map(|d| d.flatten())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            // Not udfchain's caches, not DataFusion's spill dirs.
            .filter(|name| name != "udfchain" && !name.starts_with("datafusion-"))
            .collect();
        if let [job] = jobs.as_slice() {
            break job.clone();
        }
        assert!(Instant::now() < deadline, "no job started: {jobs:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let status = scheduler_job_status(cluster.port, &job).await;
    assert!(status.contains("Running"), "the job: {status}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The client drops the query's stream.
    run.abort();
    assert!(
        run.await.is_err(),
        "the query takes ~6 s, it cannot end in 1.5 s"
    );
    let (after_cancel, later) = calls_after_the_drop(&count).await;
    assert!(after_cancel > 0, "the job started");
    assert_eq!(later, after_cancel, "calls went on after the cancel");
    assert!(later < 60, "the whole job ran: {later} calls");
    // The scheduler failed the job as cancelled (and may have forgotten it).
    let status = scheduler_job_status(cluster.port, &job).await;
    eprintln!("job {job} after the cancel: {status}");
    assert!(
        status.contains("Failed") && status.contains("\"Cancelled\"") || status == "None",
        "the job: {status}"
    );
    the_slot_is_free(&session).await;
}

/// The scheduler's status of `job`, as `Debug` text.
async fn scheduler_job_status(port: u16, job: &str) -> String {
    use ballista_core::serde::protobuf::GetJobStatusParams;
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
    let mut client = SchedulerGrpcClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to the scheduler");
    let status = client
        .get_job_status(GetJobStatusParams {
            job_id: job.to_string(),
        })
        .await
        .expect("job status")
        .into_inner()
        .status;
    format!("{status:?}")
}

/// Ctrl-C (SIGINT) of `udfchain --cluster ... query` cancels the job on the
/// cluster: the CLI exits with status 130 and says so, and the executor
/// process stops downloading (the S3 server, 150 ms per request, sees no new
/// GET).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_of_the_cli_cancels_its_job_on_the_cluster() {
    interrupt_a_cluster_run(false).await;
}

/// The same when the cluster is chosen by the script (`SET cluster = ...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_of_a_script_that_set_its_cluster_cancels_its_job() {
    interrupt_a_cluster_run(true).await;
}

async fn interrupt_a_cluster_run(cluster_in_script: bool) {
    let server = S3Server::start_shaped(Duration::from_millis(150), None);
    write_files(&server.bucket_dir().join("data"), 40, |i| 20 + i);
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let _scheduler = Child::scheduler(port);
    let work = dir.path().join("exec");
    let _executor = Child::cli_executor(port, &work, 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let url = format!("df://127.0.0.1:{port}");
    let mut args: Vec<String> = vec![
        "--root".into(),
        dir.path().join("root").display().to_string(),
    ];
    if !cluster_in_script {
        args.extend(["--cluster".into(), url.clone()]);
    }
    for kv in [
        format!("storage.endpoint={}", server.endpoint),
        "storage.allow_http=true".into(),
        format!("storage.access_key_id={}", udfchain_testkit::ACCESS_KEY),
        format!("storage.secret_access_key={}", udfchain_testkit::SECRET_KEY),
        "storage.region=us-east-1".into(),
        "storage.virtual_hosted_style_request=false".into(),
        "workers=1".into(),
        "prefetch=1".into(),
    ] {
        args.extend(["--set".into(), kv]);
    }
    let sql = "SELECT sha256(file) AS h FROM read_storage('s3://bucket/data/')";
    if cluster_in_script {
        let script = dir.path().join("job.sql");
        std::fs::write(&script, format!("SET cluster = '{url}';\n{sql};\n")).expect("script");
        args.extend(["run".into(), script.display().to_string()]);
    } else {
        args.extend(["query".into(), sql.into()]);
    }
    let client = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .args(&args)
        .env("CI", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the client");
    // The job runs (GETs arrive), then Ctrl-C.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.object_gets() < 3 {
        assert!(Instant::now() < deadline, "the job did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = client.id().to_string();
    let kill = Command::new("kill").args(["-INT", &pid]).status();
    assert!(kill.expect("kill").success());
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || client.wait_with_output()),
    )
    .await
    .expect("the client exits soon after Ctrl-C")
    .expect("join")
    .expect("client output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "interrupted (Ctrl-C): the running job was cancelled on the cluster {url}"
        )),
        "{stderr}"
    );
    let at_exit = server.object_gets();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after_cancel = server.object_gets();
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!("GETs: {at_exit} when the CLI exited, {after_cancel} 1.5 s later");
    assert_eq!(server.object_gets(), after_cancel, "GETs went on");
    assert!(after_cancel < 40, "the whole job ran: {after_cancel} GETs");
}

/// The UDF calls counted 1.5 s after a drop (the cancel has reached the
/// executor; a call in flight may still finish) and 2 s after that.
async fn calls_after_the_drop(count: &impl Fn() -> usize) -> (usize, usize) {
    let at_drop = count();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after_cancel = count();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let later = count();
    eprintln!("calls: {at_drop} at the drop, {after_cancel} 1.5 s later, {later} 3.5 s later");
    (after_cancel, later)
}
