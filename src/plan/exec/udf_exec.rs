//! [`UdfExec`]: the one physical UDF operator, generic over the UDF kind
//! ([`UdfKind`]: `map.rs`, `generate.rs`, `batch_map.rs` and `aggregate.rs`
//! each say how their kind cuts its input into calls and its results into
//! rows). Here what every kind shares: the input, the UDF, its [`UdfCall`],
//! whether the input is the `PrefetchExec` that fetches its files, the plan
//! properties and metrics, the `ExecutionPlan` boilerplate, what the calls of
//! one partition share ([`CallContext`]), and the plan properties a UDF
//! operator declares ([`udf_properties`]).
//!
//! Guarantees: executing a partition executes its input first, so the
//! `PrefetchExec` whose local copies the calls read is running before the
//! first call; under `ordered = true` an operator declares the order and the
//! equivalences its input has for the columns it passes on, under `ordered =
//! false` none.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::OrderingRequirements;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder,
};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, Distribution, ExecutionPlan};
use udfchain_udfs::FileSource;

use crate::cache::{LocalCopies, TempCache};
use crate::error::Error;
use crate::plan::exec::udf_call::UdfCall;
use crate::plan::logical::Udf;
use crate::plan::prefetch::{Handoff, PrefetchExec};
use crate::util::exec_boilerplate::exec_boilerplate;

/// What one UDF kind's operator does its own way; everything else is
/// [`UdfExec`]'s. A value of the kind holds what only that kind has (an
/// aggregate's key columns).
pub trait UdfKind: fmt::Debug + Send + Sync + Sized + 'static {
    /// The UDF trait this kind calls (`dyn Mapper`, ...).
    type Udf: ?Sized + fmt::Debug + Send + Sync;
    /// The operator's name in plans (`MapExec`, ...).
    const NAME: &'static str;
    /// The name of the UDF's output column.
    fn output_name(udf: &Self::Udf) -> &str;
    /// The UDF as one [`Udf`] value again (for codecs).
    fn udf(&self, udf: &Arc<Self::Udf>) -> Udf;
    /// How the output's rows relate to the input's.
    fn shape(&self) -> Shape;
    /// What EXPLAIN shows after the output column: `, parallel=N` and the
    /// kind's own settings.
    fn fmt_settings(&self, call: &UdfCall, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, ", parallel={}", call.parallel)
    }
    /// Whether the output keeps the input's order.
    fn maintains_input_order(&self, call: &UdfCall) -> bool {
        call.ordered
    }
    /// Whether a `LIMIT` above may go below the operator.
    fn supports_limit_pushdown(&self, _call: &UdfCall) -> bool {
        false
    }
    /// The distribution the operator needs of its input.
    fn required_input_distribution(&self) -> Distribution {
        Distribution::UnspecifiedDistribution
    }
    /// The order the operator needs of its input.
    fn required_input_ordering(&self) -> Option<OrderingRequirements> {
        None
    }
    /// Runs one partition.
    fn execute(
        exec: &UdfExec<Self>,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream>;
}

/// How a UDF operator's output relates to its input.
#[derive(Debug, Clone)]
pub enum Shape {
    /// Input columns then the UDF's column, at most one row per input row; as
    /// many partitions as the input.
    Append,
    /// Like `Append`, but an input row may repeat (a generator).
    Expand,
    /// One partition of groups: these key columns then the UDF's column.
    Group(Vec<usize>),
}

/// A UDF operator of kind `K`: its input, the UDF, how it is called, whether
/// its input is the `PrefetchExec` that fetches its files, and the plan's
/// bookkeeping.
#[derive(Debug)]
pub struct UdfExec<K: UdfKind> {
    pub kind: K,
    pub input: Arc<dyn ExecutionPlan>,
    pub udf: Arc<K::Udf>,
    pub call: Arc<UdfCall>,
    /// The input is a `PrefetchExec` whose local copies the calls read.
    pub prefetched: bool,
    pub schema: SchemaRef,
    pub properties: Arc<datafusion::physical_plan::PlanProperties>,
    pub metrics: ExecutionPlanMetricsSet,
}

