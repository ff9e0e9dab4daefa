//! The `udfchain` binary run as a real process: each subcommand, exit codes, formats.

use std::path::Path;
use std::process::{Command, Output};

use udfchain_testkit::stdout_ok as ok;

fn udfchain(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .expect("run udfchain")
}

fn data() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("data");
    std::fs::write(dir.path().join("a.txt"), "one\ntwo\n").expect("write");
    std::fs::create_dir_all(dir.path().join("sub")).expect("mkdir");
    std::fs::write(dir.path().join("sub/b.txt"), "three").expect("write");
    dir
}

#[test]
fn ls_and_du_in_every_format() {
    let root = tempfile::tempdir().expect("root");
    let d = data();
    let dir = d.path().to_str().expect("utf8 path");
    let table = ok(&udfchain(root.path(), &["ls", dir]));
    assert!(
        table.contains("| a.txt     | 8    |") && table.contains("| sub/b.txt | 5    |"),
        "{table}"
    );
    let csv = ok(&udfchain(root.path(), &["ls", dir, "--format", "csv"]));
    assert_eq!(csv, "path,size\na.txt,8\nsub/b.txt,5\n");
    let json = ok(&udfchain(
        root.path(),
        &["ls", dir, "--non-recursive", "--format", "json"],
    ));
    assert_eq!(json.trim(), r#"{"path":"a.txt","size":8}"#);
    let du = ok(&udfchain(root.path(), &["du", dir, "--format", "csv"]));
    assert_eq!(du, "files,bytes\n2,13\n");
    let parquet = udfchain(root.path(), &["ls", dir, "--format", "parquet"]);
    assert!(parquet.status.success() && parquet.stdout.starts_with(b"PAR1"));
}

#[test]
fn query_run_explain_and_datasets() {
    let root = tempfile::tempdir().expect("root");
    let d = data();
    let dir = d.path().display().to_string();
    let q = format!(
        "SELECT file.path AS path, line_count(file) AS n FROM read_storage('{dir}') ORDER BY path"
    );
    assert_eq!(
        ok(&udfchain(root.path(), &["query", &q, "--format", "csv"])),
        "path,n\na.txt,2\nsub/b.txt,1\n"
    );

    let script = root.path().join("job.sql");
    std::fs::write(
        &script,
        format!(
            "SET prefetch = 4;\nCREATE DATASET lines AS\n  SELECT file.path AS path, line_count(file) AS n FROM read_storage('{dir}');\nSELECT sum(n) AS total FROM read_dataset('lines');\n"
        ),
    )
    .expect("script");
    let run = udfchain(
        root.path(),
        &["run", script.to_str().expect("utf8"), "--format", "csv"],
    );
    assert_eq!(ok(&run), "total\n3\n");
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("saved dataset lines version 1 (2 rows)")
    );

    let explain = ok(&udfchain(
        root.path(),
        &["explain", script.to_str().expect("utf8")],
    ));
    assert!(
        explain.contains("PrefetchExec: prefetch=4") && explain.contains("MapExec: udf=line_count"),
        "{explain}"
    );

    let ls = ok(&udfchain(
        root.path(),
        &["datasets", "ls", "--format", "csv"],
    ));
    assert!(
        ls.starts_with("name,version,rows,bytes,created\nlines,1,2,"),
        "{ls}"
    );
    let info = ok(&udfchain(root.path(), &["datasets", "info", "lines"]));
    assert!(
        info.contains("version: 1") && info.contains("n: UInt64"),
        "{info}"
    );
    assert_eq!(
        ok(&udfchain(root.path(), &["datasets", "rm", "lines"])).trim(),
        "removed 1 version(s) of lines"
    );
    let gone = udfchain(root.path(), &["datasets", "info", "lines"]);
    assert_eq!(gone.status.code(), Some(1));
}

#[test]
fn cache_commands_and_set_flags() {
    let root = tempfile::tempdir().expect("root");
    let d = data();
    let q = format!(
        "SELECT sha256(file) AS h FROM read_storage('{}')",
        d.path().display()
    );
    ok(&udfchain(
        root.path(),
        &["query", &q, "--set", "cache=true"],
    ));
    let du = ok(&udfchain(root.path(), &["cache", "du"]));
    assert!(du.starts_with("2 entries, 13 bytes"), "{du}");
    let pruned = ok(&udfchain(root.path(), &["cache", "prune", "--to", "8"]));
    assert!(pruned.starts_with("removed 1 entries"), "{pruned}");
    ok(&udfchain(root.path(), &["cache", "clear"]));
    assert!(ok(&udfchain(root.path(), &["cache", "du"])).starts_with("0 entries, 0 bytes"));
}

