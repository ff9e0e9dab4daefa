//! A cluster in one process, as three machines would run it: a scheduler, an
//! executor built with our own UDF (`word_count`), and a client that runs a
//! chain on them (`workers = 2`: two partitions, two task slots) and checks
//! the rows against a local run. In production the scheduler is `udfchain
//! cluster scheduler`, the executor this same builder in your own binary.
//!
//! ```sh
//! cargo run --example cluster
//! ```

use serde::Deserialize;
use udfchain::cluster::{Executor, Scheduler};
use udfchain::udfs::UdfError;
use udfchain::{File, Session, Settings, col};

/// Our UDF: the words in a file. Executors find it by its name, `word_count`.
async fn word_count(f: File) -> Result<u64, UdfError> {
    let bytes = f.read().await?;
    Ok(String::from_utf8_lossy(&bytes).split_whitespace().count() as u64)
}

#[derive(Debug, PartialEq, Deserialize)]
struct Row {
    path: String,
    words: u64,
}

#[tokio::main]
async fn main() -> udfchain::Result<()> {
    let dir = tempfile::tempdir().map_err(|e| udfchain::Error::Io {
        path: "temp dir".into(),
        source: std::sync::Arc::new(e),
    })?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).map_err(|e| udfchain::Error::Io {
        path: data.display().to_string(),
        source: std::sync::Arc::new(e),
    })?;
    for i in 0..8 {
        let text = (0..=i)
            .map(|w| format!("w{w}"))
            .collect::<Vec<_>>()
            .join(" ");
        let path = data.join(format!("doc{i}.txt"));
        std::fs::write(&path, text).map_err(|e| udfchain::Error::Io {
            path: path.display().to_string(),
            source: std::sync::Arc::new(e),
        })?;
    }

    // The scheduler and an executor with our UDF (two task slots).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| udfchain::Error::Io {
            path: "127.0.0.1".into(),
            source: std::sync::Arc::new(e),
        })?;
    let addr = format!("127.0.0.1:{port}");
    tokio::spawn(Scheduler::builder().bind(&addr).run());
    tokio::spawn(
        Executor::builder()
            .register_map("word_count", word_count)
            .scheduler(&addr)
            .slots(2)
            .work_dir(dir.path().join("executor"))
            .run(),
    );

    // The same chain, locally and on the cluster.
    let settings = Settings::new().workers(2).root(dir.path().join("client"));
    let run = |session: std::sync::Arc<Session>| {
        let uri = data.display().to_string();
        async move {
            let mut rows: Vec<Row> = session
                .from_storage(&uri)
                .map("words", word_count)
                .select([col("file.path").alias("path"), col("words")])
                .to_rows()
                .await?;
            rows.sort_by(|a, b| a.path.cmp(&b.path));
            Ok::<_, udfchain::Error>(rows)
        }
    };
    let remote = Session::remote(&format!("df://{addr}"), settings.clone()).await?;
    let on_cluster = run(remote).await?;
    let local = run(Session::with_settings(settings)).await?;

    assert_eq!(on_cluster, local, "the cluster gives the local rows");
    let words: Vec<u64> = on_cluster.iter().map(|r| r.words).collect();
    assert_eq!(words, (1..=8).collect::<Vec<u64>>());
    for r in &on_cluster {
        println!("{}\t{}", r.path, r.words);
    }
    println!("cluster rows = local rows ({} files)", on_cluster.len());
    Ok(())
}