impl<K: UdfKind + Clone> UdfExec<K> {
    pub fn new(
        kind: K,
        input: Arc<dyn ExecutionPlan>,
        udf: Arc<K::Udf>,
        call: Arc<UdfCall>,
        prefetched: bool,
        schema: SchemaRef,
    ) -> Self {
        Self {
            properties: Arc::new(udf_properties(
                &input,
                Arc::clone(&schema),
                &kind.shape(),
                call.ordered,
            )),
            kind,
            input,
            udf,
            call,
            prefetched,
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The same operator over a new input.
    pub fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(
            self.kind.clone(),
            input,
            Arc::clone(&self.udf),
            Arc::clone(&self.call),
            self.prefetched,
            Arc::clone(&self.schema),
        )
    }
}

impl<K: UdfKind> UdfExec<K> {
    /// Executes the input of `partition` and gathers what its calls share. The
    /// input goes first: executing it starts the `PrefetchExec` whose local
    /// copies the calls read.
    pub fn start(
        &self,
        partition: usize,
        ctx: &Arc<TaskContext>,
    ) -> DfResult<(
        SendableRecordBatchStream,
        CallContext<K::Udf>,
        BaselineMetrics,
    )> {
        self.start_with(partition, ctx, false)
    }

    /// [`UdfOperator::start`]; with `handoff` (an operator that puts its
    /// results back in input order itself) an ordered `PrefetchExec` below
    /// hands rows on as their downloads finish, and [`CallContext::handoff`]
    /// says where each belongs.
    pub fn start_with(
        &self,
        partition: usize,
        ctx: &Arc<TaskContext>,
        handoff: bool,
    ) -> DfResult<(
        SendableRecordBatchStream,
        CallContext<K::Udf>,
        BaselineMetrics,
    )> {
        let (input, handle) = if self.prefetched {
            let prefetch = self.input.downcast_ref::<PrefetchExec>().ok_or_else(|| {
                Error::internal(format!(
                    "UDF {} reads prefetched files but its input is {}, not its PrefetchExec",
                    self.call.name,
                    self.input.name()
                ))
                .into_df()
            })?;
            let (input, handle) =
                prefetch.execute_with_copies(partition, Arc::clone(ctx), handoff)?;
            (input, Some(handle))
        } else {
            (self.input.execute(partition, Arc::clone(ctx))?, None)
        };
        let (local, temp, handoff) = match handle {
            Some(h) => (Some(h.local), Some(h.temp), h.handoff),
            None => (None, None, None),
        };
        let part = CallContext {
            source: self.call.file_source(ctx, local.clone())?,
            local,
            temp,
            handoff,
            copies_left: MetricBuilder::new(&self.metrics).gauge("copies_left", partition),
            call: Arc::clone(&self.call),
            udf: Arc::clone(&self.udf),
            schema: Arc::clone(&self.schema),
            skipped_rows: MetricBuilder::new(&self.metrics).counter("skipped_rows", partition),
            checkpoint_hits: MetricBuilder::new(&self.metrics)
                .counter("checkpoint_hits", partition),
        };
        if let Some(memo) = self.call.memo.as_ref().filter(|_| partition == 0) {
            // Rows of earlier runs the checkpoint holds (one gauge per operator).
            MetricBuilder::new(&self.metrics)
                .global_gauge("checkpoint_rows")
                .set(memo.kept());
        }
        Ok((input, part, BaselineMetrics::new(&self.metrics, partition)))
    }
}

impl<K: UdfKind> DisplayAs for UdfExec<K> {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "{}: udf={}, output={}",
            K::NAME,
            self.call.name,
            K::output_name(&self.udf)
        )?;
        self.kind.fmt_settings(&self.call, f)
    }
}

impl<K: UdfKind + Clone> ExecutionPlan for UdfExec<K> {
    exec_boilerplate!(K::NAME, one_input, metrics);

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        // The operator runs `parallel` calls itself; more partitions would
        // only scatter the input order.
        vec![false]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![self.kind.maintains_input_order(&self.call)]
    }

    fn supports_limit_pushdown(&self) -> bool {
        self.kind.supports_limit_pushdown(&self.call)
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![self.kind.required_input_distribution()]
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        vec![self.kind.required_input_ordering()]
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        K::execute(self, partition, ctx)
    }
}

