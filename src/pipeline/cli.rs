//! `udfchain pipeline ...`: run a pipeline from its YAML config (replay or
//! live), list pipelines, show one, print a trigger's keys.
//!
//! Guarantees: `run` prints exactly one JSON line per trigger it finishes, on
//! standard output, as soon as it is recorded (`{"trigger_id", "at",
//! "num_keys", "num_partitions", "partition_sizes", "dataset"}`); the training
//! command's own output goes to standard error. Ctrl-C stops a run at its next
//! consistent point (a running hook is waited for). `keys` prints
//! `key,path,index,timestamp,label,weight` rows in the set's (shuffled) order.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::pipeline::config::{PipelineConfig, parse_duration};
use crate::pipeline::selector::build_strategy;
use crate::pipeline::state::{self, TriggerRecord};
use crate::pipeline::supervisor::{StopHandle, set_rows};
use crate::pipeline::{Pipeline, config::Format};
use crate::session::Session;

/// Examples at the end of `udfchain pipeline --help`.
pub const EXAMPLES: &str = "\
Examples:
  udfchain pipeline run demo.yaml                      replay everything storage holds
  udfchain pipeline run demo.yaml --replay-from 2024-01-01T00:00:00Z --replay-to 1706745600
  udfchain pipeline run demo.yaml --live --poll-interval 30s
  udfchain pipeline ls
  udfchain pipeline show demo
  udfchain pipeline keys demo 0 --partition 1";

#[derive(clap::Subcommand)]
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
                parse_duration(&p).map_err(|reason| Error::Setting {
                    name: "--poll-interval".into(),
                    value: p.clone(),
                    reason,
                })?;
                pipeline.config.data.poll_interval = Some(p);
            }
            if let Some(a) = flight_addr {
                pipeline = pipeline.flight_addr(a);
            }
            if let Some(n) = max_triggers {
                pipeline = pipeline.max_triggers(n);
            }
            let pipeline = pipeline.on_completed(|t| {
                let line = serde_json::to_string(t).unwrap_or_default();
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
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
            let mut out = Vec::new();
            for name in state::pipeline_names(&root)? {
                let path = state::pipeline_dir(&root, &name).join(state::DB_FILE);
                let (db, sql) = state::open(&name, &path)?;
                let triggers = state::triggers(&db, &sql, None)?;
                let finished = triggers.iter().filter(|t| t.status != "pending").count();
                let samples = state::get_i64(&db, &sql, "next_key", 0)?;
                out.push(format!(
                    "{name}\ttriggers={finished}\tpending={}\tsamples={samples}",
                    triggers.len() - finished
                ));
            }
            print_lines(&out)
        }
        PipelineCommand::Show { name } => {
            let (db, sql, yaml, _) = open_existing(&root, &name)?;
            let mut out = vec!["config:".to_string()];
            out.extend(yaml.lines().map(|l| format!("  {l}")));
            out.push("triggers:".into());
            for t in state::triggers(&db, &sql, None)? {
                out.push(format!("  {}", shown(&t)));
            }
            print_lines(&out)
        }
        PipelineCommand::Keys {
            name,
            trigger,
            partition,
        } => {
            let (db, sql, _, config) = open_existing(&root, &name)?;
            let t = state::triggers(&db, &sql, None)?
                .into_iter()
                .find(|t| t.trigger_id == trigger)
                .ok_or_else(|| Error::Pipeline {
                    pipeline: name.clone(),
                    reason: format!("no trigger {trigger}"),
                    source: None,
                })?;
            if let Some(p) = partition
                && p >= t.num_partitions
            {
                return Err(Error::Pipeline {
                    pipeline: name.clone(),
                    reason: format!(
                        "trigger {trigger} has {} partition(s), no partition {p}",
                        t.num_partitions
                    ),
                    source: None,
                });
            }
            let mut strategy = build_strategy(&config.selection, None)?;
            strategy.open(&db)?;
            let with_file = matches!(config.data.format, Format::SingleSample(_));
            let rows = set_rows(
                &db,
                &sql,
                strategy.as_ref(),
                trigger,
                t.num_partitions,
                with_file,
            )?;
            let mut out = Vec::new();
            if !json {
                out.push("key,path,index,timestamp,label,weight".to_string());
            }
            for r in rows
                .iter()
                .filter(|r| partition.is_none_or(|p| r.partition == p as u64))
            {
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
            print_lines(&out)
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

/// The state db, stored YAML and config of an existing pipeline.
fn open_existing(
    root: &std::path::Path,
    name: &str,
) -> Result<(rusqlite::Connection, state::SqlErr, String, PipelineConfig)> {
    let path = state::pipeline_dir(root, name).join(state::DB_FILE);
    if !path.is_file() {
        let known = state::pipeline_names(root)?;
        let hint = crate::util::closest(name, known.iter().map(String::as_str))
            .map(|c| format!(" (did you mean {c}?)"))
            .unwrap_or_default();
        return Err(Error::Pipeline {
            pipeline: name.to_string(),
            reason: format!("no such pipeline under {}{hint}", root.display()),
            source: None,
        });
    }
    let (db, sql) = state::open(name, &path)?;
    let yaml = state::get_text(&db, &sql, "config")?.ok_or_else(|| Error::Pipeline {
        pipeline: name.to_string(),
        reason: "its state holds no config (it never ran)".into(),
        source: None,
    })?;
    let config = PipelineConfig::from_yaml(&yaml, "the stored config")?;
    Ok((db, sql, yaml, config))
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn print_lines(lines: &[String]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}").map_err(|e| Error::io("standard output", e))?;
    }
    out.flush().map_err(|e| Error::io("standard output", e))
}

/// Seconds since the epoch, or an RFC 3339 time.
pub fn parse_time(text: &str) -> Result<i64> {
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
