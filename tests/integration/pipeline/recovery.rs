//! Failing hooks and callbacks, kill -9 and Ctrl-C: a rerun loses no trigger, repeats none.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use udfchain::pipeline::Pipeline;

use udfchain_testkit::stdout_ok as ok;

use super::{cli_setup, csv_config, csv_files, session, udfchain};

/// A failing hook stops the run with an error naming the trigger and the
/// exit status; the trigger stays pending and a rerun retries it.
#[tokio::test]
async fn a_failing_hook_stops_the_pipeline_and_a_rerun_retries_it() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let flag = dir.path().join("fail");
    std::fs::write(&flag, "").expect("flag");
    let hook = format!(
        "[\"sh\", \"-c\", \"test $UDFCHAIN_TRIGGER_ID != 1 || ! test -e {} || exit 3\"]",
        flag.display()
    );
    let config = cli_setup(dir.path(), "flaky", &hook);
    let cfg = config.to_str().expect("utf8");
    let out = udfchain(&root, &["pipeline", "run", cfg]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pipeline flaky: training hook of trigger 1 failed")
            && err.contains("exit status: 3"),
        "{err}"
    );
    // Trigger 0 was printed and recorded; 1 is pending.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let show = ok(&udfchain(&root, &["pipeline", "show", "flaky"]));
    assert!(show.contains("\"status\":\"pending\""), "{show}");
    std::fs::remove_file(&flag).expect("unflag");
    let out = ok(&udfchain(&root, &["pipeline", "run", cfg]));
    let ids: Vec<u64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("json")["trigger_id"]
                .as_u64()
                .expect("id")
        })
        .collect();
    assert_eq!(ids, vec![1, 2, 3]);
    let datasets = session(&root)
        .catalog()
        .await
        .expect("catalog")
        .list()
        .await
        .expect("list");
    assert_eq!(
        datasets
            .iter()
            .filter(|d| d.name == "flaky-trigger-1")
            .count(),
        1,
        "one version of the retried trigger's set"
    );
}

/// The CLI killed with SIGKILL at several points (early, mid-run, and inside
/// the hooks of triggers 1 and 3) and run again: every trigger is recorded
/// exactly once, none is printed twice, and each set equals the one an
/// uninterrupted run computes, key by key and in order.
#[tokio::test]
async fn kill_9_and_rerun_repeat_and_lose_no_trigger() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let log = dir.path().join("hook.log");
    let d = dir.path().display();
    for k in [1, 3] {
        std::fs::write(dir.path().join(format!("block-{k}")), "").expect("block");
    }
    // The first attempt of a blocked trigger's hook waits to be killed.
    let hook = format!(
        "[\"sh\", \"-c\", \"echo start $UDFCHAIN_TRIGGER_ID >> {d}/hook.log; \
         if [ -e {d}/block-$UDFCHAIN_TRIGGER_ID ]; then rm {d}/block-$UDFCHAIN_TRIGGER_ID; \
         echo $$ > {d}/hookpid; touch {d}/blocked; exec sleep 60; fi; \
         echo end $UDFCHAIN_TRIGGER_ID >> {d}/hook.log\"]"
    );
    let config = cli_setup(dir.path(), "durable", &hook);
    let cfg = config.to_str().expect("utf8");
    let blocked = dir.path().join("blocked");
    let mut printed: Vec<u64> = Vec::new();
    let mut kills = 0;
    let early = [Duration::from_millis(30), Duration::from_millis(250)];
    for attempt in 0.. {
        assert!(attempt < 12, "the pipeline never finished");
        let mut child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
            .arg("--root")
            .arg(&root)
            .args(["pipeline", "run", cfg])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let started = std::time::Instant::now();
        let killed = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                assert!(status.success(), "run {attempt} failed: {status}");
                break false;
            }
            let due = early.get(attempt).is_some_and(|d| started.elapsed() >= *d);
            if due || blocked.exists() {
                child.kill().expect("SIGKILL");
                child.wait().expect("reap");
                if blocked.exists() {
                    let pid = std::fs::read_to_string(dir.path().join("hookpid")).expect("pid");
                    let _ = Command::new("kill").args(["-9", pid.trim()]).status();
                    std::fs::remove_file(&blocked).expect("unblock");
                }
                kills += 1;
                break true;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut out)
            .expect("stdout");
        for line in out.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("json line");
            printed.push(v["trigger_id"].as_u64().expect("id"));
        }
        if !killed {
            break;
        }
    }
    assert!(kills >= 2, "killed inside both hooks");
    let mut unique = printed.clone();
    unique.dedup();
    assert_eq!(printed, unique, "no trigger printed twice: {printed:?}");
    let show = ok(&udfchain(&root, &["pipeline", "show", "durable"]));
    let states: Vec<(u64, String)> = show
        .lines()
        .filter(|l| l.starts_with("  {"))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l.trim()).expect("json");
            (
                v["trigger_id"].as_u64().expect("id"),
                v["status"].as_str().expect("status").to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        (0..4).map(|i| (i, "done".to_string())).collect::<Vec<_>>()
    );
    let hook_log = std::fs::read_to_string(&log).expect("log");
    for k in [1, 3] {
        assert_eq!(
            hook_log.matches(&format!("end {k}\n")).count(),
            1,
            "trigger {k} trained once after its kill: {hook_log}"
        );
    }
    // The same sets as a run never killed, key by key in order.
    let reference = dir.path().join("reference-root");
    let plain = cli_setup(&dir.path().join("ref"), "durable", "[\"true\"]");
    ok(&udfchain(
        &reference,
        &["pipeline", "run", plain.to_str().expect("utf8")],
    ));
    for t in 0..4 {
        let t = t.to_string();
        let want = ok(&udfchain(&reference, &["pipeline", "keys", "durable", &t]));
        let got = ok(&udfchain(&root, &["pipeline", "keys", "durable", &t]));
        // Paths are relative to each run's data dir: equal.
        assert_eq!(got, want, "trigger {t}");
    }
    let datasets = session(&root)
        .catalog()
        .await
        .expect("catalog")
        .list()
        .await
        .expect("list");
    let mut names: Vec<(String, u32)> = datasets.into_iter().map(|d| (d.name, d.version)).collect();
    names.sort();
    assert_eq!(
        names.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        (0..4)
            .map(|i| format!("durable-trigger-{i}"))
            .collect::<Vec<_>>(),
        "one version per trigger: {names:?}"
    );
    // Triggers 1 and 3 were saved, then killed in their hook: the rerun
    // removed that save and saved again under a new number (never reused).
    for k in [1, 3] {
        assert!(names[k].1 >= 2, "trigger {k}: {names:?}");
    }
}

