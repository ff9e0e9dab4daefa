//! Errors: a failing or panicking UDF names the UDF and the file; bad URIs,
//! unknown columns and mismatched input types fail at planning, never panic.

use std::sync::Arc;

use udfchain::{Chain, Error, File, Session, Settings, col, lit};

use udfchain_testkit::write_files;

fn data() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_files(dir.path(), 9, |i| 10 + i);
    let uri = dir.path().display().to_string();
    (dir, uri)
}

async fn fails_on_f0004(f: File) -> Result<u64, std::io::Error> {
    if f.path.ends_with("f0004.bin") {
        return Err(std::io::Error::other("cannot decode"));
    }
    Ok(f.size)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_udf_error_names_udf_and_file() {
    let (_dir, uri) = data();
    let err = Session::new()
        .from_storage(&uri)
        .settings(Settings::new().parallel(2))
        .map("size2", fails_on_f0004)
        .collect()
        .await
        .expect_err("must fail");
    match &err {
        Error::Udf { udf, file, .. } => {
            assert_eq!(udf, "fails_on_f0004");
            let file = file.as_deref().expect("file named");
            assert!(
                file.starts_with("file:///") && file.ends_with("d1/f0004.bin"),
                "{file}"
            );
        }
        other => panic!("expected a UDF error, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("fails_on_f0004")
            && msg.contains("f0004.bin")
            && msg.contains("cannot decode"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_udf_fails_the_query_with_its_name() {
    let (_dir, uri) = data();
    let err = Session::new()
        .from_storage(&uri)
        .map("boom", |f: File| async move {
            if f.path.contains("f0002") {
                panic!("bad pixel");
            }
            Ok::<_, std::io::Error>(1u8)
        })
        .collect()
        .await
        .expect_err("must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("UDF boom")
            && msg.contains("panicked: bad pixel")
            && msg.contains("f0002.bin"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_generator_names_the_file() {
    let (_dir, uri) = data();
    let err = Session::new()
        .from_storage(&uri)
        .r#gen("x", |f: File| {
            let bad = f.path.contains("f0007");
            futures::stream::iter(vec![
                Ok(1u32),
                if bad {
                    Err(std::io::Error::other("truncated"))
                } else {
                    Ok(2)
                },
            ])
        })
        .collect()
        .await
        .expect_err("must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("f0007.bin") && msg.contains("truncated"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_skip_and_null() {
    let (_dir, uri) = data();
    let session = Session::new();
    let skipped = session
        .from_storage(&uri)
        .settings(Settings::new().on_error(udfchain::OnError::Skip))
        .map("s", fails_on_f0004)
        .count()
        .await
        .expect("skip");
    assert_eq!(skipped, 8);
    let nulls = session
        .from_storage(&uri)
        .settings(Settings::new().on_error(udfchain::OnError::Null))
        .map("s", fails_on_f0004)
        .filter(col("s").is_null())
        .count()
        .await
        .expect("null");
    assert_eq!(nulls, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planning_errors_are_clear() {
    let (_dir, uri) = data();
    let session = Session::new();

    let err = session
        .from_storage("/definitely/not/here")
        .count()
        .await
        .expect_err("bad path");
    assert!(matches!(err, Error::InvalidUri { .. }), "{err:?}");
    assert!(
        err.to_string().contains("no such file or directory"),
        "{err}"
    );

    let err = session
        .from_storage("ftp://host/x")
        .count()
        .await
        .expect_err("bad scheme");
    assert!(err.to_string().contains("unsupported scheme ftp"), "{err}");

    let err = session
        .from_storage(&uri)
        .map_on(&["nope"], "x", |f: File| async move {
            Ok::<_, std::io::Error>(f.size)
        })
        .count()
        .await
        .expect_err("unknown column");
    assert!(matches!(err, Error::Plan(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("reads column \"nope\", which does not exist"),
        "{err}"
    );

    let err = session
        .from_storage(&uri)
        .map(
            "n",
            |f: File| async move { Ok::<_, std::io::Error>(f.size) },
        )
        .map_on(&["n"], "x", |s: String| async move {
            Ok::<_, std::io::Error>(s)
        })
        .count()
        .await
        .expect_err("type mismatch");
    assert!(
        err.to_string().contains("do not match its declared input"),
        "{err}"
    );

    let err = session
        .from_storage(&uri)
        .map(
            "file",
            |f: File| async move { Ok::<_, std::io::Error>(f.size) },
        )
        .count()
        .await
        .expect_err("name clash");
    assert!(err.to_string().contains("already exists"), "{err}");

    let err = session
        .from_storage(&uri)
        .filter(col("nope").gt(lit(1)))
        .count()
        .await
        .expect_err("unknown filter column");
    assert!(matches!(err, Error::Plan(_)), "{err:?}");

    let err = Chain::from_values_in(Arc::clone(&session), &[1u8])
        .select([col("value")])
        .agg(&["missing"], &["value"], "x", |v: Vec<u8>| async move {
            Ok::<_, std::io::Error>(v)
        })
        .count()
        .await
        .expect_err("bad partition_by");
    assert!(
        err.to_string().contains("partition_by column \"missing\""),
        "{err}"
    );
}

/// An object deleted between listing and download (here by an earlier UDF, on
/// the real S3 server): `skip` drops exactly that file and lists it in the
/// report without retrying a 404; `fail` stops with an error naming its URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_deleted_after_listing_is_skipped_or_named() {
    let s3 = udfchain_testkit::S3Server::start();
    let bucket = s3.bucket_dir();
    write_files(&bucket, 6, |i| 100 + i);
    let chain = |policy: udfchain::OnError| {
        let bucket = bucket.clone();
        s3.session()
            .from_storage("s3://bucket")
            .settings(Settings::new().prefetch(0))
            .map("kept", move |f: File| {
                let bucket = bucket.clone();
                async move {
                    if f.path.ends_with("f0004.bin") {
                        std::fs::remove_file(bucket.join(&f.path))?;
                    }
                    Ok::<bool, std::io::Error>(true)
                }
            })
            .settings(Settings::new().prefetch(4).on_error(policy))
            .map("len", |f: File| async move {
                f.read().await.map(|b| b.len() as u64)
            })
    };

    let (batches, report) = chain(udfchain::OnError::Skip)
        .collect_with_report()
        .await
        .expect("skip");
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
    assert_eq!(report.skipped, vec!["s3://bucket/d1/f0004.bin".to_string()]);
    assert_eq!(
        report.metric("PrefetchExec", "retries"),
        0,
        "a missing object is not retried"
    );

    write_files(&bucket, 6, |i| 100 + i);
    let err = chain(udfchain::OnError::Fail)
        .count()
        .await
        .expect_err("fail");
    assert!(
        err.to_string().contains("s3://bucket/d1/f0004.bin"),
        "{err}"
    );
}