/// What the calls of one partition of a UDF operator share; cheap to clone
/// into each call's future.
pub struct CallContext<U: ?Sized> {
    pub call: Arc<UdfCall>,
    pub udf: Arc<U>,
    /// Serves the UDF's `File` reads.
    pub source: Arc<dyn FileSource>,
    /// The operator's output schema.
    pub schema: SchemaRef,
    /// The copies the `PrefetchExec` below made, released row by row.
    pub local: Option<Arc<dyn LocalCopies>>,
    /// The same copies, counted.
    pub(super) temp: Option<Arc<TempCache>>,
    /// Rows come as their downloads finish, each with its position here.
    pub handoff: Option<Arc<Handoff>>,
    /// Copies still counted on when the output ended (0: every row released its files).
    pub(super) copies_left: Gauge,
    /// Rows dropped under `on_error = skip` (every one, listed or not).
    pub(super) skipped_rows: Count,
    /// Rows answered from the checkpoint, without a call.
    pub(super) checkpoint_hits: Count,
}

impl<U: ?Sized> Clone for CallContext<U> {
    fn clone(&self) -> Self {
        Self {
            call: Arc::clone(&self.call),
            udf: Arc::clone(&self.udf),
            source: Arc::clone(&self.source),
            schema: Arc::clone(&self.schema),
            local: self.local.clone(),
            temp: self.temp.clone(),
            handoff: self.handoff.clone(),
            copies_left: self.copies_left.clone(),
            skipped_rows: self.skipped_rows.clone(),
            checkpoint_hits: self.checkpoint_hits.clone(),
        }
    }
}

