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
use crate::error::Error;

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
        let others: Vec<usize> = (0..in_schema.fields().len())
            .filter(|i| {
                !file_cols.contains(i) && File::is_file_type(in_schema.field(*i).data_type())
            })
            .collect();
        file_cols.extend(others);
        let s = &node.settings;
        let call = Arc::new(UdfCall::new(
            sig.name.clone(),
            node.kind.kind_name(),
            params,
            file_cols,
            s.get_parallel(),
            s.get_batch_size(),
            s.get_on_error(),
            s.get_storage_options().clone(),
        ));
        let schema = Arc::new(node.schema().as_arrow().clone());
        let local = None;
        let exec: Arc<dyn ExecutionPlan> = match &node.kind {
            UdfKind::Map(udf) => {
                Arc::new(MapExec::new(input, Arc::clone(udf), call, local, schema))
            }
            UdfKind::Gen(udf) => Arc::new(GenerateExec::new(
                input,
                Arc::clone(udf),
                call,
                local,
                schema,
            )),
            UdfKind::BatchMap(udf) => Arc::new(BatchMapExec::new(
                input,
                Arc::clone(udf),
                call,
                local,
                schema,
            )),
            UdfKind::Agg { udf, partition_by } => {
                let mut keys = Vec::with_capacity(partition_by.len());
                for k in partition_by {
                    keys.push((index(k)?, k.clone()));
                }
                Arc::new(AggregateExec::new(
                    input,
                    Arc::clone(udf),
                    call,
                    keys,
                    local,
                    schema,
                ))
            }
        };
        Ok(Some(exec))
    }
}
