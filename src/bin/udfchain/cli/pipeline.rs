//! `udfchain pipeline ...`: run a pipeline from its YAML config (replay or
//! live), list pipelines, show one, print a trigger's keys.
//!
//! Guarantees: `run` prints exactly one JSON line per trigger it finishes, on
//! standard output, as soon as it is recorded (`{"trigger_id", "at",
//! "num_keys", "num_partitions", "partition_sizes", "dataset"}`); the training
//! command's own output goes to standard error. Ctrl-C stops a run at its next
//! consistent point (a running hook is waited for). `keys` prints
//! `key,path,index,timestamp,label,weight` rows in the set's (shuffled) order.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Subcommand;
use udfchain::pipeline::inspect;
use udfchain::pipeline::parse_duration;
use udfchain::pipeline::{Pipeline, StopHandle, TriggerRecord};
use udfchain::{Error, Result, Session};

use crate::cli::print;

/// Examples at the end of `udfchain pipeline --help`.
pub const EXAMPLES: &str = "\
Examples:
  udfchain pipeline run demo.yaml                      replay everything storage holds
  udfchain pipeline run demo.yaml --replay-from 2024-01-01T00:00:00Z --replay-to 1706745600
  udfchain pipeline run demo.yaml --live --poll-interval 30s
  udfchain pipeline ls
  udfchain pipeline show demo
  udfchain pipeline keys demo 0 --partition 1";

#[derive(Subcommand)]
pub enum PipelineCommand {
    /// Run a pipeline: replay the data in storage, or watch it (--live).
    Run {
        /// The pipeline's YAML config.
        config: PathBuf,
        /// Only samples with timestamps >= T (seconds since the epoch or RFC 3339).
        #[arg(long, value_name = "T")]
        replay_from: Option<String>,
        /// Only samples with timestamps <= T (seconds since the epoch or RFC 3339).
        #[arg(long, value_name = "T")]
        replay_to: Option<String>,
        /// Stop after N triggers.
        #[arg(long, value_name = "N")]
        max_triggers: Option<u64>,
        /// Watch storage for new files until Ctrl-C.
        #[arg(long)]
        live: bool,
        /// How often --live lists storage (e.g. 500ms, 10s, 1m; default: the config's, else 10s).
        #[arg(long, value_name = "DURATION")]
        poll_interval: Option<String>,
        /// A Flight server address given to the training command as UDFCHAIN_FLIGHT_ADDR.
        #[arg(long, value_name = "HOST:PORT")]
        flight_addr: Option<String>,
    },
    /// The pipelines under the root, with their trigger and sample counts.
    Ls,
    /// A pipeline's config and its triggers so far.
    Show {
        /// The pipeline's name.
        name: String,
    },
    /// The keys of one trigger's training set.
    Keys {
        /// The pipeline's name.
        name: String,
        /// The trigger id.
        trigger: u64,
        /// Only this partition (from 0).
        #[arg(long)]
        partition: Option<usize>,
    },
}

/// Runs one `pipeline` command; `json`: `keys` prints JSON lines instead of CSV.
pub async fn run(command: PipelineCommand, session: &Arc<Session>, json: bool) -> Result<()> {
    let root = session.settings().get_root();
    match command {
        PipelineCommand::Run {
            config,
            replay_from,
            replay_to,
            max_triggers,
            live,
            poll_interval,
            flight_addr,
        } => {
            let from = replay_from.as_deref().map(parse_time).transpose()?;
            let to = replay_to.as_deref().map(parse_time).transpose()?;
            let mut pipeline = Pipeline::from_file(&config)?.session(Arc::clone(session));
            if let Some(p) = poll_interval {
                let every = parse_duration(&p).map_err(|reason| Error::Setting {
                    name: "--poll-interval".into(),
                    value: p.clone(),
                    reason,
                })?;
                pipeline = pipeline.poll_interval(every);
            }
            if let Some(a) = flight_addr {
                pipeline = pipeline.flight_addr(a);
            }
            if let Some(n) = max_triggers {
                pipeline = pipeline.max_triggers(n);
            }
            let pipeline = pipeline.on_completed(|t| {
                print::line_now(&serde_json::to_string(t).unwrap_or_default());
            });
            let stop = StopHandle::new();
            let on_ctrl_c = {
                let stop = stop.clone();
                tokio::spawn(async move {
                    if tokio::signal::ctrl_c().await.is_ok() {
                        eprintln!("udfchain: stopping the pipeline at its next consistent point");
                        stop.stop();
                    }
                })
            };
            let result = if live {
                pipeline.run_live(stop).await
            } else {
                pipeline.replay_until(from, to, &stop).await
            };
            on_ctrl_c.abort();
            result.map(|_| ())
        }
        PipelineCommand::Ls => {
            let out: Vec<String> = inspect::pipelines(&root)?
                .into_iter()
                .map(|p| {
                    format!(
                        "{}\ttriggers={}\tpending={}\tsamples={}",
                        p.name, p.finished, p.pending, p.samples
                    )
                })
                .collect();
            print::lines(&out)
        }
        PipelineCommand::Show { name } => {
            let stored = inspect::stored(&root, &name)?;
            let mut out = vec!["config:".to_string()];
            out.extend(stored.yaml.lines().map(|l| format!("  {l}")));
            out.push("triggers:".into());
            for t in &stored.triggers {
                out.push(format!("  {}", shown(t)));
            }
            print::lines(&out)
        }
        PipelineCommand::Keys {
            name,
            trigger,
            partition,
        } => {
            let rows = inspect::trigger_keys(&root, &name, trigger, partition)?;
            let mut out = Vec::new();
            if !json {
                out.push("key,path,index,timestamp,label,weight".to_string());
            }
            for r in &rows {
                out.push(if json {
                    serde_json::json!({
                        "key": r.key, "path": r.path, "index": r.index,
                        "timestamp": r.timestamp, "label": r.label, "weight": r.weight,
                        "partition": r.partition,
                    })
                    .to_string()
                } else {
                    format!(
                        "{},{},{},{},{},{}",
                        r.key,
                        csv_field(&r.path),
                        r.index,
                        r.timestamp,
                        r.label,
                        r.weight
                    )
                });
            }
            print::lines(&out)
        }
    }
}

/// A recorded trigger as `show` prints it.
fn shown(t: &TriggerRecord) -> String {
    serde_json::json!({
        "trigger_id": t.trigger_id, "at": t.at, "num_keys": t.num_keys,
        "num_partitions": t.num_partitions, "partition_sizes": t.partition_sizes,
        "dataset": t.dataset, "status": t.status,
    })
    .to_string()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Seconds since the epoch, or an RFC 3339 time.
fn parse_time(text: &str) -> Result<i64> {
    if let Ok(s) = text.trim().parse::<i64>() {
        return Ok(s);
    }
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.timestamp())
        .map_err(|e| Error::Setting {
            name: "--replay-from/--replay-to".into(),
            value: text.to_string(),
            reason: format!(
                "takes seconds since the epoch or an RFC 3339 time (2024-01-31T00:00:00Z), got {text:?}: {e}"
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("1706659200").expect("secs"), 1_706_659_200);
        assert_eq!(
            parse_time("2024-01-31T00:00:00Z").expect("rfc"),
            1_706_659_200
        );
        assert_eq!(
            parse_time("2024-01-31T01:00:00+01:00").expect("offset"),
            1_706_659_200
        );
        assert!(parse_time("yesterday").is_err());
    }
}
