//! Live mode picks up files added while it runs (library, and the CLI stopped by Ctrl-C).

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use udfchain::pipeline::{Pipeline, StopHandle, TriggerRecord};

use super::{T0, cli_setup, csv_config, put, session, udfchain};

/// Live mode lists storage every poll interval and triggers on files written
/// while it runs; stopping returns what it finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_picks_up_files_added_while_it_runs() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    put(data.path(), "f0.csv", b"x,label\n0,0\n1,1\n", now);
    let mut config = csv_config(
        "live",
        data.path(),
        "{amount: {num_samples: 3}}",
        "{strategy: new_data, maximum_keys_in_memory: 10, tail_triggers: 0}",
    );
    config.data.poll_interval = Some("100ms".into());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pipeline = Pipeline::new(config)
        .session(session(root.path()))
        .on_completed(move |t| {
            let _ = tx.send(t.clone());
        });
    let stop = StopHandle::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { pipeline.run_live(stop).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "2 samples: no trigger yet");
    put(data.path(), "f1.csv", b"x,label\n2,2\n", now + 1);
    let t0 = next_trigger(&mut rx).await;
    assert_eq!((t0.trigger_id, t0.num_keys, t0.at), (0, 3, now + 1));
    put(
        data.path(),
        "f2.csv",
        b"x,label\n3,0\n4,1\n5,2\n6,0\n",
        now + 2,
    );
    let t1 = next_trigger(&mut rx).await;
    assert_eq!((t1.trigger_id, t1.num_keys, t1.at), (1, 3, now + 2));
    stop.stop();
    let done = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("stops")
        .expect("joined")
        .expect("live run");
    assert_eq!(done.len(), 2);
}

async fn next_trigger(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<TriggerRecord>,
) -> TriggerRecord {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("a trigger in time")
        .expect("running")
}

/// `pipeline run --live` picks up files written while it runs and stops
/// cleanly on Ctrl-C (SIGINT): exit 0, one JSON line per trigger.
#[test]
fn cli_live_run_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let config = cli_setup(dir.path(), "watch", "[\"true\"]");
    let data = dir.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(&root)
        .args(["pipeline", "run", config.to_str().expect("utf8"), "--live"])
        .args(["--poll-interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut done = |n: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let show = udfchain(&root, &["pipeline", "show", "watch"]);
            let text = String::from_utf8_lossy(&show.stdout);
            if text.matches("\"status\":\"done\"").count() >= n {
                return;
            }
            // Say what `show` and the live run said, should this ever time out.
            assert!(
                std::time::Instant::now() < deadline,
                "{n} triggers in time: show exited {:?}, stdout {text:?}, stderr {:?}; \
                 files in the data dir: {:?}; the live run: {:?}",
                show.status,
                String::from_utf8_lossy(&show.stderr),
                std::fs::read_dir(&data).map(|d| d.count()).ok(),
                child.try_wait(),
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // 8 files: 4 triggers of 2; a 9th and 10th file make a 5th.
    done(4);
    let now = T0 + 100;
    put(&data, "g0.csv", b"x,label\n8,1\n", now);
    put(&data, "g1.csv", b"x,label\n9,2\n", now);
    done(5);
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ids: Vec<u64> = stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("json")["trigger_id"]
                .as_u64()
                .expect("id")
        })
        .collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stopping the pipeline"),
        "{out:?}"
    );
}
