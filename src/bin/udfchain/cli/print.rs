//! Everything the CLI writes to standard output: result tables in the chosen
//! `--format`, and lines. A write to a closed standard output is an
//! [`Error::Io`] (not a panic), so a reader that stops reading (`| head`)
//! ends the command quietly (see `main`). Tables are redacted: plans and
//! messages in them never echo a secret.

use std::fmt::Display;
use std::io::Write;
use std::sync::Arc;

use clap::ValueEnum;
use udfchain::Error;
use udfchain::datafusion::arrow::array::RecordBatch;
use udfchain::datafusion::arrow::util::pretty::pretty_format_batches;
use udfchain::testing::redact;

/// Output format of tables.
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
    Parquet,
}

fn stdout_err(e: std::io::Error) -> Error {
    Error::Io {
        path: "standard output".into(),
        source: Arc::new(e),
    }
}

/// One line on standard output.
pub fn line(text: impl Display) -> udfchain::Result<()> {
    writeln!(std::io::stdout(), "{text}").map_err(stdout_err)
}

/// Lines on standard output, then a flush.
pub fn lines(lines: &[String]) -> udfchain::Result<()> {
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}").map_err(stdout_err)?;
    }
    out.flush().map_err(stdout_err)
}

/// One line written and flushed at once, its error ignored (a progress line
/// from inside a running command, which a closed stdout must not stop).
pub fn line_now(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// Prints result tables in one format.
pub struct Printer {
    pub format: Format,
}

/// Standard output that keeps the error of a failed write.
struct Stdout {
    inner: std::io::StdoutLock<'static>,
    failed: Option<std::io::Error>,
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf).inspect_err(|e| {
            self.failed = Some(std::io::Error::new(e.kind(), e.to_string()));
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().inspect_err(|e| {
            self.failed = Some(std::io::Error::new(e.kind(), e.to_string()));
        })
    }
}

impl Printer {
    pub fn print(&self, batches: &[RecordBatch]) -> udfchain::Result<()> {
        use udfchain::datafusion;
        let io_err = stdout_err;
        let parquet_err = |e: datafusion::parquet::errors::ParquetError| {
            Error::from(datafusion::error::DataFusionError::from(e))
        };
        let mut stdout = Stdout {
            inner: std::io::stdout().lock(),
            failed: None,
        };
        // A writer's error says only "Csv error: ..."; the failed write's own
        // error (a broken pipe) is what `main` needs to see.
        let df_err =
            |e: datafusion::arrow::error::ArrowError, out: &mut Stdout| match out.failed.take() {
                Some(io) => io_err(io),
                None => Error::from(datafusion::error::DataFusionError::from(e)),
            };
        match self.format {
            Format::Table => {
                // Tables are for people: plans and messages in them never echo a secret.
                let text = pretty_format_batches(batches)
                    .map_err(|e| df_err(e, &mut stdout))?
                    .to_string();
                writeln!(stdout.inner, "{}", redact(&text)).map_err(io_err)?;
            }
            Format::Csv => {
                let mut w = datafusion::arrow::csv::Writer::new(&mut stdout);
                for b in batches {
                    if let Err(e) = w.write(b) {
                        drop(w);
                        return Err(df_err(e, &mut stdout));
                    }
                }
            }
            Format::Json => {
                let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut stdout);
                let mut result = Ok(());
                for b in batches {
                    result = w.write(b);
                    if result.is_err() {
                        break;
                    }
                }
                let result = result.and_then(|()| w.finish());
                drop(w);
                result.map_err(|e| df_err(e, &mut stdout))?;
            }
            Format::Parquet => {
                let Some(first) = batches.first() else {
                    return Ok(());
                };
                let mut buf = Vec::new();
                let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(
                    &mut buf,
                    first.schema(),
                    None,
                )
                .map_err(parquet_err)?;
                for b in batches {
                    w.write(b).map_err(parquet_err)?;
                }
                w.close().map_err(parquet_err)?;
                stdout.inner.write_all(&buf).map_err(io_err)?;
            }
        }
        Ok(())
    }
}
