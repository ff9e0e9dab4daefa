//! Credentials are never echoed: a secret given as a setting, in a script, as an
//! environment variable or inside a URL appears in no output of the CLI (stdout,
//! stderr, `--verbose` causes, EXPLAIN, messages, `datasets info`) nor in the Rust
//! API's `Debug`, EXPLAIN and error texts. Failing and succeeding runs alike, against
//! the real S3 server on 127.0.0.1.

use std::path::Path;
use std::process::{Command, Output};

use udfchain::{Chain, File};

use udfchain_testkit::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};

/// Runs the CLI with no AWS environment but `env`, and the metadata endpoint on loopback.
fn udfchain(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_udfchain"));
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
        .envs(env.iter().copied())
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .expect("run udfchain")
}

/// Asserts that neither stream of `out` holds `secret`; returns both for further checks.
fn assert_not_echoed(out: &Output, secret: &str, what: &str) -> String {
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains(secret), "{what} echoed the secret:\n{text}");
    text
}

fn server_with_files() -> S3Server {
    let s3 = S3Server::start();
    let dir = s3.bucket_dir().join("t");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("a.txt"), "1\n2\n").expect("write");
    std::fs::write(dir.join("b.txt"), "3\n").expect("write");
    s3
}

fn endpoint_args(s3: &S3Server) -> Vec<String> {
    [
        format!("storage.endpoint={}", s3.endpoint),
        "storage.allow_http=true".into(),
        "storage.region=us-east-1".into(),
        "storage.virtual_hosted_style_request=false".into(),
    ]
    .into_iter()
    .flat_map(|kv| ["--set".to_string(), kv])
    .collect()
}

const QUERY: &str =
    "SELECT file.path AS path, sha256(file) AS h FROM read_storage('s3://bucket/t') ORDER BY path";

#[test]
fn a_wrong_secret_given_as_a_setting_is_not_echoed_by_any_failure() {
    let root = tempfile::tempdir().expect("root");
    let s3 = server_with_files();
    let secret = "Wrong-Secret-As-Setting-7f3a";
    let mut args: Vec<String> = endpoint_args(&s3);
    args.extend(
        [
            "--set",
            &format!("storage.access_key_id={ACCESS_KEY}"),
            "--set",
            &format!("storage.secret_access_key={secret}"),
        ]
        .map(String::from),
    );
    for extra in [vec!["query", QUERY], vec!["--verbose", "query", QUERY]] {
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        a.extend(extra.iter().copied());
        let out = udfchain(root.path(), &a, &[]);
        assert!(!out.status.success(), "a wrong secret must fail the query");
        let text = assert_not_echoed(&out, secret, "a failing query");
        assert!(text.contains("udfchain:"), "the error is printed: {text}");
    }
}

#[test]
fn a_secret_set_in_a_script_is_masked_in_messages_plans_and_saved_datasets() {
    let root = tempfile::tempdir().expect("root");
    let s3 = server_with_files();
    let script_dir = tempfile::tempdir().expect("script dir");
    let script = script_dir.path().join("s.sql");
    std::fs::write(
        &script,
        format!(
            "SET storage.endpoint = '{endpoint}';
             SET storage.allow_http = true;
             SET storage.region = 'us-east-1';
             SET storage.virtual_hosted_style_request = false;
             SET storage.access_key_id = '{ACCESS_KEY}';
             SET storage.secret_access_key = '{SECRET_KEY}';
             EXPLAIN {QUERY};
             EXPLAIN ANALYZE {QUERY};
             CREATE DATASET hashes AS {QUERY};
             {QUERY};",
            endpoint = s3.endpoint
        ),
    )
    .expect("script");
    let path = script.to_str().expect("utf8");
    for args in [
        vec!["run", path],
        vec!["--verbose", "run", path],
        vec!["explain", path],
        vec!["--format", "json", "run", path],
    ] {
        let out = udfchain(root.path(), &args, &[]);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = assert_not_echoed(&out, SECRET_KEY, &format!("{args:?}"));
        assert!(
            text.contains("set storage.secret_access_key = ***"),
            "SET says what it set, masked: {text}"
        );
    }
    for args in [vec!["datasets", "info", "hashes"], vec!["datasets", "ls"]] {
        let out = udfchain(root.path(), &args, &[]);
        assert!(out.status.success());
        assert_not_echoed(&out, SECRET_KEY, &format!("{args:?}"));
    }
    // Nor is it written to disk with the dataset's record.
    let catalog = std::fs::read(root.path().join("catalog.sqlite")).expect("catalog");
    assert!(
        !String::from_utf8_lossy(&catalog).contains(SECRET_KEY),
        "the catalog stores the secret"
    );
}

