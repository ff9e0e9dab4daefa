//! The `udfchain` command line. (Scripts, datasets and the cache commands come
//! with the scripting issue; today it lists and counts storage.)

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use udfchain::{Session, col};

#[derive(Parser)]
#[command(
    name = "udfchain",
    version,
    about = "Chains of user functions over files in object storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the objects under a URI (path, size).
    Ls {
        uri: String,
        /// Only the objects directly under the URI.
        #[arg(long)]
        non_recursive: bool,
        /// Keep paths matching this glob (relative to the URI).
        #[arg(long)]
        glob: Option<String>,
    },
    /// Count the objects and bytes under a URI.
    Du { uri: String },
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("udfchain: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> udfchain::Result<()> {
    let session = Session::new();
    match cli.command {
        Command::Ls {
            uri,
            non_recursive,
            glob,
        } => {
            let mut chain = session.from_storage(&uri);
            if non_recursive {
                chain = chain.non_recursive();
            }
            if let Some(g) = glob {
                chain = chain.glob(&g);
            }
            let chain = chain
                .select([
                    col("file.path").alias("path"),
                    col("file.size").alias("size"),
                ])
                .order_by([col("path").sort(true, false)]);
            println!("{}", chain.to_table_string(usize::MAX).await?);
        }
        Command::Du { uri } => {
            #[derive(serde::Deserialize)]
            struct Du {
                files: i64,
                bytes: Option<u64>,
            }
            use datafusion::functions_aggregate::expr_fn::{count, sum};
            let rows: Vec<Du> = session
                .from_storage(&uri)
                .group_by(
                    [],
                    [
                        count(col("file.size")).alias("files"),
                        sum(col("file.size")).alias("bytes"),
                    ],
                )
                .to_rows()
                .await?;
            let (files, bytes) = rows
                .first()
                .map(|r| (r.files, r.bytes.unwrap_or(0)))
                .unwrap_or((0, 0));
            println!("{files} files, {bytes} bytes");
        }
    }
    Ok(())
}
