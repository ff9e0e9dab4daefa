//! [`RunReport`]: what a run did, read from the executed physical plan: every
//! operator's metrics (summed over partitions) and the rows dropped under
//! `on_error = skip`.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, displayable};

use super::{AggregateExec, BatchMapExec, GenerateExec, MapExec, PrefetchExec};

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
    pub operators: Vec<OperatorReport>,
    /// Files (or `udf row N`) dropped by `on_error = skip`, in the order they were met.
    pub skipped: Vec<String>,
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
        if let Some(e) = p.downcast_ref::<PrefetchExec>() {
            self.skipped.extend(e.skipped());
        } else if let Some(e) = p.downcast_ref::<MapExec>() {
            self.skipped.extend(e.call().skipped());
        } else if let Some(e) = p.downcast_ref::<GenerateExec>() {
            self.skipped.extend(e.call().skipped());
        } else if let Some(e) = p.downcast_ref::<BatchMapExec>() {
            self.skipped.extend(e.call().skipped());
        } else if let Some(e) = p.downcast_ref::<AggregateExec>() {
            self.skipped.extend(e.call().skipped());
        }
        for child in plan.children() {
            self.visit(child);
        }
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