/// Ctrl-C at a terminal (SIGINT to the whole foreground process group) while
/// a hook trains: the hook, in its own group, finishes; the pipeline records
/// that trigger and stops with exit 0 before the next one.
#[test]
fn ctrl_c_lets_the_running_hook_finish() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let d = dir.path().display();
    let hook = format!(
        "[\"sh\", \"-c\", \"touch {d}/running; sleep 1; echo trained $UDFCHAIN_TRIGGER_ID >> {d}/log\"]"
    );
    let config = cli_setup(dir.path(), "patient", &hook);
    let child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(&root)
        .args(["pipeline", "run", config.to_str().expect("utf8")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn");
    let running = dir.path().join("running");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !running.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the hook never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let group = format!("-{}", child.id());
    assert!(
        Command::new("kill")
            .args(["-INT", "--", &group])
            .status()
            .expect("kill")
            .success()
    );
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("{\"trigger_id\":0,"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("log")).expect("log"),
        "trained 0\n"
    );
}

/// A Rust training callback that fails stops the replay with an error naming
/// the trigger; a rerun retries it. A pipeline's data, trigger or selection
/// config cannot change under its state; its poll interval can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_callback_and_a_changed_config() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    csv_files(data.path());
    let session = session(root.path());
    let config = || {
        csv_config(
            "cb",
            data.path(),
            "{amount: {num_samples: 4}}",
            "{strategy: new_data, maximum_keys_in_memory: 4, tail_triggers: 0}",
        )
    };
    let err = Pipeline::new(config())
        .session(Arc::clone(&session))
        .on_trigger(|t| {
            if t.trigger_id == 1 {
                Err(udfchain::Error::Plan("out of GPUs".into()))
            } else {
                Ok(())
            }
        })
        .replay(None, None)
        .await
        .expect_err("the callback fails");
    let msg = err.to_string();
    assert!(
        msg.contains("pipeline cb: training hook of trigger 1 failed: invalid chain: out of GPUs"),
        "{msg}"
    );
    let mut changed = config();
    changed.trigger = csv_config(
        "cb",
        data.path(),
        "{amount: {num_samples: 5}}",
        "{strategy: new_data, maximum_keys_in_memory: 4}",
    )
    .trigger;
    let err = Pipeline::new(changed)
        .session(Arc::clone(&session))
        .replay(None, None)
        .await
        .expect_err("another trigger");
    assert!(
        err.to_string()
            .contains("another data, trigger or selection config"),
        "{err}"
    );
    let mut polled = config();
    polled.data.poll_interval = Some("1s".into());
    let done = Pipeline::new(polled)
        .session(Arc::clone(&session))
        .replay(None, None)
        .await
        .expect("rerun");
    assert_eq!(
        done.iter().map(|t| t.trigger_id).collect::<Vec<_>>(),
        vec![1, 2],
        "trigger 1 retried, then 2"
    );
}
