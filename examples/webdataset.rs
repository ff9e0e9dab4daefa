//! WebDataset expansion: writes two tar shards of samples (`<key>.txt` caption +
//! `<key>.cls` label), lists them, expands each shard into samples with the
//! built-in `webdataset_samples` generator (each shard is downloaded once, not
//! once per member), reads every sample's members, and counts labels. Checks
//! its own output.
//!
//! Run: `cargo run --example webdataset [DIR]` (default `target/webdataset-data`).

use std::path::PathBuf;

use serde::Deserialize;
use udfchain::udfs::builtins::{Sample, webdataset_samples};
use udfchain::{Session, Settings, col};

/// Reads a sample's label and caption.
async fn describe(sample: Sample) -> Result<(String, String), udfchain::udfs::UdfError> {
    let (mut label, mut caption) = (String::new(), String::new());
    for (m, name) in sample.members.iter().zip(&sample.names) {
        let text = m.read_text().await?;
        if name.ends_with(".cls") {
            label = text;
        } else if name.ends_with(".txt") {
            caption = text;
        }
    }
    Ok((label, caption))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/webdataset-data"));
    write_shards(&dir)?;
    let session = Session::with_settings(Settings::new().prefetch(2).root(dir.join(".udfchain")));

    #[derive(Debug, Deserialize)]
    struct Row {
        label: String,
        n: i64,
    }
    use datafusion::functions_aggregate::expr_fn::count;
    let rows: Vec<Row> = session
        .from_storage(&dir.join("shards").display().to_string())
        .glob("*.tar")
        .r#gen("sample", webdataset_samples)
        .map_on(&["sample"], "described", describe)
        .select([
            col("described.0").alias("label"),
            col("described.1").alias("caption"),
        ])
        .group_by([col("label")], [count(col("caption")).alias("n")])
        .order_by([col("label").sort(true, false)])
        .to_rows()
        .await?;
    for r in &rows {
        println!("{:<6} {}", r.label, r.n);
    }
    let got: Vec<(String, i64)> = rows.into_iter().map(|r| (r.label, r.n)).collect();
    let want = vec![("cat".to_string(), 10), ("dog".to_string(), 10)];
    if got != want {
        return Err(format!("expected {want:?}, got {got:?}").into());
    }
    println!("webdataset OK: 2 shards, 20 samples");
    Ok(())
}

/// Two shards of ten samples each; samples alternate cat / dog.
fn write_shards(dir: &std::path::Path) -> std::io::Result<()> {
    let shards = dir.join("shards");
    std::fs::create_dir_all(&shards)?;
    for s in 0..2 {
        let mut b = tar::Builder::new(std::fs::File::create(
            shards.join(format!("shard-{s}.tar")),
        )?);
        for i in 0..10 {
            let key = format!("{:06}", s * 10 + i);
            let label = if i % 2 == 0 { "cat" } else { "dog" };
            for (ext, body) in [
                ("txt", format!("a photo of a {label}")),
                ("cls", label.to_string()),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(body.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, format!("{key}.{ext}"), body.as_bytes())?;
            }
        }
        b.finish()?;
    }
    Ok(())
}
