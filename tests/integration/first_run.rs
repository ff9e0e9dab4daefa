//! What a first run meets, through the real binary and the Rust API: the
//! `Chain::new()` entry the design names (settings before the source), a start
//! guide and examples in the help, and one-line errors that say what to do for
//! the usual first mistakes (no S3 credentials, a bucket that does not exist, a
//! mistyped relative path), against the S3 server on 127.0.0.1.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use udfchain::{Chain, File, Settings, col};

use udfchain_testkit::{ACCESS_KEY, S3Server, SECRET_KEY, stdout_ok, write_files};

/// The binary with no AWS environment, the metadata endpoint on loopback
/// (refused at once), run in `cwd`.
fn udfchain(cwd: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_udfchain"));
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") || k == "UDFCHAIN_ROOT" {
            cmd.env_remove(k);
        }
    }
    cmd.env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("run udfchain")
}

/// The one error line of a failed run (exit 1, one line on stderr).
fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("udfchain: ") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    eprintln!("{err}");
    err.trim_end().to_string()
}

fn endpoint_settings(s3: &S3Server) -> Vec<String> {
    [
        format!("storage.endpoint={}", s3.endpoint),
        "storage.region=us-east-1".to_string(),
        "storage.virtual_hosted_style_request=false".to_string(),
    ]
    .into_iter()
    .flat_map(|kv| ["--set".to_string(), kv])
    .collect()
}

#[tokio::test]
async fn chain_new_gives_the_rows_and_plan_of_from_storage() {
    let dir = tempfile::tempdir().expect("dir");
    write_files(dir.path(), 5, |i| 10 + i);
    let uri = dir.path().display().to_string();
    let len = |f: File| async move { f.read().await.map(|b| b.len() as u64) };

    let old = Chain::from_storage(&uri)
        .settings(Settings::new().prefetch(3))
        .map("len", len)
        .select([col("file.path").alias("path"), col("len")])
        .order_by([col("path").sort(true, false)]);
    let new = Chain::new()
        .settings(Settings::new().prefetch(3))
        .from_storage(&uri)
        .map("len", len)
        .select([col("file.path").alias("path"), col("len")])
        .order_by([col("path").sort(true, false)]);

    let (old_plan, new_plan) = (
        old.explain().await.expect("explain old"),
        new.explain().await.expect("explain new"),
    );
    assert_eq!(old_plan, new_plan);
    assert!(new_plan.contains("PrefetchExec: prefetch=3"), "{new_plan}");
    let rows = |b: Vec<udfchain::datafusion::arrow::array::RecordBatch>| {
        udfchain::datafusion::arrow::util::pretty::pretty_format_batches(&b)
            .expect("format")
            .to_string()
    };
    let (a, b) = (
        rows(old.collect().await.expect("old")),
        rows(new.collect().await.expect("new")),
    );
    assert_eq!(a, b);
    assert!(b.contains("| d1/f0004.bin | 14  |"), "{b}");
}

