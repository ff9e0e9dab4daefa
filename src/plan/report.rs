//! [`RunReport`]: what a run did, read from the executed physical plan: every
//! operator's metrics (summed over partitions) and the rows dropped under
//! `on_error = skip`.
//!
//! Guarantees: skip lists are bounded. Each operator lists at most
//! [`SKIP_LIST_LIMIT`] dropped rows (the first ones met) and counts the rest, and
//! a report lists at most [`SKIP_LIST_LIMIT`] in all, with
//! [`RunReport::skipped_unlisted`] saying how many drops it does not list; the
//! `skipped_files` (prefetch) and `skipped_rows` (UDF operators) metrics count
//! every drop.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, displayable};

use super::PrefetchExec;
use crate::plan::exec::any_kind::as_udf_exec;

use crate::plan::skip_list::SKIP_LIST_LIMIT;

/// Metrics of one operator.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorReport {
    /// The operator's one-line EXPLAIN text, e.g. `PrefetchExec: prefetch=2, ...`.
    pub operator: String,
    /// Metric name -> value (counts; times in nanoseconds), summed over partitions.
    pub metrics: BTreeMap<String, usize>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunReport {
    /// One report per UDF and prefetch operator, in plan order.
    pub operators: Vec<OperatorReport>,
    /// Files (or `udf row N`) dropped by `on_error = skip`, operator by
    /// operator from the top of the plan; a UDF operator lists its rows in
    /// output order (`ordered = true`) or as calls finish, a prefetch as
    /// downloads fail; at most `SKIP_LIST_LIMIT`.
    pub skipped: Vec<String>,
    /// Drops under `on_error = skip` that `skipped` does not list.
    pub skipped_unlisted: usize,
}

impl RunReport {
    /// Reads the report off an executed plan.
    pub fn from_plan(plan: &Arc<dyn ExecutionPlan>) -> Self {
        let mut report = Self::default();
        report.visit(plan);
        report
    }

    fn visit(&mut self, plan: &Arc<dyn ExecutionPlan>) {
        let operator = displayable(plan.as_ref())
            .one_line()
            .to_string()
            .trim()
            .to_string();
        let mut metrics = BTreeMap::new();
        if let Some(set) = plan.metrics() {
            for m in set.aggregate_by_name().iter() {
                *metrics.entry(m.value().name().to_string()).or_default() += m.value().as_usize();
            }
        }
        self.operators.push(OperatorReport { operator, metrics });
        let p = plan.as_ref();
        let list = if let Some(e) = p.downcast_ref::<PrefetchExec>() {
            Some(e.skip_list())
        } else {
            as_udf_exec(p).map(|e| e.call().skip_list())
        };
        if let Some(list) = list {
            self.add_skips(list.listed(), list.total());
        }
        for child in plan.children() {
            self.visit(child);
        }
    }

    /// Adds an operator's `listed` entries (of `total` drops) within the limit.
    fn add_skips(&mut self, listed: Vec<String>, total: usize) {
        let room = SKIP_LIST_LIMIT.saturating_sub(self.skipped.len());
        let n = listed.len().min(room);
        self.skipped.extend(listed.into_iter().take(n));
        self.skipped_unlisted += total - n;
    }

    /// The value of metric `name` summed over operators whose text starts with `operator`.
    pub fn metric(&self, operator: &str, name: &str) -> usize {
        self.operators
            .iter()
            .filter(|o| o.operator.starts_with(operator))
            .filter_map(|o| o.metrics.get(name))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::skip_list::SkipList;

    #[test]
    fn a_skip_list_keeps_the_first_entries_and_counts_all() {
        let list = SkipList::default();
        for i in 0..SKIP_LIST_LIMIT + 5 {
            list.push(format!("f{i}"));
        }
        let listed = list.listed();
        assert_eq!(listed.len(), SKIP_LIST_LIMIT);
        assert_eq!(listed[0], "f0");
        assert_eq!(
            listed[SKIP_LIST_LIMIT - 1],
            format!("f{}", SKIP_LIST_LIMIT - 1)
        );
        assert_eq!(list.total(), SKIP_LIST_LIMIT + 5);

        let small = SkipList::with_limit(2);
        small.push("a".into());
        assert_eq!((small.listed(), small.total()), (vec!["a".to_string()], 1));
    }

    #[test]
    fn a_report_lists_at_most_the_limit_across_operators() {
        let mut report = RunReport::default();
        // An operator with 3 drops, all listed; then one with the limit listed
        // of limit + 7 drops.
        report.add_skips(vec!["a".into(), "b".into(), "c".into()], 3);
        let full: Vec<String> = (0..SKIP_LIST_LIMIT).map(|i| format!("x{i}")).collect();
        report.add_skips(full, SKIP_LIST_LIMIT + 7);
        assert_eq!(report.skipped.len(), SKIP_LIST_LIMIT);
        assert_eq!(&report.skipped[..4], ["a", "b", "c", "x0"]);
        // Listed + unlisted = every drop.
        assert_eq!(
            report.skipped.len() + report.skipped_unlisted,
            3 + SKIP_LIST_LIMIT + 7
        );
        assert_eq!(report.skipped_unlisted, 10);
    }
}
