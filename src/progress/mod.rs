//! Progress of a running physical plan, read from its operators' metrics on a
//! timer (never from output batches, so a sort, an aggregate or a Parquet
//! writer on top does not hide it).
//!
//! Guarantees: [`watch`] samples the plan right away, then every [`TICK`] while
//! the run's future is pending, and once more after it has finished (that last
//! [`Progress`] has `finished = true` and the final counts). Counts never go
//! down between samples (they are sums of monotone counters). A UDF's `total`
//! is only given when it is exact: the listing below it has ended and every
//! operator between them passes each row on (no filter, limit, generator or
//! `on_error = skip` drop so far); until the listing ends, `listed` gives the
//! rows listed so far. Sampling runs in the caller's task: no task
//! is spawned, dropping the future stops both run and timer.
//!
//! A cluster job whose scheduler has no executor registered shows "waiting
//! for an executor" on the first line (the `waiting_for_executor` gauge of
//! its `JobExec`) until one registers or the job gives up.
//!
//! [`Display`] draws a [`Progress`] on stderr (indicatif: one line of
//! listing/fetch counters, one line per UDF operator) only when stderr is a
//! terminal and the `CI` environment variable is unset; [`Progress::summary`]
//! is the one-line summary printed after a run that [`Progress::is_long`].

mod display;

pub use display::Display;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::physical_plan::ExecutionPlan;

use crate::plan::{PrefetchExec, as_udf_exec};

/// How often a running plan is sampled.
pub const TICK: Duration = Duration::from_millis(150);

/// What a run has done so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    /// Time since the run started.
    pub elapsed: Duration,
    /// Whether the plan reads a listing (`read_storage`, `Chain::from_storage`).
    pub has_listing: bool,
    /// Files produced by the listings so far (after the glob).
    pub files_listed: usize,
    /// Every listing has ended: `files_listed` is the total.
    pub listing_done: bool,
    /// UDF operators in chain order (the first applied first).
    pub udfs: Vec<UdfProgress>,
    /// Files downloaded by the prefetches.
    pub files_fetched: usize,
    /// Bytes downloaded by the prefetches.
    pub bytes_fetched: usize,
    /// Files the prefetches found in the shared cache.
    pub cache_hits: usize,
    /// Files the prefetches left where they are for the UDF to read (local
    /// and in-memory files under `prefetch = auto`), and their bytes.
    pub files_in_place: usize,
    /// The listed bytes of `files_in_place`.
    pub bytes_in_place: usize,
    /// Time left, estimated from the rate of the last UDF whose total is known.
    pub eta: Option<Duration>,
    /// The run has ended (the last sample of `watch`).
    pub finished: bool,
    /// A cluster job waits: its scheduler has no executor registered.
    pub waiting_for_executor: bool,
}

/// One UDF operator's progress.
#[derive(Debug, Clone, PartialEq)]
pub struct UdfProgress {
    /// The UDF's name, e.g. `sha256`.
    pub name: String,
    /// `map`, `gen`, `batch_map` or `agg`.
    pub kind: &'static str,
    /// Input rows done (map, batch_map: output plus dropped rows) or rows
    /// produced (gen, agg).
    pub rows: usize,
    /// Input rows in all, when exact (see the module header).
    pub total: Option<usize>,
    /// While the listing below still runs (and rows pass on as for `total`):
    /// the input rows listed so far, a lower bound of the total.
    pub listed: Option<usize>,
    /// `rows` per second since the start.
    pub rate: f64,
    /// Rows of earlier runs of this save its checkpoint holds (answered
    /// without a call; see `chain/save.rs`).
    pub kept: usize,
}

impl UdfProgress {
    /// `resuming: N of M rows already done` (`M+` while the listing runs,
    /// `?` without a listing below).
    pub fn resuming(&self) -> String {
        let of = match (self.total, self.listed) {
            (Some(t), _) => t.to_string(),
            (None, Some(l)) => format!("{l}+"),
            (None, None) => "?".into(),
        };
        format!("resuming: {} of {of} rows already done", self.kept)
    }
}

impl Progress {
    /// Reads the progress off a (running or finished) plan.
    pub fn sample(plan: &Arc<dyn ExecutionPlan>, elapsed: Duration) -> Self {
        let mut p = Progress {
            elapsed,
            listing_done: true,
            ..Default::default()
        };
        p.visit(plan);
        if !p.has_listing {
            p.listing_done = false;
        }
        // Walked top-down: chain order is the reverse.
        p.udfs.reverse();
        let secs = elapsed.as_secs_f64();
        for u in &mut p.udfs {
            u.rate = if secs > 0.0 {
                u.rows as f64 / secs
            } else {
                0.0
            };
        }
        p.eta = p
            .udfs
            .iter()
            .rev()
            .find_map(|u| u.total.map(|t| (t, u)))
            .and_then(|(total, u)| {
                let left = total.saturating_sub(u.rows);
                if left == 0 {
                    Some(Duration::ZERO)
                } else if u.rate > 0.0 {
                    Some(Duration::from_secs_f64(left as f64 / u.rate))
                } else {
                    None
                }
            });
        p
    }

