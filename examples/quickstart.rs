//! Quickstart: generates a small local dataset of text files, then runs a chain
//! over it: filter, map (a struct per file), gen (one row per line), agg (per
//! directory). Checks its own output and exits non-zero if anything is off.
//!
//! Run: `cargo run --example quickstart [DIR]` (default dir: `target/quickstart-data`).

use std::path::PathBuf;

use futures::stream;
use serde::{Deserialize, Serialize};
use udfchain::{File, Session, Settings, col, lit};

#[derive(Debug, Serialize, Deserialize)]
struct Stats {
    bytes: u64,
    lines: u64,
    words: u64,
}

/// A map UDF: reads the file and counts lines and words.
async fn stats(file: File) -> Result<Stats, udfchain::udfs::UdfError> {
    let text = file.read_text().await?;
    Ok(Stats {
        bytes: text.len() as u64,
        lines: text.lines().count() as u64,
        words: text.split_whitespace().count() as u64,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/quickstart-data"));
    generate(&dir)?;
    let uri = dir.display().to_string();
    let session = Session::with_settings(Settings::new().parallel(4));

    println!("== map: one struct per file (non-empty .txt files)");
    let per_file = session
        .from_storage(&uri)
        .glob("**/*.txt")
        .filter(col("file.size").gt(lit(0u64)))
        .map("stats", stats)
        .select([col("file.path").alias("path"), col("stats")])
        .order_by([col("path").sort(true, false)]);
    per_file.show(5).await?;
    let n_files = per_file.count().await?;

    println!("== gen: one row per line, then agg: lines per directory");
    #[derive(Debug, Deserialize)]
    struct PerDir {
        dir: String,
        summary: String,
    }
    let per_dir: Vec<PerDir> = session
        .from_storage(&uri)
        .glob("**/*.txt")
        .r#gen("line", |f: File| {
            stream::once(async move { f.read_text().await })
                .map(|text| {
                    let lines: Vec<_> = match text {
                        Ok(t) => t.lines().map(|l| Ok(l.to_string())).collect(),
                        Err(e) => vec![Err(e)],
                    };
                    stream::iter(lines)
                })
                .flatten()
        })
        .mutate(
            "dir",
            datafusion::functions::expr_fn::split_part(col("file.path"), lit("/"), lit(1)),
        )
        .agg(
            &["dir"],
            &["line"],
            "summary",
            |lines: Vec<String>| async move {
                let longest = lines.iter().map(|l| l.len()).max().unwrap_or(0);
                Ok::<_, std::io::Error>(vec![format!(
                    "{} lines, longest {longest} chars",
                    lines.len()
                )])
            },
        )
        .order_by([col("dir").sort(true, false)])
        .to_rows()
        .await?;
    for row in &per_dir {
        println!("{:<8} {}", row.dir, row.summary);
    }

    // The example checks itself: 30 files, 2 of them empty; 3 directories of 10
    // files with line counts 1..=10 each (minus the empty ones).
    if n_files != 28 {
        return Err(format!("expected 28 non-empty files, got {n_files}").into());
    }
    let want = ["a: 54 lines", "b: 55 lines", "c: 53 lines"];
    let got: Vec<String> = per_dir
        .iter()
        .map(|r| format!("{}: {}", r.dir, r.summary.split(',').next().unwrap_or("")))
        .collect();
    if got != want {
        return Err(format!("expected {want:?}, got {got:?}").into());
    }
    println!(
        "quickstart OK: {n_files} files, {} directories",
        per_dir.len()
    );
    Ok(())
}

use futures::StreamExt;

/// 30 text files in 3 directories; file i has (i % 10) + 1 lines, files 0 and 11 are empty.
fn generate(dir: &std::path::Path) -> std::io::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    for i in 0..30 {
        let sub = dir.join(["a", "b", "c"][i % 3]);
        std::fs::create_dir_all(&sub)?;
        let body = if i == 0 || i == 11 {
            String::new()
        } else {
            (0..(i % 10) + 1)
                .map(|l| format!("line {l} of file {i}: {}\n", "word ".repeat(l)))
                .collect()
        };
        std::fs::write(sub.join(format!("file{i:02}.txt")), body)?;
    }
    Ok(())
}
