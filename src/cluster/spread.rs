//! [`Spread`]: on a cluster, `workers = N` spreads each map, gen and batch_map
//! UDF over N partitions (so over N task slots of the executors).
//!
//! A listing is one partition, and a UDF operator runs its `parallel` calls
//! inside its partition, so locally nothing is repartitioned. On a cluster the
//! rule puts a hash repartition on the UDF's first `File` column (round robin
//! by batch when it reads no file) below the UDF's `PrefetchExec` (or below the
//! UDF when it prefetches nothing), which Ballista turns into a stage boundary:
//! each of the N partitions is a task of its own, with its own prefetch window.
//! Aggregates are not spread: they need all rows of a key in one partition,
//! sorted, so the partitions of a spread UDF below one are merged again (by
//! the sort below it when it has keys). Operators above that need one partition (a sort, a single-mode
//! aggregate, a global limit) get the partitions merged again. Output order
//! across partitions is not kept (`order_by` to sort). Not handled: an
//! operator above requiring hash partitioning (a partitioned join) of the
//! spread rows.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DfResult;
use datafusion::physical_expr::Distribution;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};
use udfchain_udfs::File;

use crate::plan::{Udf, udf_exec_parts};

/// `node` with its children merged into one partition where it requires one
/// (a `SortExec` that does not keep partitions, a single-mode aggregate, a
/// global limit...): above a spread UDF, what was planned over one partition
/// now gets several. Plans the rule did not change never need this.
fn single_where_required(
    node: Arc<dyn ExecutionPlan>,
) -> DfResult<Transformed<Arc<dyn ExecutionPlan>>> {
    let required = node.input_distribution_requirements().into_per_child();
    let children: Vec<Arc<dyn ExecutionPlan>> =
        node.children().into_iter().map(Arc::clone).collect();
    let mut changed = false;
    let merged: Vec<Arc<dyn ExecutionPlan>> = children
        .into_iter()
        .zip(
            required
                .iter()
                .chain(std::iter::repeat(&Distribution::UnspecifiedDistribution)),
        )
        .map(|(child, req)| {
            if matches!(req, Distribution::SinglePartition)
                && child.output_partitioning().partition_count() > 1
            {
                changed = true;
                Arc::new(CoalescePartitionsExec::new(child)) as Arc<dyn ExecutionPlan>
            } else {
                child
            }
        })
        .collect();
    if !changed {
        return Ok(Transformed::no(node));
    }
    Ok(Transformed::yes(replace_children_if_necessary(
        node, merged,
    )?))
}

/// An aggregate over one partition of every row: below it (below its
/// `PrefetchExec` when it has one) a spread UDF may have made several; with
/// keys, the sort below already merged them.
fn merged_below_aggregate(
    node: Arc<dyn ExecutionPlan>,
    prefetched: bool,
) -> DfResult<Transformed<Arc<dyn ExecutionPlan>>> {
    if !prefetched {
        return single_where_required(node);
    }
    let Some(prefetch) = node.children().first().map(|c| Arc::clone(c)) else {
        return Ok(Transformed::no(node));
    };
    let Some(below) = prefetch.children().first().map(|c| Arc::clone(c)) else {
        return Ok(Transformed::no(node));
    };
    if below.output_partitioning().partition_count() <= 1 {
        return Ok(Transformed::no(node));
    }
    let merged: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(below));
    let prefetch = replace_children_if_necessary(prefetch, vec![merged])?;
    Ok(Transformed::yes(replace_children_if_necessary(
        node,
        vec![prefetch],
    )?))
}

/// The physical optimizer rule of cluster sessions (see the module header).
#[derive(Debug, Default)]
pub struct Spread;

impl PhysicalOptimizerRule for Spread {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(parts) = udf_exec_parts(node.as_ref()) else {
                return single_where_required(node);
            };
            if matches!(parts.kind, Udf::Agg { .. }) {
                return merged_below_aggregate(node, parts.prefetched);
            }
            let workers = parts.settings.get_workers();
            if workers <= 1 {
                return Ok(Transformed::no(node));
            }
            let Some(child) = node.children().first().map(|c| Arc::clone(c)) else {
                return Ok(Transformed::no(node));
            };
            let below = if parts.prefetched {
                match child.children().first() {
                    Some(c) => Arc::clone(c),
                    None => return Ok(Transformed::no(node)),
                }
            } else {
                Arc::clone(&child)
            };
            if below.output_partitioning().partition_count() >= workers {
                return Ok(Transformed::no(node));
            }
            let schema = below.schema();
            let file_col = parts
                .kind
                .signature()
                .params
                .iter()
                .filter_map(|p| schema.index_of(p).ok())
                .find(|&i| File::is_file_type(schema.field(i).data_type()));
            let partitioning = match file_col {
                Some(i) => Partitioning::Hash(
                    vec![Arc::new(Column::new(schema.field(i).name(), i))],
                    workers,
                ),
                None => Partitioning::RoundRobinBatch(workers),
            };
            let spread: Arc<dyn ExecutionPlan> =
                Arc::new(RepartitionExec::try_new(below, partitioning)?);
            let input = if parts.prefetched {
                replace_children_if_necessary(child, vec![spread])?
            } else {
                spread
            };
            Ok(Transformed::yes(replace_children_if_necessary(
                node,
                vec![input],
            )?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "udfchain_spread"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