#[test]
fn errors_are_one_line_with_exit_code_1() {
    let root = tempfile::tempdir().expect("root");
    let out = udfchain(root.path(), &["ls", "/no/such/dir"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("udfchain: invalid URI") && err.trim().lines().count() == 1,
        "{err}"
    );

    let out = udfchain(root.path(), &["query", "SELECT 1", "--set", "prefech=2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("did you mean prefetch"));

    let out = udfchain(
        root.path(),
        &[
            "query",
            "SELECT * FROM read_storage('/no/such/dir')",
            "--verbose",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("udfchain: line 1, column 1:"), "{err}");
    assert!(err.contains("caused by"), "--verbose prints causes: {err}");

    let out = Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .arg("nonsense")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "usage errors exit 2 (clap)");
}

fn fails(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // Messages of the statements before it, then the error on one last line.
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = err
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(
        last.starts_with("udfchain: ") && err.matches("udfchain: ").count() == 1,
        "{err}"
    );
    last
}

#[test]
fn scripts_with_odd_whitespace_comments_and_case() {
    let root = tempfile::tempdir().expect("root");
    let d = data();
    let dir = d.path().display().to_string();
    let script = root.path().join("odd.sql");
    std::fs::write(
        &script,
        format!(
            "set\tprefetch = 3; -- 'not a string\ncreate  dataset\tlines /* ; */ AS\n  SELECT file.path AS path, line_count(file) AS n FROM read_storage('{dir}') -- end\n;\nSELECT sum(n) AS total, 'a;b' AS s FROM read_dataset('lines');"
        ),
    )
    .expect("script");
    let script = script.to_str().expect("utf8");
    let run = udfchain(root.path(), &["run", script, "--format", "csv"]);
    assert_eq!(ok(&run), "total,s\n3,a;b\n");
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("saved dataset lines version 1 (2 rows)")
    );
    // `explain` explains the dataset's query (and saves nothing).
    let explain = ok(&udfchain(root.path(), &["explain", script]));
    assert!(
        explain.contains("PrefetchExec: prefetch=3") && explain.contains("MapExec: udf=line_count"),
        "{explain}"
    );
    let ls = ok(&udfchain(
        root.path(),
        &["datasets", "ls", "--format", "csv"],
    ));
    assert_eq!(ls.lines().count(), 2, "one version only: {ls}");
    // A quoted dataset name; one with a space is refused by the catalog.
    let quoted = udfchain(
        root.path(),
        &[
            "query",
            "CREATE DATASET \"q-1\" AS SELECT 1 AS n; SELECT n FROM read_dataset('q-1')",
            "--format",
            "csv",
        ],
    );
    assert_eq!(ok(&quoted), "n\n1\n");
    let err = fails(&udfchain(
        root.path(),
        &["query", "CREATE DATASET \"q 1\" AS SELECT 1 AS n"],
    ));
    assert!(
        err.starts_with("udfchain: line 1, column 1: invalid dataset name \"q 1\""),
        "{err}"
    );
}

#[test]
fn setting_and_syntax_errors_are_one_located_line() {
    let root = tempfile::tempdir().expect("root");
    let err = fails(&udfchain(
        root.path(),
        &["query", "SELECT 1", "--set", "prefetch=-1"],
    ));
    assert_eq!(
        err,
        "udfchain: prefetch must be a whole number from 0 to 65536 or \"auto\", got \"-1\""
    );
    let script = root.path().join("bad.sql");
    std::fs::write(
        &script,
        "SET parallel = 2;\n  SET batch_size = 0;\nSELECT 1;",
    )
    .expect("write");
    let err = fails(&udfchain(
        root.path(),
        &["run", script.to_str().expect("utf8")],
    ));
    assert_eq!(
        err,
        "udfchain: line 2, column 3: batch_size must be a whole number from 1 to 16777216, got \"0\""
    );
    // One statement: the `;` is in the string.
    let err = fails(&udfchain(root.path(), &["query", "SET x = 'a;b'"]));
    assert!(
        err.starts_with("udfchain: line 1, column 1: x is not a setting;"),
        "{err}"
    );
    let err = fails(&udfchain(
        root.path(),
        &["cache", "prune", "--to", "20000000000g"],
    ));
    assert_eq!(
        err,
        "udfchain: --to must be a size in bytes (e.g. 1048576, 512k, 64m, 2g), got \"20000000000g\""
    );
    let missing = root.path().join("missing.sql");
    let err = fails(&udfchain(
        root.path(),
        &["run", missing.to_str().expect("utf8")],
    ));
    assert!(
        err.starts_with(&format!("udfchain: I/O error at {}: ", missing.display())),
        "{err}"
    );
    let err = fails(&udfchain(root.path(), &["query", "SELECT 1;\nSELECT 'abc"]));
    assert_eq!(
        err,
        "udfchain: line 2, column 8: syntax error: unterminated string literal"
    );
}

/// `udfchain ls DIR | head`: a reader that closes the pipe ends the command
/// quietly (exit 0, no panic), in every text format.
#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    // Enough rows that the output exceeds a pipe's buffer (64 KiB).
    for i in 0..3000 {
        std::fs::write(
            data.path()
                .join(format!("file-with-a-long-name-{i:05}.txt")),
            "x",
        )
        .expect("write");
    }
    let dir = data.path().to_str().expect("utf8 path");
    for format in ["table", "csv", "json"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_udfchain"))
            .arg("--root")
            .arg(root.path())
            .args(["ls", dir, "--format", format])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        // Read one line, then close the read end, as `head -1` does.
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).expect("first line");
        drop(stdout);
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked"),
            "{format}: exit {:?}, stderr: {stderr}",
            out.status.code()
        );
    }
}