    fn visit(&mut self, plan: &Arc<dyn ExecutionPlan>) {
        let m = metrics(plan.as_ref());
        let p = plan.as_ref();
        if p.name() == "JobExec" {
            self.waiting_for_executor |= m.get("waiting_for_executor") > 0;
        }
        if p.name() == "ListingExec" {
            self.has_listing = true;
            self.files_listed += m.get("files_listed");
            self.listing_done &= m.get("listing_done") > 0;
        } else if p.downcast_ref::<PrefetchExec>().is_some() {
            self.files_fetched += m.get("files_fetched");
            self.bytes_fetched += m.get("bytes_fetched");
            self.cache_hits += m.get("cache_hits");
            self.files_in_place += m.get("files_in_place");
            self.bytes_in_place += m.get("bytes_in_place");
        } else if let Some((name, kind, preserves)) = udf(p) {
            let rows = if preserves {
                m.get("output_rows") + m.get("skipped_rows")
            } else {
                m.get("output_rows")
            };
            let below = match (preserves, plan.children().first()) {
                (true, Some(child)) => input_rows(child),
                _ => None,
            };
            let (total, listed) = match below {
                Some((n, true)) => (Some(n), None),
                Some((n, false)) => (None, Some(n)),
                None => (None, None),
            };
            self.udfs.push(UdfProgress {
                name,
                kind,
                rows,
                total,
                listed,
                rate: 0.0,
                kept: m.get("checkpoint_rows"),
            });
        }
        for child in plan.children() {
            self.visit(child);
        }
    }

    /// Files a run worked on: those listed, or else those fetched or found in
    /// the cache.
    pub fn files(&self) -> usize {
        if self.has_listing {
            self.files_listed
        } else {
            self.files_fetched + self.cache_hits + self.files_in_place
        }
    }

    /// Whether a run deserves a summary line: it read a listing, ran a UDF or
    /// fetched files, or took a second or more (not `SELECT 1`, not a plain
    /// `EXPLAIN`).
    pub fn is_long(&self) -> bool {
        self.has_listing
            || !self.udfs.is_empty()
            || self.files_fetched + self.cache_hits + self.files_in_place > 0
            || self.elapsed >= Duration::from_secs(1)
    }

    /// The one-line summary after a run of `rows` result rows, e.g.
    /// `3000 rows, 3000 files, 2.9 MiB fetched in 1.4 s`.
    pub fn summary(&self, rows: usize) -> String {
        let mut s = plural(rows, "row");
        if self.has_listing || self.files() > 0 {
            s.push_str(&format!(", {}", plural(self.files(), "file")));
        }
        if self.files_fetched > 0 || self.bytes_fetched > 0 {
            s.push_str(&format!(", {} fetched", bytes(self.bytes_fetched)));
        }
        if self.files_in_place > 0 {
            s.push_str(&format!(", {} read in place", bytes(self.bytes_in_place)));
        }
        if self.cache_hits > 0 {
            s.push_str(&format!(", {} cache hits", self.cache_hits));
        }
        s.push_str(&format!(" in {}", duration(self.elapsed)));
        if let Some(u) = self.udfs.iter().find(|u| u.kept > 0) {
            s.push_str(&format!(", {} from a checkpoint", plural(u.kept, "row")));
        }
        s
    }

