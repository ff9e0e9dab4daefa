//! Measuring a workload in a process of its own: [`run_child_test`] runs one
//! ignored test of the current test binary as a child process, and the child
//! reports its peak resident memory with [`report_peak_rss`], read back by
//! [`child_peak_rss`]. A test's own process shares its heap with every test
//! running beside it, so memory bounds are measured in a child.
//!
//! Guarantees: the child runs exactly one test (`--exact --ignored`), with
//! the given environment added; a child that fails panics the caller with
//! its output; a child gone past `timeout` is killed and panics the caller.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Peak resident memory of this process so far (`VmHWM`), in bytes; `None`
/// where `/proc/self/status` does not say (not Linux).
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Prints this process's peak resident memory where [`child_peak_rss`] finds it.
pub fn report_peak_rss() {
    println!("udfchain-test-peak-rss={}", peak_rss().unwrap_or(0));
}

/// The peak resident memory a child reported with [`report_peak_rss`].
pub fn child_peak_rss(stdout: &str) -> Option<u64> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("udfchain-test-peak-rss="))
        .and_then(|v| v.trim().parse().ok())
}

/// Runs the ignored test `name` (its full path, e.g. `pressure::child`) of
/// this test binary in a child process with `envs` added; its stdout.
pub fn run_child_test(name: &str, envs: &[(&str, &str)], timeout: Duration) -> String {
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn the child test");
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the child") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child test {name} ran past {timeout:?} and was killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    assert!(
        status.success(),
        "child test {name} failed ({status}):\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "child test {name} did not run (no such ignored test?):\n{stdout}"
    );
    stdout
}
