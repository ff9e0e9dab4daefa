//! `udfchain pipeline run` prints one JSON line per trigger; `ls` and `show` list the keys.

use udfchain_testkit::stdout_ok as ok;

use super::{T0, cli_setup, udfchain};

#[test]
fn cli_run_prints_one_json_line_per_trigger_and_ls_show_keys() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("root");
    let log = dir.path().join("hook.log");
    let hook = format!(
        "[\"sh\", \"-c\", \"echo $UDFCHAIN_PIPELINE $UDFCHAIN_TRIGGER_ID $UDFCHAIN_DATASET $UDFCHAIN_FLIGHT_ADDR >> {}; echo noise\"]",
        log.display()
    );
    let config = cli_setup(dir.path(), "demo", &hook);
    let cfg = config.to_str().expect("utf8");
    // Up to T0+5 (RFC 3339), at most 2 triggers.
    let out = ok(&udfchain(
        &root,
        &[
            "pipeline",
            "run",
            cfg,
            "--replay-to",
            "2023-11-14T22:13:25Z",
            "--max-triggers",
            "2",
            "--flight-addr",
            "127.0.0.1:50051",
        ],
    ));
    assert_eq!(
        out,
        format!(
            "{{\"trigger_id\":0,\"at\":{},\"num_keys\":2,\"num_partitions\":1,\"partition_sizes\":[2],\"dataset\":\"demo-trigger-0\"}}\n\
             {{\"trigger_id\":1,\"at\":{},\"num_keys\":4,\"num_partitions\":2,\"partition_sizes\":[3,1],\"dataset\":\"demo-trigger-1\"}}\n",
            T0 + 1,
            T0 + 3
        )
    );
    // The rest up to T0+5 (2023-11-14T22:13:25Z = T0+5): trigger 2 after key 5.
    let out = ok(&udfchain(
        &root,
        &["pipeline", "run", cfg, "--replay-to", &(T0 + 5).to_string()],
    ));
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("{\"trigger_id\":2,"), "{out}");
    assert_eq!(
        std::fs::read_to_string(&log).expect("hook log"),
        "demo 0 demo-trigger-0 127.0.0.1:50051\ndemo 1 demo-trigger-1 127.0.0.1:50051\ndemo 2 demo-trigger-2\n"
    );
    let ls = ok(&udfchain(&root, &["pipeline", "ls"]));
    assert_eq!(ls, "demo\ttriggers=3\tpending=0\tsamples=8\n");
    let show = ok(&udfchain(&root, &["pipeline", "show", "demo"]));
    assert!(show.starts_with("config:\n  name: demo\n"), "{show}");
    assert!(
        show.contains("\"trigger_id\":2") && show.contains("\"status\":\"done\""),
        "{show}"
    );
    // Trigger 1 holds every key so far (0..3), partitions of 3 then 1.
    let keys = ok(&udfchain(
        &root,
        &["pipeline", "keys", "demo", "1", "--format", "csv"],
    ));
    let mut lines: Vec<&str> = keys.lines().collect();
    assert_eq!(lines.remove(0), "key,path,index,timestamp,label,weight");
    lines.sort();
    assert_eq!(
        lines,
        (0..4)
            .map(|i| format!("{i},f{i}.csv,0,{},{},1", T0 + i, i % 3))
            .collect::<Vec<_>>()
    );
    let p1 = ok(&udfchain(
        &root,
        &["pipeline", "keys", "demo", "1", "--partition", "1"],
    ));
    assert_eq!(p1.lines().count(), 2, "{p1}");
    let bad = udfchain(
        &root,
        &["pipeline", "keys", "demo", "1", "--partition", "2"],
    );
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("has 2 partition(s), no partition 2"),
        "{bad:?}"
    );
    let missing = udfchain(&root, &["pipeline", "show", "dem"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("did you mean demo?"));
}
