//! Progress of long runs: the live display in a real terminal (a pty made by
//! util-linux `script`), its absence in pipes, with `--quiet` and under `CI`,
//! the summary line on stderr, and the Rust callback of `collect_with_progress`
//! / `save_with_progress`, all driven by operator metrics while the plan runs.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use udfchain::{File, Progress, Session, Settings};

use udfchain_testkit::write_files;

/// Runs `udfchain --root ROOT ARGS` inside a pseudo-terminal (`script -qfc`),
/// returning everything the terminal showed. `CI` is removed unless `ci`.
fn in_terminal(root: &Path, args: &[&str], ci: bool) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut cmd = vec![
        quote(env!("CARGO_BIN_EXE_udfchain")),
        "--root".into(),
        quote(root.to_str().expect("utf8 root")),
    ];
    cmd.extend(args.iter().map(|a| quote(a)));
    let mut script = Command::new("script");
    script
        .args(["-qfec", &cmd.join(" "), "/dev/null"])
        .stdin(Stdio::null())
        .env_remove("CI");
    if ci {
        script.env("CI", "true");
    }
    let out = script
        .output()
        .expect("util-linux `script` runs the CLI in a pty");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "exit {:?}: {text}", out.status.code());
    text
}

fn piped(root: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(root)
        .args(args)
        .env_remove("CI")
        .output()
        .expect("run udfchain");
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every `k` in `k/total rows` shown, in order.
fn done_of(text: &str, total: usize) -> Vec<usize> {
    let needle = format!("/{total} rows");
    text.match_indices(&needle)
        .filter_map(|(i, _)| {
            let digits: String = text[..i]
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_digit())
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            digits.parse().ok()
        })
        .collect()
}

#[test]
fn a_terminal_shows_files_done_of_the_total_while_create_dataset_runs() {
    const N: usize = 3000;
    let data = tempfile::tempdir().expect("data");
    // line_count's byte loop (a debug build of this crate) keeps the map
    // running past the listing's end; sha256 (sha2 at opt-level 3) did not.
    write_files(data.path(), N, |_| 48 << 10);
    let root = tempfile::tempdir().expect("root");
    let script = root.path().join("s.sql");
    std::fs::write(
        &script,
        format!(
            "SET parallel = 1;\nCREATE DATASET x AS SELECT line_count(file) AS h FROM read_storage('{}');\n",
            data.path().display()
        ),
    )
    .expect("script");
    let shown = in_terminal(root.path(), &["run", script.to_str().expect("utf8")], false);
    let saved = shown
        .find("saved dataset x version 1 (3000 rows)")
        .unwrap_or_else(|| panic!("no saved message: {shown}"));
    let before = &shown[..saved];
    // While the statement ran: the UDF line showed rows done of the total
    // (known once the listing ended) before every file was done.
    let done = done_of(before, N);
    assert!(
        done.iter().any(|&k| k < N),
        "no `k/{N} rows` with k < {N} before the end: {done:?}\n{before}"
    );
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{done:?}");
    assert!(before.contains("line_count (map)"), "{before}");
    assert!(
        before.contains(&format!("listed {N} files (all)")),
        "{before}"
    );
    // The summary line comes after the display, before the message.
    assert!(
        before.contains(&format!("{N} rows, {N} files, "))
            && before.contains(" MiB read in place in "),
        "{before}"
    );
}

#[test]
fn quiet_and_ci_terminals_show_no_progress() {
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 5, |_| 100);
    let root = tempfile::tempdir().expect("root");
    let sql = format!(
        "SELECT sha256(file) AS h FROM read_storage('{}')",
        data.path().display()
    );
    // Control: a terminal gets the display (sampled at once, even for a short run).
    let shown = in_terminal(root.path(), &["query", &sql], false);
    assert!(shown.contains("rows/s"), "{shown}");
    assert!(shown.contains("5 rows, 5 files, "), "{shown}");

    let quiet = in_terminal(root.path(), &["--quiet", "query", &sql], false);
    assert!(
        !quiet.contains("rows/s") && !quiet.contains("listed") && !quiet.contains(" files, "),
        "{quiet}"
    );
    assert!(quiet.contains("| h "), "{quiet}");

    let ci = in_terminal(root.path(), &["query", &sql], true);
    assert!(!ci.contains("rows/s") && !ci.contains("listed"), "{ci}");
    assert!(ci.contains("5 rows, 5 files, "), "{ci}");
}