/// Plan properties of a UDF operator over `input`. Under `ordered`, the
/// output keeps what the input's equivalence properties say about the columns
/// it passes on (its orderings, constants and equalities; uniqueness only when
/// rows are not repeated); otherwise nothing is claimed. Emits incrementally.
pub fn udf_properties(
    input: &Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    shape: &Shape,
    ordered: bool,
) -> datafusion::physical_plan::PlanProperties {
    use datafusion::common::Constraints;
    use datafusion::physical_expr::EquivalenceProperties;
    use datafusion::physical_expr::equivalence::ProjectionMapping;
    use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
    use datafusion::physical_plan::{ExecutionPlanProperties, Partitioning};
    let input_schema = input.schema();
    let (kept, parts) = match shape {
        Shape::Append | Shape::Expand => (
            (0..input_schema.fields().len()).collect::<Vec<_>>(),
            input.output_partitioning().partition_count(),
        ),
        Shape::Group(keys) => (keys.clone(), 1),
    };
    let eq = match ProjectionMapping::from_indices(&kept, &input_schema) {
        Ok(mapping) if ordered => {
            let mut eq = input
                .equivalence_properties()
                .project(&mapping, Arc::clone(&schema));
            if parts == 1 && input.output_partitioning().partition_count() > 1 {
                eq.clear_per_partition_constants();
            }
            if !matches!(shape, Shape::Append) {
                // Repeated rows (several outputs of one row or group) are not unique.
                eq.set_constraints(Constraints::default());
            }
            eq
        }
        _ => EquivalenceProperties::new(Arc::clone(&schema)),
    };
    datafusion::physical_plan::PlanProperties::new(
        eq,
        Partitioning::UnknownPartitioning(parts),
        EmissionType::Incremental,
        Boundedness::Bounded,
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::sorts::sort::SortExec;
    use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
    use udfchain_udfs::{agg_fn, batch_map_fn, gen_fn, map_fn};

    use super::super::aggregate::{Aggregate, AggregateExec};
    use super::super::batch_map::{BatchMap, BatchMapExec};
    use super::super::generate::{Generate, GenerateExec};
    use super::super::map::{Map, MapExec};
    use crate::plan::exec::udf_call::UdfCall;
    use crate::settings::OnError;

    /// `id, key` sorted by `id`.
    fn sorted_input() -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::UInt64, false),
            Field::new("key", DataType::Utf8, false),
        ]));
        let by_id = LexOrdering::new([PhysicalSortExpr::new_default(Arc::new(Column::new(
            "id", 0,
        )))])
        .expect("ordering");
        Arc::new(SortExec::new(by_id, Arc::new(EmptyExec::new(schema))))
    }

    fn call(ordered: bool) -> Arc<UdfCall> {
        let params = vec![(0, "id".to_string())];
        Arc::new(
            UdfCall::new(
                "v".into(),
                "map",
                params,
                vec![],
                vec![],
                2,
                2,
                OnError::Fail,
                Default::default(),
            )
            .with_ordered(ordered),
        )
    }

    fn out_schema(input: &[&str]) -> Arc<Schema> {
        let mut fields: Vec<Field> = input
            .iter()
            .map(|n| match *n {
                "id" => Field::new("id", DataType::UInt64, false),
                _ => Field::new(*n, DataType::Utf8, false),
            })
            .collect();
        fields.push(Field::new("v", DataType::UInt64, true));
        Arc::new(Schema::new(fields))
    }

    /// The ordering a plan declares, as text (`id@0 ASC`), if any.
    fn ordering(plan: &dyn ExecutionPlan) -> Option<String> {
        plan.output_ordering().map(|o| o.to_string())
    }

    #[test]
    fn operators_declare_the_order_they_keep_and_none_when_unordered() {
        let map = map_fn(&["id"], "v", |id: u64| async move {
            Ok::<_, std::io::Error>(id)
        })
        .expect("map");
        let batch = batch_map_fn(&["id"], "v", |ids: Vec<u64>| async move {
            Ok::<_, std::io::Error>(ids)
        })
        .expect("batch_map");
        let generator = gen_fn(&["id"], "v", |id: u64| {
            futures::stream::iter([Ok::<_, std::io::Error>(id)])
        })
        .expect("gen");
        let agg = agg_fn(&["id"], "v", |ids: Vec<u64>| async move {
            Ok::<_, std::io::Error>(ids)
        })
        .expect("agg");
        let by_id = Some("id@0 ASC".to_string());
        for ordered in [true, false] {
            let want = if ordered { by_id.clone() } else { None };
            let appended = out_schema(&["id", "key"]);
            let plans: Vec<Arc<dyn ExecutionPlan>> = vec![
                Arc::new(MapExec::new(
                    Map,
                    sorted_input(),
                    Arc::clone(&map),
                    call(ordered),
                    false,
                    Arc::clone(&appended),
                )),
                Arc::new(BatchMapExec::new(
                    BatchMap,
                    sorted_input(),
                    Arc::clone(&batch),
                    call(ordered),
                    false,
                    Arc::clone(&appended),
                )),
                Arc::new(GenerateExec::new(
                    Generate,
                    sorted_input(),
                    Arc::clone(&generator),
                    call(ordered),
                    false,
                    Arc::clone(&appended),
                )),
            ];
            for plan in plans {
                assert_eq!(
                    ordering(plan.as_ref()),
                    want,
                    "{} ordered={ordered}",
                    plan.name()
                );
                assert_eq!(
                    plan.maintains_input_order(),
                    vec![ordered],
                    "{}",
                    plan.name()
                );
            }
            // An aggregate's output is its keys (here `id`) and the value.
            let grouped = AggregateExec::new(
                Aggregate {
                    keys: vec![(0, "id".to_string())],
                },
                sorted_input(),
                Arc::clone(&agg),
                call(ordered),
                false,
                out_schema(&["id"]),
            );
            assert_eq!(ordering(&grouped), want, "AggregateExec ordered={ordered}");
            // Grouped by `key`, which the input is not sorted by: no order claimed.
            let by_key = AggregateExec::new(
                Aggregate {
                    keys: vec![(1, "key".to_string())],
                },
                sorted_input(),
                Arc::clone(&agg),
                call(ordered),
                false,
                out_schema(&["key"]),
            );
            assert_eq!(ordering(&by_key), None);
        }
    }
}
