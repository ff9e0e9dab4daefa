//! `udfchain run`, `query` and `explain`: a script's statements one by one,
//! each result printed as it comes (messages on stderr, tables on stdout);
//! a plan's progress on stderr while it runs. An error names the statement
//! (its line) it came from. After `SET cluster = '...'` the statements run
//! on that cluster.

use std::sync::Arc;

use futures::StreamExt;
use udfchain::datafusion::arrow::array::RecordBatch;
use udfchain::datafusion::physical_plan::ExecutionPlan;
use udfchain::testing::{
    Execution, Kind, locate, redact, run_with_progress as progress_run, split,
};
use udfchain::{Error, Output, ScriptRunner, Session};

use crate::cli::print::Printer;

/// The text of a script file, or of standard input for `-`.
pub fn read_script(path: &str) -> udfchain::Result<String> {
    if path == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| Error::Io {
            path: "standard input".into(),
            source: Arc::new(e),
        })?;
        return Ok(s);
    }
    std::fs::read_to_string(path).map_err(|e| {
        // A mistyped script name: where it was looked for, and a close name.
        let e = match e.kind() {
            std::io::ErrorKind::NotFound => {
                std::io::Error::new(e.kind(), udfchain::testing::missing_path(path))
            }
            _ => e,
        };
        Error::Io {
            path: path.into(),
            source: Arc::new(e),
        }
    })
}

/// Runs every statement, printing tables and messages as they come.
pub async fn run_script(
    session: &Arc<Session>,
    script: &str,
    out: &Printer,
    explain: bool,
) -> udfchain::Result<()> {
    let mut runner = ScriptRunner::new(Arc::clone(session));
    for stmt in split(script)? {
        let cluster_set = matches!(&stmt.kind, Kind::Set { name, .. }
            if name.eq_ignore_ascii_case("cluster"));
        let result = async {
            // `explain`: queries (and the query of a `CREATE DATASET`) are
            // explained, not run or saved; `SET` still applies.
            let execution = if explain {
                runner.explain(&stmt).await?
            } else {
                runner.execute(&stmt).await?
            };
            match execution {
                Execution::Done(Output::Message(m)) => {
                    eprintln!("{}", redact(&m));
                    Ok(())
                }
                Execution::Done(Output::Table(b)) => out.print(&b),
                Execution::Plan { plan, ctx } => {
                    let on = runner.settings().get_progress();
                    let batches = run_with_progress(plan, ctx, on).await?;
                    out.print(&batches)
                }
            }
        }
        .await;
        result.map_err(|e| locate(e, &stmt))?;
        if cluster_set {
            // The statements after `SET cluster = '...'` run there.
            let session = Session::connect(runner.settings()).await;
            runner = ScriptRunner::new(session.map_err(|e| locate(e, &stmt))?);
        }
    }
    Ok(())
}

/// Executes a plan; when `on`, shows its progress (on a terminal) and then
/// the summary line on stderr.
async fn run_with_progress(
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<udfchain::datafusion::execution::TaskContext>,
    on: bool,
) -> udfchain::Result<Vec<RecordBatch>> {
    let run = async {
        let mut stream =
            udfchain::datafusion::physical_plan::execute_stream(Arc::clone(&plan), ctx)?;
        let mut batches = Vec::new();
        while let Some(batch) = stream.next().await {
            batches.push(batch?);
        }
        Ok::<_, Error>(batches)
    };
    let rows = |b: &Vec<RecordBatch>| b.iter().map(|b| b.num_rows()).sum();
    progress_run(&plan, run, on, |_| {}, rows).await
}