#[test]
fn a_secret_from_the_environment_is_not_echoed() {
    let root = tempfile::tempdir().expect("root");
    let s3 = server_with_files();
    let args_owned = endpoint_args(&s3);
    let mut args: Vec<&str> = args_owned.iter().map(String::as_str).collect();
    args.extend(["--verbose", "query", QUERY]);
    // Wrong: the query fails, and the failure does not say the secret.
    let wrong = "Wrong-Secret-From-Env-91bd";
    let out = udfchain(
        root.path(),
        &args,
        &[
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", wrong),
        ],
    );
    assert!(!out.status.success());
    assert_not_echoed(&out, wrong, "a failing query with env credentials");
    // Right: the query runs, and neither its table nor EXPLAIN says it.
    let mut explain = args.clone();
    let q = format!("EXPLAIN {QUERY}");
    *explain.last_mut().expect("query") = &q;
    for a in [&args, &explain] {
        let out = udfchain(
            root.path(),
            a,
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = assert_not_echoed(&out, SECRET_KEY, "a query with env credentials");
        assert!(text.contains("a.txt") || text.contains("Udf"), "{text}");
    }
}

#[test]
fn a_password_inside_a_uri_is_masked_in_errors() {
    let root = tempfile::tempdir().expect("root");
    let password = "Url-Password-c0ffee";
    for args in [
        vec!["ls".to_string(), format!("ftp://user:{password}@host/x")],
        vec![
            "query".to_string(),
            format!("SELECT * FROM read_storage('gopher://user:{password}@host/x')"),
        ],
    ] {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = udfchain(root.path(), &a, &[]);
        assert!(!out.status.success(), "an unsupported scheme fails");
        let text = assert_not_echoed(&out, password, "an invalid URI");
        assert!(text.contains("user:***@host"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_api_does_not_echo_a_secret_setting() {
    let s3 = server_with_files();
    let secret = "Rust-Api-Secret-5e11";
    let settings = s3
        .settings()
        .storage_option("secret_access_key", secret)
        .prefetch(2);
    assert!(!format!("{settings:?}").contains(secret), "{settings:?}");
    let chain = Chain::from_storage(&format!("s3://{BUCKET}/t"))
        .settings(settings)
        .map("n", |f: File| async move {
            f.read().await.map(|b| b.len() as u64)
        });
    let err = chain.collect().await.expect_err("wrong secret");
    let mut text = format!("{err} {err:?}");
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        text.push_str(&format!(" {s} {s:?}"));
        source = s.source();
    }
    assert!(!text.contains(secret), "{text}");
    let explained = Chain::from_storage(&format!("s3://{BUCKET}/t"))
        .settings(s3.settings().storage_option("secret_access_key", secret))
        .map("n", |f: File| async move {
            f.read().await.map(|b| b.len() as u64)
        })
        .explain()
        .await
        .expect("explain plans without reading");
    assert!(explained.contains("Udf"), "{explained}");
    assert!(!explained.contains(secret), "{explained}");
}

/// A presigned URL's credentials in a file's path (`X-Amz-Credential`,
/// `X-Amz-Signature`) are masked: neither the Rust API's error text and skip
/// lists (a missing file, read by the UDF or by the prefetch) nor the CLI's
/// error and catalog shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presigned_urls_credentials_reach_no_error_skip_list_or_catalog() {
    use udfchain::{OnError, Settings};
    const SIG: &str = "5ec2e75190a7b2e0f5ig";
    const CRED: &str = "AKIAPRESIGNEDEXAMPLE";
    let data = tempfile::tempdir().expect("data");
    let query = format!("X-Amz-Credential={CRED}%2F20260101&X-Amz-Signature={SIG}");
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Row {
        file: File,
    }
    let rows = [Row {
        file: File {
            source: data.path().display().to_string(),
            path: format!("shard.tar?{query}"),
            size: 10,
            ..File::default()
        },
    }];
    let hidden = |text: &str, what: &str| {
        assert!(
            !text.contains(SIG) && !text.contains(CRED),
            "{what}: {text}"
        );
        assert!(text.contains("X-Amz-Signature=***"), "{what}: {text}");
    };
    for prefetch in [0, 2] {
        let chain = |policy| {
            Chain::from_values(&rows)
                .settings(Settings::new().prefetch(prefetch).on_error(policy))
                .map("n", |f: File| async move {
                    f.read().await.map(|b| b.len() as u64)
                })
        };
        let err = chain(OnError::Fail).collect().await.expect_err("missing");
        hidden(&err.to_string(), &format!("prefetch {prefetch}: the error"));
        let (_, report) = chain(OnError::Skip)
            .collect_with_report()
            .await
            .expect("skipped");
        assert_eq!(report.skipped.len(), 1, "prefetch {prefetch}");
        hidden(
            &report.skipped[0],
            &format!("prefetch {prefetch}: the skip list"),
        );
    }

    // The CLI: a failing query, and a dataset saved from a query naming the URL.
    let root = tempfile::tempdir().expect("root");
    let url = format!("https://b.s3.amazonaws.com/k/shard.tar?{query}");
    let bad = format!(
        "SELECT * FROM read_storage('{}/none?{query}')",
        data.path().display()
    );
    let out = udfchain(root.path(), &["query", &bad], &[]);
    assert!(!out.status.success());
    assert_not_echoed(&out, SIG, "a failing query");
    let save = format!("CREATE DATASET presigned AS SELECT '{url}' AS u");
    let out = udfchain(root.path(), &["query", &save], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = udfchain(root.path(), &["datasets", "info", "presigned"], &[]);
    assert!(out.status.success());
    assert_not_echoed(&out, SIG, "datasets info");
    let catalog = std::fs::read(root.path().join("catalog.sqlite")).expect("catalog");
    let catalog = String::from_utf8_lossy(&catalog);
    assert!(
        !catalog.contains(SIG) && !catalog.contains(CRED),
        "the catalog stores the signature"
    );
}