    /// The display's lines: listing and downloads, then one per UDF.
    pub fn lines(&self) -> Vec<String> {
        let mut first = duration(self.elapsed);
        if self.has_listing {
            first.push_str(&format!(
                "  listed {} files{}",
                self.files_listed,
                if self.listing_done { " (all)" } else { "..." }
            ));
        }
        if self.files_fetched + self.cache_hits > 0 {
            first.push_str(&format!(
                "  fetched {} files, {}, {} cache hits",
                self.files_fetched,
                bytes(self.bytes_fetched),
                self.cache_hits
            ));
        }
        if self.files_in_place > 0 {
            first.push_str(&format!(
                "  read {} files in place, {}",
                self.files_in_place,
                bytes(self.bytes_in_place)
            ));
        }
        if let Some(eta) = self.eta {
            first.push_str(&format!("  ETA {}", duration(eta)));
        }
        if self.waiting_for_executor {
            first.push_str("  waiting for an executor");
        }
        if let Some(u) = self.udfs.iter().find(|u| u.kept > 0) {
            first.push_str(&format!("  {}", u.resuming()));
        }
        let mut lines = vec![first];
        for u in &self.udfs {
            let mut line = format!("{} ({})  ", u.name, u.kind);
            match u.total {
                Some(total) => {
                    const WIDTH: usize = 24;
                    let filled = (u.rows.min(total) * WIDTH)
                        .checked_div(total)
                        .unwrap_or(WIDTH);
                    line.push_str(&format!(
                        "[{}{}] {}/{} rows",
                        "#".repeat(filled),
                        "-".repeat(WIDTH - filled),
                        u.rows,
                        total
                    ));
                }
                None => match u.listed {
                    Some(listed) => line.push_str(&format!("{}/{listed}+ rows", u.rows)),
                    None if u.kind == "map" || u.kind == "batch_map" => {
                        line.push_str(&format!("{} rows", u.rows));
                    }
                    None => line.push_str(&format!("{} rows out", u.rows)),
                },
            }
            line.push_str(&format!(", {:.0} rows/s", u.rate));
            lines.push(line);
        }
        lines
    }
}

/// Runs `run` while sampling `plan` (which `run` executes) every [`TICK`]:
/// `on_tick` gets a sample at once, on each tick, and a last one (with
/// `finished = true`) after `run` has ended, which is also returned.
///
/// # Cancel safety
/// Dropping the future drops `run` (cancelling it) and stops the timer.
pub async fn watch<T>(
    plan: &Arc<dyn ExecutionPlan>,
    run: impl Future<Output = T>,
    mut on_tick: impl FnMut(&Progress),
) -> (T, Progress) {
    let start = Instant::now();
    let mut run = std::pin::pin!(run);
    // The sample "at once" is taken before the run is first polled: a run
    // whose first poll does all of its work (fast local files, its tasks
    // outrunning the consumer) would otherwise give only the last sample.
    on_tick(&Progress::sample(plan, start.elapsed()));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            out = &mut run => {
                let mut last = Progress::sample(plan, start.elapsed());
                last.finished = true;
                on_tick(&last);
                return (out, last);
            }
            _ = ticks.tick() => on_tick(&Progress::sample(plan, start.elapsed())),
        }
    }
}

/// Runs `run` (which executes `plan`) under `watch`: a `Display` when
/// `show` (drawn only on a terminal outside CI) and `on_progress` on every
/// sample; after a successful run that [`Progress::is_long`], prints
/// [`Progress::summary`] of `rows(&output)` on stderr when `show`.
///
/// # Cancel safety
/// As `watch`; the display is cleared when the future is dropped.
pub async fn run<T, E>(
    plan: &Arc<dyn ExecutionPlan>,
    run: impl Future<Output = Result<T, E>>,
    show: bool,
    mut on_progress: impl FnMut(&Progress),
    rows: impl FnOnce(&T) -> usize,
) -> Result<T, E> {
    let mut display = Display::new(show);
    let (out, last) = watch(plan, run, |p| {
        display.update(p);
        on_progress(p);
    })
    .await;
    display.finish();
    let out = out?;
    if show && last.is_long() {
        eprintln!("{}", last.summary(rows(&out)));
    }
    Ok(out)
}

/// Name, kind and whether it passes on every input row (and so counts input
/// rows done), for a UDF operator.
fn udf(p: &dyn ExecutionPlan) -> Option<(String, &'static str, bool)> {
    let call = as_udf_exec(p)?.call();
    Some((
        call.name.clone(),
        call.kind,
        matches!(call.kind, "map" | "batch_map"),
    ))
}

/// The rows `plan` produces from a listing under operators that pass each row
/// on: the files listed so far and whether that is all of them.
fn input_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<(usize, bool)> {
    let p = plan.as_ref();
    if p.name() == "ListingExec" {
        let m = metrics(p);
        return Some((m.get("files_listed"), m.get("listing_done") > 0));
    }
    let passes_rows = match p.name() {
        "ProjectionExec"
        | "CoalesceBatchesExec"
        | "RepartitionExec"
        | "CoalescePartitionsExec"
        | "CooperativeExec" => true,
        // UDFs that keep every row while nothing has been dropped.
        _ if p.downcast_ref::<PrefetchExec>().is_some() => metrics(p).get("skipped_files") == 0,
        _ if udf(p).is_some_and(|(_, _, preserves)| preserves) => {
            metrics(p).get("skipped_rows") == 0
        }
        _ => false,
    };
    let children = plan.children();
    match (passes_rows, children.as_slice()) {
        (true, [child]) => input_rows(child),
        _ => None,
    }
}