#[test]
fn pipes_get_the_summary_on_stderr_only_and_quiet_gets_none() {
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), 7, |i| 10 + i);
    let root = tempfile::tempdir().expect("root");
    let sql = format!(
        "SELECT count(*) AS n FROM read_storage('{}')",
        data.path().display()
    );
    let loud = piped(root.path(), &["query", &sql, "--format", "csv"]);
    let quiet = piped(root.path(), &["-q", "query", &sql, "--format", "csv"]);
    let stdout = String::from_utf8_lossy(&loud.stdout);
    assert_eq!(stdout, "n\n7\n");
    assert_eq!(loud.stdout, quiet.stdout);
    let err = String::from_utf8_lossy(&loud.stderr);
    assert!(err.starts_with("1 row, 7 files in "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // No display in a pipe: no terminal codes, no progress lines.
    assert!(!err.contains('\u{1b}') && !err.contains("rows/s"), "{err}");
    assert_eq!(String::from_utf8_lossy(&quiet.stderr), "");

    let script = root.path().join("s.sql");
    std::fs::write(
        &script,
        format!(
            "CREATE DATASET y AS SELECT sha256(file) AS h FROM read_storage('{}');",
            data.path().display()
        ),
    )
    .expect("script");
    let run = piped(root.path(), &["run", script.to_str().expect("utf8")]);
    assert_eq!(String::from_utf8_lossy(&run.stdout), "");
    let err = String::from_utf8_lossy(&run.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("7 rows, 7 files, 91 B read in place in "),
        "{err}"
    );
    assert_eq!(lines[1], "saved dataset y version 1 (7 rows)");
    let run = piped(
        root.path(),
        &["--quiet", "run", script.to_str().expect("utf8")],
    );
    assert_eq!(
        String::from_utf8_lossy(&run.stderr),
        "saved dataset y version 2 (7 rows)\n"
    );
}

/// Checks the samples of one run: counts never go down, the last one is the
/// only finished one, and at least one came before it.
fn check_samples(samples: &[Progress], n: usize, udfs: &[&str]) {
    assert!(samples.len() >= 2, "{samples:?}");
    let (last, running) = samples.split_last().expect("samples");
    assert!(last.finished && running.iter().all(|p| !p.finished));
    for w in samples.windows(2) {
        assert!(w[0].files_listed <= w[1].files_listed, "{w:?}");
        assert!(w[0].files_fetched <= w[1].files_fetched, "{w:?}");
        assert!(w[0].elapsed <= w[1].elapsed, "{w:?}");
        for (a, b) in w[0].udfs.iter().zip(&w[1].udfs) {
            assert!(a.rows <= b.rows, "{w:?}");
        }
        // A total, once given, is the final one; before it, the rows listed
        // so far bound it from below.
        for u in &w[0].udfs {
            assert!(u.total.is_none_or(|t| t == n), "{w:?}");
            assert!(u.total.is_none() || u.listed.is_none(), "{w:?}");
            assert!(u.listed.is_none_or(|l| l <= n && u.rows <= l), "{w:?}");
        }
    }
    assert_eq!(last.files_listed, n);
    assert!(last.listing_done && last.has_listing);
    assert_eq!(
        last.files_fetched + last.cache_hits + last.files_in_place,
        n
    );
    let names: Vec<&str> = last.udfs.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, udfs);
    for u in &last.udfs {
        assert_eq!((u.rows, u.total), (n, Some(n)), "{last:?}");
    }
    assert_eq!(last.eta, Some(std::time::Duration::ZERO));
    assert_eq!(last.lines().len(), 1 + udfs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_and_save_with_progress_report_counts_up_to_the_file_count() {
    const N: usize = 400;
    let data = tempfile::tempdir().expect("data");
    write_files(data.path(), N, |_| 4096);
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()).parallel(1));
    let uri = data.path().to_str().expect("utf8");
    let chain = session
        .from_storage(uri)
        .map("len", |f: File| async move {
            f.read().await.map(|b| b.len() as u64)
        })
        .map_on(&["len"], "double", |n: u64| async move {
            Ok::<u64, std::io::Error>(n * 2)
        });

    let mut samples = Vec::new();
    let batches = chain
        .collect_with_progress(|p| samples.push(p.clone()))
        .await
        .expect("collect");
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), N);
    check_samples(&samples, N, &["len", "double"]);

    let mut samples = Vec::new();
    let info = chain
        .save_with_progress("sized", |p| samples.push(p.clone()))
        .await
        .expect("save");
    assert_eq!(info.rows, N as u64);
    check_samples(&samples, N, &["len", "double"]);
}
