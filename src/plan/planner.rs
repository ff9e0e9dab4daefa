//! The physical planning of [`UdfNode`]s: each UDF kind becomes its operator;
//! a `PrefetchExec` is put in front of it when its params carry `File`s and
//! `prefetch > 0` (nothing else knows about prefetching).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::error::Result as DfResult;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use udfchain_udfs::File;

use crate::error::Error;
use crate::plan::exec::aggregate::{Aggregate, AggregateExec};
use crate::plan::exec::any_kind::as_udf_exec;
use crate::plan::exec::batch_map::{BatchMap, BatchMapExec};
use crate::plan::exec::generate::{Generate, GenerateExec};
use crate::plan::exec::lifecycle::Instance;
use crate::plan::exec::map::{Map, MapExec};
use crate::plan::exec::udf_call::UdfCall;
use crate::plan::logical::node::UdfNode;
use crate::plan::logical::udf::Udf;
use crate::plan::memo::Checkpoint;
use crate::plan::memo::Memo;
use crate::plan::prefetch::{PrefetchExec, PrefetchOptions};
use crate::settings::{Prefetch, Settings};

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
        session: &dyn Session,
        _ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<UdfNode>() else {
            return Ok(None);
        };
        let [input] = physical_inputs else {
            return Err(Error::plan("a UDF takes one input").into_df());
        };
        let schema = Arc::new(node.schema().as_arrow().clone());
        let s = &node.settings;
        let file_params = file_params(&node.kind, &input.schema());
        let prefetch_on = !file_params.is_empty() && s.get_prefetch() != Prefetch::Fixed(0);
        let input = Arc::clone(input);
        let memo = match session.config().get_extension::<Checkpoint>() {
            Some(c) if s.get_checkpoints() => c
                .memo(node, &input.schema())
                .await
                .map_err(Error::into_df)?,
            _ => None,
        };
        let input = if prefetch_on {
            // An aggregate needs its input sorted by key; sort before prefetching so
            // the window, not the whole input, is what waits on disk.
            let keys = key_columns(&node.kind, &input.schema())?;
            let ordered = s.get_ordered() || !keys.is_empty();
            let input = if keys.is_empty() {
                input
            } else {
                sort_by_keys(input, &keys)?
            };
            let options = PrefetchOptions {
                memo: memo.clone(),
                ..prefetch_options(s, ordered)
            };
            Arc::new(PrefetchExec::new(input, file_params, options)) as Arc<dyn ExecutionPlan>
        } else {
            input
        };
        udf_exec(&node.kind, s, input, prefetch_on, schema, memo).map(Some)
    }
}

/// The `PrefetchExec` options `settings` ask for.
pub fn prefetch_options(s: &Settings, ordered: bool) -> PrefetchOptions {
    PrefetchOptions {
        prefetch: s.get_prefetch(),
        ordered,
        max_connections: s.get_max_connections(),
        on_error: s.get_on_error(),
        root: s.get_root(),
        cache: s.get_cache(),
        cache_limit: s.get_cache_limit(),
        memory_file_limit: s.get_memory_file_limit(),
        temp_dir_limit: s.get_temp_dir_limit(),
        storage_options: s.get_storage_options().clone(),
        memo: None,
    }
}

/// Indices of the params holding `File`s in `in_schema`.
fn file_params(kind: &Udf, in_schema: &SchemaRef) -> Vec<usize> {
    kind.signature()
        .params
        .iter()
        .filter_map(|p| in_schema.index_of(p).ok())
        .filter(|&i| File::is_file_type(in_schema.field(i).data_type()))
        .collect()
}

fn column_index(udf: &str, in_schema: &SchemaRef, name: &str) -> DfResult<usize> {
    in_schema
        .index_of(name)
        .map_err(|_| Error::plan(format!("UDF {udf}: no input column {name:?}")).into_df())
}

/// The partition keys of an aggregate (none for other kinds).
fn key_columns(kind: &Udf, in_schema: &SchemaRef) -> DfResult<Vec<(usize, String)>> {
    let mut keys = Vec::new();
    if let Udf::Agg { partition_by, .. } = kind {
        for k in partition_by {
            keys.push((
                column_index(&kind.signature().name, in_schema, k)?,
                k.clone(),
            ));
        }
    }
    Ok(keys)
}

/// The operator of `kind` over `input` (its `PrefetchExec` when `prefetched`),
/// configured by `settings`, producing `schema`, keeping its results in
/// `memo` when given (a save's checkpoint). The planner and the cluster's
/// codec (which rebuilds operators from a UDF, its settings and its decoded
/// input; no checkpoint on a cluster) build operators only through this.
pub fn udf_exec(
    kind: &Udf,
    s: &Settings,
    input: Arc<dyn ExecutionPlan>,
    prefetched: bool,
    schema: SchemaRef,
    memo: Option<Arc<Memo>>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let in_schema = input.schema();
    let sig = kind.signature();
    let mut params = Vec::with_capacity(sig.params.len());
    for p in &sig.params {
        params.push((column_index(&sig.name, &in_schema, p)?, p.clone()));
    }
    // Name the file of a failing row: File params first, then any File column.
    let mut file_cols = file_params(kind, &in_schema);
    let file_params = file_cols.clone();
    let others: Vec<usize> = (0..in_schema.fields().len())
        .filter(|i| !file_cols.contains(i) && File::is_file_type(in_schema.field(*i).data_type()))
        .collect();
    file_cols.extend(others);
    let call = Arc::new(
        UdfCall::new(
            sig.name.clone(),
            kind.kind_name(),
            params,
            file_cols,
            file_params,
            s.get_parallel(),
            s.get_batch_size(),
            s.get_on_error(),
            s.get_storage_options().clone(),
        )
        .with_cache(s.cache_dir(), s.get_cache_limit(), s.get_cache())
        .with_ordered(s.get_ordered())
        .with_settings(s.clone())
        .with_memo(memo)
        .with_instance(Instance::of(kind)),
    );
    let exec: Arc<dyn ExecutionPlan> = match kind {
        Udf::Map(udf) => Arc::new(MapExec::new(
            Map,
            input,
            Arc::clone(udf),
            call,
            prefetched,
            schema,
        )),
        Udf::Gen(udf) => Arc::new(GenerateExec::new(
            Generate,
            input,
            Arc::clone(udf),
            call,
            prefetched,
            schema,
        )),
        Udf::BatchMap(udf) => Arc::new(BatchMapExec::new(
            BatchMap,
            input,
            Arc::clone(udf),
            call,
            prefetched,
            schema,
        )),
        Udf::Agg { udf, .. } => Arc::new(AggregateExec::new(
            Aggregate {
                keys: key_columns(kind, &in_schema)?,
            },
            input,
            Arc::clone(udf),
            call,
            prefetched,
            schema,
        )),
    };
    Ok(exec)
}

/// What a UDF operator was built from (see [`udf_exec`]), for codecs.
#[derive(Debug, Clone)]
pub struct UdfExecParts {
    pub kind: Udf,
    pub settings: Settings,
    /// Its input is the `PrefetchExec` that fetches its files.
    pub prefetched: bool,
    pub schema: SchemaRef,
}

/// The parts of `plan` when it is a UDF operator.
pub fn udf_exec_parts(plan: &dyn ExecutionPlan) -> Option<UdfExecParts> {
    let e = as_udf_exec(plan)?;
    Some(UdfExecParts {
        kind: e.udf(),
        settings: e.call().settings.clone(),
        prefetched: e.prefetched(),
        schema: Arc::clone(e.output_schema()),
    })
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
