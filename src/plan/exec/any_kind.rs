//! [`AnyUdfExec`]: a UDF operator of any kind, seen through what every kind
//! has (its call, its UDF as one value, its prefetch, its schema), and
//! [`as_udf_exec`], the one place that knows the four kinds, for what reads
//! plans (the run report, progress, the cluster codec).

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::physical_plan::ExecutionPlan;

use super::aggregate::Aggregate;
use super::batch_map::BatchMap;
use super::generate::Generate;
use super::map::Map;
use super::udf_call::UdfCall;
use super::udf_exec::{UdfExec, UdfKind};
use crate::plan::logical::Udf;

/// A UDF operator of any kind, seen through what every kind has.
pub trait AnyUdfExec {
    /// How its UDF is called.
    fn call(&self) -> &UdfCall;
    /// Its UDF as one [`Udf`] value.
    fn udf(&self) -> Udf;
    /// Whether its input is the `PrefetchExec` that fetches its files.
    fn prefetched(&self) -> bool;
    /// Its output schema.
    fn output_schema(&self) -> &SchemaRef;
}

impl<K: UdfKind> AnyUdfExec for UdfExec<K> {
    fn call(&self) -> &UdfCall {
        &self.call
    }

    fn udf(&self) -> Udf {
        self.kind.udf(&self.udf)
    }

    fn prefetched(&self) -> bool {
        self.prefetched
    }

    fn output_schema(&self) -> &SchemaRef {
        &self.schema
    }
}

/// `plan` as a UDF operator, when it is one (of any kind).
pub fn as_udf_exec(plan: &dyn ExecutionPlan) -> Option<&dyn AnyUdfExec> {
    fn of<K: UdfKind + Clone>(plan: &dyn ExecutionPlan) -> Option<&dyn AnyUdfExec> {
        plan.downcast_ref::<UdfExec<K>>()
            .map(|e| e as &dyn AnyUdfExec)
    }
    of::<Map>(plan)
        .or_else(|| of::<BatchMap>(plan))
        .or_else(|| of::<Generate>(plan))
        .or_else(|| of::<Aggregate>(plan))
}
