//! [`Udf::renamed`]: one UDF value called under the name, params and output
//! column a plan (a cluster task, a SQL call) gives it.
//!
//! Guarantees: the wrapped UDF sees its input columns under its own param
//! names (the plan's params are matched to them by position, so a UDF
//! written for `file` serves `thumbnail(photo)`); the output carries the
//! plan's signature; setup, teardown and the concurrency bound are the
//! wrapped UDF's, so every wrapper of one UDF value shares its state.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{Field, Schema};
use futures::stream::BoxStream;
use udfchain_udfs::{
    Aggregator, BatchMapper, CallError, Code, EachRow, Generator, Lifecycle, Mapper, Signature,
    UdfError,
};

use super::Udf;

impl Udf {
    /// This UDF under `sig` (name, params and output of the call) and, for an
    /// aggregate, grouped by `partition_by`.
    pub fn renamed(self, sig: &Signature, partition_by: &[String]) -> Udf {
        let sig = sig.clone();
        match self {
            Udf::Map(inner) => Udf::Map(Arc::new(Named::new(sig, inner))),
            Udf::Gen(inner) => Udf::Gen(Arc::new(Named::new(sig, inner))),
            Udf::BatchMap(inner) => Udf::BatchMap(Arc::new(Named::new(sig, inner))),
            Udf::Agg { udf, .. } => Udf::Agg {
                udf: Arc::new(Named::new(sig, udf)),
                partition_by: partition_by.to_vec(),
            },
        }
    }
}

/// A UDF under the signature a plan gave it.
struct Named<T: ?Sized> {
    sig: Signature,
    /// The plan's param name -> the wrapped UDF's, where they differ.
    params: Vec<(String, String)>,
    inner: Arc<T>,
}

/// What every UDF trait object answers: its signature.
trait Signed {
    fn sig(&self) -> &Signature;
}

macro_rules! signed {
    ($($t:ident),*) => {$(
        impl Signed for dyn $t {
            fn sig(&self) -> &Signature {
                self.signature()
            }
        }
    )*};
}
signed!(Mapper, Generator, BatchMapper, Aggregator);

impl<T: ?Sized + Signed> Named<T> {
    fn new(sig: Signature, inner: Arc<T>) -> Self {
        let params = sig
            .params
            .iter()
            .zip(&inner.sig().params)
            .filter(|(plan, own)| plan != own)
            .map(|(plan, own)| (plan.clone(), own.clone()))
            .collect();
        Self { sig, params, inner }
    }

    /// `input` with the plan's param columns under the wrapped UDF's names
    /// (the arrays are shared, not copied); a column that already had one of
    /// those names, and is not a param itself, is left out so it cannot
    /// shadow the param.
    fn input(&self, input: RecordBatch) -> RecordBatch {
        if self.params.is_empty() {
            return input;
        }
        let schema = input.schema();
        let shadows = |name: &str| {
            self.params.iter().any(|(_, own)| own == name)
                && !self.params.iter().any(|(plan, _)| plan == name)
        };
        let (fields, columns): (Vec<Field>, Vec<ArrayRef>) = schema
            .fields()
            .iter()
            .zip(input.columns())
            .filter(|(f, _)| !shadows(f.name()))
            .map(|(f, c)| {
                let field = match self.params.iter().find(|(plan, _)| plan == f.name()) {
                    Some((_, own)) => f.as_ref().clone().with_name(own),
                    None => f.as_ref().clone(),
                };
                (field, Arc::clone(c))
            })
            .unzip();
        let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
        let options = RecordBatchOptions::new().with_row_count(Some(input.num_rows()));
        // The same arrays under other names: this cannot fail; if it did, the
        // UDF would say which column it misses.
        RecordBatch::try_new_with_options(schema, columns, &options).unwrap_or(input)
    }
}

impl<T: ?Sized> fmt::Debug for Named<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Udf({})", self.sig.name)
    }
}

#[async_trait]
impl Mapper for Named<dyn Mapper> {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    async fn map(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        self.inner.map(self.input(input)).await
    }
    async fn map_each(
        &self,
        input: RecordBatch,
        stop_at_error: bool,
    ) -> Result<EachRow, CallError> {
        self.inner.map_each(self.input(input), stop_at_error).await
    }
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        self.inner.lifecycle()
    }
    fn concurrency(&self) -> Option<usize> {
        self.inner.concurrency()
    }
    fn code(&self) -> Result<Option<Code>, UdfError> {
        self.inner.code()
    }
}

impl Generator for Named<dyn Generator> {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    fn generate(
        &self,
        input: RecordBatch,
        max_rows: usize,
    ) -> BoxStream<'static, Result<ArrayRef, CallError>> {
        self.inner.generate(self.input(input), max_rows)
    }
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        self.inner.lifecycle()
    }
    fn concurrency(&self) -> Option<usize> {
        self.inner.concurrency()
    }
    fn code(&self) -> Result<Option<Code>, UdfError> {
        self.inner.code()
    }
}

#[async_trait]
impl BatchMapper for Named<dyn BatchMapper> {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    async fn map_batch(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        self.inner.map_batch(self.input(input)).await
    }
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        self.inner.lifecycle()
    }
    fn concurrency(&self) -> Option<usize> {
        self.inner.concurrency()
    }
    fn code(&self) -> Result<Option<Code>, UdfError> {
        self.inner.code()
    }
}

#[async_trait]
impl Aggregator for Named<dyn Aggregator> {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    async fn aggregate(&self, group: RecordBatch) -> Result<ArrayRef, CallError> {
        self.inner.aggregate(self.input(group)).await
    }
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        self.inner.lifecycle()
    }
    fn concurrency(&self) -> Option<usize> {
        self.inner.concurrency()
    }
    fn code(&self) -> Result<Option<Code>, UdfError> {
        self.inner.code()
    }
}