/// An operator's metrics summed over partitions.
struct Metrics(Vec<(String, usize)>);

impl Metrics {
    fn get(&self, name: &str) -> usize {
        self.0
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v)
            .sum()
    }
}

fn metrics(p: &dyn ExecutionPlan) -> Metrics {
    let mut out = Vec::new();
    if let Some(set) = p.metrics() {
        for m in set.aggregate_by_name().iter() {
            out.push((m.value().name().to_string(), m.value().as_usize()));
        }
    }
    Metrics(out)
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// `2.9 MiB`, `512 B`.
pub fn bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `1.4 s`, `2m 05s`, `1h 02m`.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{:.1} s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h {:02}m", secs / 3600, secs % 3600 / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Progress {
        Progress {
            elapsed: Duration::from_millis(1400),
            has_listing: true,
            files_listed: 3000,
            listing_done: true,
            udfs: vec![UdfProgress {
                name: "sha256".into(),
                kind: "map",
                rows: 1500,
                total: Some(3000),
                listed: None,
                rate: 1000.0,
                kept: 0,
            }],
            files_fetched: 3000,
            bytes_fetched: 3 * 1024 * 1024 - 100 * 1024,
            cache_hits: 0,
            files_in_place: 0,
            bytes_in_place: 0,
            eta: Some(Duration::from_millis(1500)),
            finished: false,
            waiting_for_executor: false,
        }
    }

    #[test]
    fn the_summary_names_rows_files_bytes_and_time() {
        assert_eq!(
            sample().summary(3000),
            "3000 rows, 3000 files, 2.9 MiB fetched in 1.4 s"
        );
        let bare = Progress {
            elapsed: Duration::from_secs(125),
            ..Default::default()
        };
        assert_eq!(bare.summary(1), "1 row in 2m 05s");
        let in_place = Progress {
            files_fetched: 0,
            bytes_fetched: 0,
            files_in_place: 3000,
            bytes_in_place: 3 << 20,
            ..sample()
        };
        assert_eq!(
            in_place.summary(3000),
            "3000 rows, 3000 files, 3.0 MiB read in place in 1.4 s"
        );
        assert!(in_place.lines()[0].contains("read 3000 files in place, 3.0 MiB"));
        assert!(bare.is_long() && sample().is_long());
        assert!(!Progress::default().is_long());
    }

    #[test]
    fn a_job_without_an_executor_says_so_on_the_first_line() {
        assert!(!sample().lines()[0].contains("waiting"));
        let waiting = Progress {
            waiting_for_executor: true,
            ..sample()
        };
        assert!(
            waiting.lines()[0].ends_with("  waiting for an executor"),
            "{:?}",
            waiting.lines()
        );
    }

    #[test]
    fn the_lines_show_done_of_total_and_eta() {
        let lines = sample().lines();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains("listed 3000 files (all)"), "{lines:?}");
        assert!(lines[0].contains("ETA 1.5 s"), "{lines:?}");
        assert!(
            lines[1].starts_with(
                "sha256 (map)  [############------------] 1500/3000 rows, 1000 rows/s"
            ),
            "{lines:?}"
        );
        let mut p = sample();
        p.listing_done = false;
        p.udfs[0].total = None;
        p.udfs[0].listed = Some(2000);
        p.eta = None;
        let lines = p.lines();
        assert!(lines[0].contains("listed 3000 files..."), "{lines:?}");
        assert!(lines[1].contains(" 1500/2000+ rows, "), "{lines:?}");
        assert!(!lines[0].contains("ETA"), "{lines:?}");
    }

    #[test]
    fn a_resumed_save_says_how_many_rows_were_already_done() {
        let mut p = sample();
        assert!(!p.lines()[0].contains("resuming"));
        p.udfs[0].kept = 1200;
        assert!(
            p.lines()[0].ends_with("  resuming: 1200 of 3000 rows already done"),
            "{:?}",
            p.lines()
        );
        assert!(
            p.summary(3000).ends_with(", 1200 rows from a checkpoint"),
            "{}",
            p.summary(3000)
        );
        p.udfs[0].total = None;
        p.udfs[0].listed = Some(2000);
        assert!(p.lines()[0].ends_with("resuming: 1200 of 2000+ rows already done"));
    }

    #[test]
    fn sizes_and_durations_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 << 30), "5.0 GiB");
        assert_eq!(duration(Duration::from_millis(300)), "0.3 s");
        assert_eq!(duration(Duration::from_secs(3720)), "1h 02m");
    }
}
