//! The physical planning of [`UdfNode`]s: each UDF kind becomes its operator;
//! a `PrefetchExec` is put in front of it when its params carry `File`s and
//! `prefetch > 0` (nothing else knows about prefetching).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::error::Result as DfResult;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use udfchain_udfs::File;

use super::aggregate::AggregateExec;
use super::batch_map::BatchMapExec;
use super::common::UdfCall;
use super::generate::GenerateExec;
use super::map::MapExec;
use super::node::{UdfKind, UdfNode};
use super::prefetch::{PrefetchExec, PrefetchOptions};
use crate::error::Error;
use crate::settings::Prefetch;

/// The session's query planner: DataFusion's, plus [`UdfPlanner`].
#[derive(Debug)]
pub struct UdfQueryPlanner;

#[async_trait]
impl QueryPlanner for UdfQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(UdfPlanner)])
            .create_physical_plan(logical_plan, session)
            .await
    }
}

/// Plans [`UdfNode`]s.
#[derive(Debug)]
pub struct UdfPlanner;

#[async_trait]
impl ExtensionPlanner for UdfPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<UdfNode>() else {
            return Ok(None);
        };
        let [input] = physical_inputs else {
            return Err(Error::plan("a UDF takes one input").into_df());
        };
        let input = Arc::clone(input);
        let in_schema = input.schema();
        let sig = node.kind.signature();
        let index = |name: &str| {
            in_schema.index_of(name).map_err(|_| {
                Error::plan(format!("UDF {}: no input column {name:?}", sig.name)).into_df()
            })
        };
        let mut params = Vec::with_capacity(sig.params.len());
        for p in &sig.params {
            params.push((index(p)?, p.clone()));
        }
        // Name the file of a failing row: File params first, then any File column.
        let mut file_cols: Vec<usize> = params
            .iter()
            .map(|(i, _)| *i)
            .filter(|&i| File::is_file_type(in_schema.field(i).data_type()))
            .collect();
        let file_params = file_cols.clone();
        let others: Vec<usize> = (0..in_schema.fields().len())
            .filter(|i| {
                !file_cols.contains(i) && File::is_file_type(in_schema.field(*i).data_type())
            })
            .collect();
        file_cols.extend(others);
        let s = &node.settings;
        let call = Arc::new(
            UdfCall::new(
                sig.name.clone(),
                node.kind.kind_name(),
                params,
                file_cols,
                file_params.clone(),
                s.get_parallel(),
                s.get_batch_size(),
                s.get_on_error(),
                s.get_storage_options().clone(),
            )
            .with_cache(s.cache_dir(), s.get_cache_limit(), s.get_cache())
            .with_ordered(s.get_ordered()),
        );
        let schema = Arc::new(node.schema().as_arrow().clone());
        let mut keys = Vec::new();
        if let UdfKind::Agg { partition_by, .. } = &node.kind {
            for k in partition_by {
                keys.push((index(k)?, k.clone()));
            }
        }
        let prefetch_on = !file_params.is_empty() && s.get_prefetch() != Prefetch::Fixed(0);
        let input = if prefetch_on {
            // An aggregate needs its input sorted by key; sort before prefetching so
            // the window, not the whole input, is what waits on disk.
            let input = if keys.is_empty() {
                input
            } else {
                sort_by_keys(input, &keys)?
            };
            let options = PrefetchOptions {
                prefetch: s.get_prefetch(),
                ordered: s.get_ordered() || !keys.is_empty(),
                max_connections: s.get_max_connections(),
                on_error: s.get_on_error(),
                root: s.get_root(),
                cache: s.get_cache(),
                cache_limit: s.get_cache_limit(),
                memory_file_limit: s.get_memory_file_limit(),
                storage_options: s.get_storage_options().clone(),
            };
            Arc::new(PrefetchExec::new(input, file_params, options)) as Arc<dyn ExecutionPlan>
        } else {
            input
        };
        let exec: Arc<dyn ExecutionPlan> = match &node.kind {
            UdfKind::Map(udf) => Arc::new(MapExec::new(
                input,
                Arc::clone(udf),
                call,
                prefetch_on,
                schema,
            )),
            UdfKind::Gen(udf) => Arc::new(GenerateExec::new(
                input,
                Arc::clone(udf),
                call,
                prefetch_on,
                schema,
            )),
            UdfKind::BatchMap(udf) => Arc::new(BatchMapExec::new(
                input,
                Arc::clone(udf),
                call,
                prefetch_on,
                schema,
            )),
            UdfKind::Agg { udf, .. } => Arc::new(AggregateExec::new(
                input,
                Arc::clone(udf),
                call,
                keys,
                prefetch_on,
                schema,
            )),
        };
        Ok(Some(exec))
    }
}

/// `input` merged into one partition and sorted by `keys`.
fn sort_by_keys(
    input: Arc<dyn ExecutionPlan>,
    keys: &[(usize, String)],
) -> DfResult<Arc<dyn ExecutionPlan>> {
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
    use datafusion::physical_plan::ExecutionPlanProperties;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::sorts::sort::SortExec;
    let input: Arc<dyn ExecutionPlan> = if input.output_partitioning().partition_count() > 1 {
        Arc::new(CoalescePartitionsExec::new(input))
    } else {
        input
    };
    let exprs = keys
        .iter()
        .map(|(i, name)| PhysicalSortExpr::new_default(Arc::new(Column::new(name, *i))));
    let ordering = LexOrdering::new(exprs)
        .ok_or_else(|| Error::plan("partition_by needs at least one column").into_df())?;
    Ok(Arc::new(SortExec::new(ordering, input)))
}
