//! The CLI server (port, exit 0 on SIGTERM) and the Python client over pyarrow.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{client, info, items, pictures, read_epoch, spawn_cli, ticket};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_serves_and_exits_zero_on_sigterm() {
    let (root, _session) = items(100, 4).await;
    let (mut child, addr) = spawn_cli(root.path());
    let mut c = client(addr).await;
    let all = read_epoch(&mut c, r#"{"dataset": "items", "partition_rows": 30}"#).await;
    assert_eq!(all, (0..100).collect::<Vec<i64>>());
    // A stream left open must not keep the server from stopping.
    let fi = info(&mut c, r#"{"dataset": "items"}"#).await.expect("info");
    let _open = c.do_get(ticket(&fi, 0)).await.expect("do_get");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("udfchain serve did not exit after SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status:?}");
}

/// A Python with pyarrow: `UDFCHAIN_PYTHON`, the venv `.ci/run` makes, or
/// `python3`; failing those, that venv is made here from `python3` (pyarrow from
/// PyPI). `Err` says why there is none — the test skips only then.
fn python_with_pyarrow() -> Result<String, String> {
    let has_pyarrow = |py: &str| {
        Command::new(py)
            .args(["-c", "import pyarrow.flight"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let venv = std::env::var("HOME")
        .map(|h| format!("{h}/.cache/udfchain-venv"))
        .map_err(|_| "HOME is not set".to_string())?;
    let venv_python = format!("{venv}/bin/python");
    let found = std::env::var("UDFCHAIN_PYTHON")
        .ok()
        .into_iter()
        .chain([venv_python.clone(), "python3".to_string()])
        .find(|py| has_pyarrow(py));
    if let Some(py) = found {
        return Ok(py);
    }
    let run = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !run("python3", &["--version"]) {
        return Err("no python3 on PATH".into());
    }
    let pip = format!("{venv}/bin/pip");
    if !(run("python3", &["-m", "venv", &venv]) && run(&pip, &["install", "-q", "pyarrow"])) {
        return Err(format!(
            "could not make {venv} with pyarrow (python3 -m venv; pip install pyarrow)"
        ));
    }
    if has_pyarrow(&venv_python) {
        Ok(venv_python)
    } else {
        Err(format!("{venv_python} cannot import pyarrow.flight"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_reads_exactly_the_datasets_rows() {
    let python = match python_with_pyarrow() {
        Ok(python) => python,
        Err(why) => {
            println!("SKIPPED python_client_reads_exactly_the_datasets_rows: {why}");
            return;
        }
    };
    let (root, _session) = items(1000, 16).await;
    let (mut child, addr) = spawn_cli(root.path());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/python/loader.py");
    let run = |json: &str| {
        let out = Command::new(&python)
            .args([
                script,
                &format!("grpc://{addr}"),
                json,
                "--prefetch",
                "2",
                "--column",
                "id",
            ])
            .output()
            .expect("run loader.py");
        assert!(
            out.status.success(),
            "loader.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("loader.py prints JSON");
        summary
    };
    let s = run(r#"{"dataset": "items", "partition_rows": 64}"#);
    assert_eq!(s["rows"], 1000);
    assert_eq!(s["partitions"], 16);
    assert_eq!(s["checksum"], (0..1000).sum::<i64>());
    let values: Vec<i64> = serde_json::from_value(s["values"].clone()).expect("values");
    assert_eq!(values, (0..1000).collect::<Vec<i64>>(), "dataset order");

    // Two workers of a shuffled epoch: every row once between them.
    let mut both = Vec::new();
    for worker in 0..2 {
        let s = run(&format!(
            r#"{{"dataset": "items", "partition_rows": 64, "shuffle": true, "seed": 1, "worker": {worker}, "num_workers": 2}}"#
        ));
        both.extend(serde_json::from_value::<Vec<i64>>(s["values"].clone()).expect("values"));
    }
    both.sort_unstable();
    assert_eq!(both, (0..1000).collect::<Vec<i64>>());
    let _ = child.kill();
    let _ = child.wait();
}

/// pyarrow's own client, not asking for a message size, gets a partition of
/// 4 MiB in one message (Arrow's C++ client accepts any size), and the
/// request's `max_message_bytes` still bounds its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_gets_a_partition_whole_by_default() {
    let python = match python_with_pyarrow() {
        Ok(python) => python,
        Err(why) => {
            println!("SKIPPED pyarrow_gets_a_partition_whole_by_default: {why}");
            return;
        }
    };
    let (root, _session) = items(512, 8192).await;
    let (mut child, addr) = spawn_cli(root.path());
    let script = "import json, sys, pyarrow.flight as fl\n\
        c = fl.connect(sys.argv[1])\n\
        info = c.get_flight_info(fl.FlightDescriptor.for_command(sys.argv[2]))\n\
        chunks = [ch.data.num_rows for ch in c.do_get(info.endpoints[0].ticket)]\n\
        print(json.dumps({'chunks': len(chunks), 'rows': sum(chunks)}))\n";
    let run = |json: &str| {
        let out = Command::new(&python)
            .args(["-c", script, &format!("grpc://{addr}"), json])
            .output()
            .expect("run python");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let whole = run(r#"{"dataset": "items", "partition_rows": 512}"#);
    assert_eq!(whole["rows"], 512);
    assert_eq!(whole["chunks"], 1, "{whole}");
    let pieces =
        run(r#"{"dataset": "items", "partition_rows": 512, "max_message_bytes": 1048576}"#);
    assert_eq!(pieces["rows"], 512);
    assert!(pieces["chunks"].as_u64() >= Some(4), "{pieces}");
    let _ = child.kill();
    let _ = child.wait();
}

/// pyarrow's client reads a `with_images` request's tensor column as a
/// `FixedShapeTensorArray`: one (N, H, W, C) uint8 array per batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_reads_with_images_as_a_tensor() {
    let python = match python_with_pyarrow() {
        Ok(python) => python,
        Err(why) => {
            println!("SKIPPED pyarrow_reads_with_images_as_a_tensor: {why}");
            return;
        }
    };
    let (_dir, root, _session, _written) = pictures().await;
    let (mut child, addr) = spawn_cli(root.path());
    let script = "import json, sys, pyarrow as pa, pyarrow.flight as fl\n\
        c = fl.connect(sys.argv[1])\n\
        info = c.get_flight_info(fl.FlightDescriptor.for_command(sys.argv[2]))\n\
        t = pa.concat_tables([c.do_get(e.ticket).read_all() for e in info.endpoints])\n\
        col = t.column('image').combine_chunks()\n\
        print(json.dumps({'type': str(col.type), 'shape': list(col.to_numpy_ndarray().shape)}))\n";
    let out = Command::new(&python)
        .args([
            "-c",
            script,
            &format!("grpc://{addr}"),
            r#"{"dataset": "pictures", "with_images": {"size": [16, 12]}}"#,
        ])
        .output()
        .expect("run python");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(got["shape"], serde_json::json!([5, 12, 16, 3]), "{got}");
    assert!(
        got["type"]
            .as_str()
            .is_some_and(|t| t.contains("fixed_shape_tensor")),
        "{got}"
    );
}