#[tokio::test]
async fn settings_before_the_source_apply_to_udfs_added_after() {
    let dir = tempfile::tempdir().expect("dir");
    write_files(dir.path(), 2, |_| 4);
    let uri = dir.path().display().to_string();
    let len = |f: File| async move { f.read().await.map(|b| b.len() as u64) };

    let off = Chain::new()
        .settings(Settings::new().prefetch(0))
        .from_storage(&uri)
        .map("len", len);
    let plan = off.explain().await.expect("explain");
    assert!(
        plan.contains("MapExec") && !plan.contains("PrefetchExec"),
        "{plan}"
    );
    assert_eq!(
        off.collect()
            .await
            .expect("rows")
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        2
    );

    // The default (prefetch on) for the same chain without settings.
    let on = Chain::new().from_storage(&uri).map("len", len);
    assert!(
        on.explain()
            .await
            .expect("explain")
            .contains("PrefetchExec")
    );

    // Values and a session given before the source.
    let session = udfchain::Session::with_settings(Settings::new().prefetch(0));
    let values = Chain::new()
        .in_session(session)
        .from_values(&[1u32, 2, 3])
        .collect()
        .await
        .expect("values");
    assert_eq!(values.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
}

#[test]
fn no_arguments_print_a_start_guide_and_exit_0() {
    let cwd = tempfile::tempdir().expect("cwd");
    let out = udfchain(cwd.path(), &[]);
    let guide = stdout_ok(&out);
    for want in [
        "udfchain run ",
        "udfchain query ",
        "udfchain datasets ls",
        "udfchain --help",
    ] {
        assert!(guide.contains(want), "{want} missing:\n{guide}");
    }
    // Where the root is: ./.udfchain of the current dir by default.
    let root = std::path::absolute(cwd.path().join(".udfchain")).expect("abs");
    assert!(
        guide.contains(&root.display().to_string()),
        "root {} missing:\n{guide}",
        root.display()
    );
    // --root is honoured.
    let mine = cwd.path().join("mine");
    let out = udfchain(cwd.path(), &["--root", mine.to_str().expect("utf8")]);
    assert!(stdout_ok(&out).contains(&mine.display().to_string()));
    // Nothing was created by printing a guide.
    assert!(!cwd.path().join(".udfchain").exists() && !mine.exists());
}

#[test]
fn help_of_every_command_shows_examples() {
    let cwd = tempfile::tempdir().expect("cwd");
    let top = stdout_ok(&udfchain(cwd.path(), &["--help"]));
    assert!(
        top.contains("Examples:") && top.contains("udfchain run job.sql"),
        "{top}"
    );
    for cmd in [
        &["run"][..],
        &["query"],
        &["explain"],
        &["ls"],
        &["du"],
        &["datasets"],
        &["datasets", "ls"],
        &["datasets", "info"],
        &["datasets", "rm"],
        &["export"],
        &["cache"],
        &["cache", "du"],
        &["cache", "prune"],
        &["cache", "clear"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let help = stdout_ok(&udfchain(cwd.path(), &args));
        // Every positional argument says what it is.
        let arguments = help
            .split("Arguments:\n")
            .nth(1)
            .map(|rest| rest.split("\n\n").next().unwrap_or_default())
            .unwrap_or_default();
        for line in arguments.lines() {
            let words = line.split_whitespace().count();
            assert!(words > 1, "{args:?}: argument without help: {line:?}");
        }
        let example = format!("udfchain {}", cmd.join(" "));
        assert!(
            help.contains("Examples:") && help.contains(&example),
            "{args:?}:\n{help}"
        );
    }
}

#[test]
fn missing_s3_credentials_say_which_settings_to_set() {
    let s3 = S3Server::start();
    write_files(&s3.bucket_dir(), 2, |_| 3);
    let cwd = tempfile::tempdir().expect("cwd");
    let mut args: Vec<String> = endpoint_settings(&s3);
    args.extend(["ls".to_string(), "s3://bucket/".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let start = Instant::now();
    let out = udfchain(cwd.path(), &args);
    eprintln!("no credentials: failed after {:?}", start.elapsed());
    let err = one_error_line(&out);
    for want in [
        "s3://bucket",
        "storage.access_key_id",
        "storage.secret_access_key",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ] {
        assert!(err.contains(want), "{want} missing: {err}");
    }
    // Not a raw credential-chain or retry error.
    assert!(
        !err.contains("169.254") && !err.contains("retries") && !err.contains("api/token"),
        "{err}"
    );
    // The same with credentials works (the message is about credentials only).
    let mut args: Vec<String> = endpoint_settings(&s3);
    args.extend([
        "--set".to_string(),
        format!("storage.access_key_id={ACCESS_KEY}"),
        "--set".to_string(),
        format!("storage.secret_access_key={SECRET_KEY}"),
        "ls".to_string(),
        "s3://bucket/".to_string(),
        "--format".to_string(),
        "csv".to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let listed = stdout_ok(&udfchain(cwd.path(), &args));
    assert_eq!(listed.lines().count(), 3, "{listed}");
}

#[test]
fn a_missing_bucket_says_it_does_not_exist_at_the_endpoint() {
    let s3 = S3Server::start();
    let cwd = tempfile::tempdir().expect("cwd");
    for cmd in [
        vec!["ls", "s3://no-such-bucket/imgs/"],
        vec![
            "query",
            "SELECT sha256(file) FROM read_storage('s3://no-such-bucket/imgs/')",
        ],
    ] {
        let mut args: Vec<String> = endpoint_settings(&s3);
        args.extend([
            "--set".to_string(),
            format!("storage.access_key_id={ACCESS_KEY}"),
            "--set".to_string(),
            format!("storage.secret_access_key={SECRET_KEY}"),
        ]);
        args.extend(cmd.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = one_error_line(&udfchain(cwd.path(), &args));
        let want = format!("bucket no-such-bucket does not exist at {}", s3.endpoint);
        assert!(err.contains(&want), "{want} missing: {err}");
        assert!(!err.contains(SECRET_KEY), "{err}");
    }
}

#[test]
fn a_missing_relative_path_names_the_current_dir_and_a_close_name() {
    let cwd = tempfile::tempdir().expect("cwd");
    std::fs::create_dir_all(cwd.path().join("images/train")).expect("mkdir");
    std::fs::write(cwd.path().join("images/train/a.jpg"), "x").expect("write");
    let here = std::path::absolute(cwd.path()).expect("abs");

    let err = one_error_line(&udfchain(cwd.path(), &["ls", "imgaes"]));
    assert!(
        err.contains(&format!("current directory {}", here.display()))
            && err.contains("did you mean \"images\""),
        "{err}"
    );
    // The first missing part is the one corrected, the rest kept.
    let err = one_error_line(&udfchain(cwd.path(), &["ls", "images/trian/"]));
    assert!(err.contains("did you mean \"images/train\""), "{err}");
    // Nothing close: no suggestion, still the directory.
    let err = one_error_line(&udfchain(
        cwd.path(),
        &["query", "SELECT * FROM read_storage('zzzzzzzzzz')"],
    ));
    assert!(
        err.contains(&here.display().to_string()) && !err.contains("did you mean"),
        "{err}"
    );
    // The correct path works.
    let ok = stdout_ok(&udfchain(cwd.path(), &["ls", "images", "--format", "csv"]));
    assert_eq!(ok, "path,size\ntrain/a.jpg,1\n");
}

/// Where an instance metadata endpoint answers (a machine in the cloud), its
/// credentials are still asked for: the fast "no credentials" error is only for
/// an endpoint that does not connect. Here the "metadata endpoint" is the S3
/// server itself, which refuses the token request.
#[test]
fn an_answering_metadata_endpoint_is_still_asked_for_credentials() {
    let s3 = S3Server::start();
    let cwd = tempfile::tempdir().expect("cwd");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_udfchain"));
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .env("AWS_METADATA_ENDPOINT", &s3.endpoint)
        .current_dir(cwd.path())
        .args(endpoint_settings(&s3))
        .args(["ls", "s3://bucket/"])
        .output()
        .expect("run udfchain");
    let err = one_error_line(&out);
    assert!(
        err.contains("latest/api/token") && !err.contains("no credentials"),
        "{err}"
    );
}

/// An access key id given without its secret (or the reverse) and a mistyped
/// storage option: which setting is missing, which one was meant.
#[test]
fn half_a_key_and_a_mistyped_option_say_what_to_set() {
    let cwd = tempfile::tempdir().expect("cwd");
    let err = one_error_line(&udfchain(
        cwd.path(),
        &[
            "--set",
            "storage.endpoint=http://127.0.0.1:1",
            "--set",
            "storage.access_key_id=AKIDEXAMPLE",
            "ls",
            "s3://bucket/",
        ],
    ));
    assert!(
        err.contains(
            "no storage.secret_access_key: set storage.secret_access_key or AWS_SECRET_ACCESS_KEY"
        ) && !err.contains("AKIDEXAMPLE"),
        "{err}"
    );
    let err = one_error_line(&udfchain(
        cwd.path(),
        &[
            "--set",
            "storage.endpont=http://127.0.0.1:1",
            "ls",
            "s3://bucket/",
        ],
    ));
    assert!(err.contains("did you mean endpoint?"), "{err}");
}

/// The same for the other things a first run names by a relative path: a
/// script to run, and the files of `read_parquet`/`read_csv`/`read_json`
/// (a glob is left to DataFusion).
#[test]
fn a_missing_script_or_file_names_the_current_dir_and_a_close_name() {
    let cwd = tempfile::tempdir().expect("cwd");
    std::fs::write(cwd.path().join("job.sql"), "SELECT 1 AS one;").expect("write");
    std::fs::write(cwd.path().join("data.csv"), "a,b\n1,2\n").expect("write");
    let here = std::path::absolute(cwd.path()).expect("abs");
    let dir = format!("current directory {}", here.display());

    let err = one_error_line(&udfchain(cwd.path(), &["run", "jb.sql"]));
    assert!(
        err.contains(&dir) && err.contains("did you mean \"job.sql\""),
        "{err}"
    );
    for f in [
        "read_csv('dat.csv')",
        "read_parquet('dat.csv')",
        "read_json('dat.csv')",
    ] {
        let err = one_error_line(&udfchain(
            cwd.path(),
            &["query", &format!("SELECT * FROM {f}")],
        ));
        assert!(
            err.contains(&dir) && err.contains("did you mean \"data.csv\""),
            "{err}"
        );
    }
    // The right names work; a glob that matches is not refused.
    let ok = stdout_ok(&udfchain(
        cwd.path(),
        &["run", "job.sql", "--format", "csv"],
    ));
    assert_eq!(ok, "one\n1\n");
    for f in ["data.csv", "*.csv"] {
        let q = format!("SELECT b FROM read_csv('{f}')");
        let ok = stdout_ok(&udfchain(cwd.path(), &["query", &q, "--format", "csv"]));
        assert_eq!(ok, "b\n2\n", "{f}");
    }
}

/// Credentials the server rejects (a wrong secret, an unknown key id): check
/// which settings, without echoing the secret.
#[test]
fn rejected_credentials_say_which_settings_to_check() {
    let s3 = S3Server::start();
    write_files(&s3.bucket_dir(), 1, |_| 3);
    let cwd = tempfile::tempdir().expect("cwd");
    for (id, secret) in [(ACCESS_KEY, "wrong-secret-123"), ("unknown-id", SECRET_KEY)] {
        let mut args: Vec<String> = endpoint_settings(&s3);
        args.extend([
            "--set".to_string(),
            format!("storage.access_key_id={id}"),
            "--set".to_string(),
            format!("storage.secret_access_key={secret}"),
            "ls".to_string(),
            "s3://bucket/".to_string(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = one_error_line(&udfchain(cwd.path(), &args));
        assert!(
            err.contains("rejected the credentials")
                && err.contains("storage.secret_access_key")
                && err.contains("AWS_SECRET_ACCESS_KEY")
                && !err.contains(secret),
            "{err}"
        );
    }
}
