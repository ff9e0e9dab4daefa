//! Assembling a UDF operator's output: the calls of a partition run
//! `parallel` at once and their results become the output stream, in input
//! order (`ordered = true`, or put back in order by [`InOrder`] when rows come
//! as their downloads finish) or as calls finish; each call's [`Done`] records
//! its skips as its rows are emitted, output rows are counted, and the end of
//! the output records how many prefetched copies are still counted on.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::BaselineMetrics;
use futures::{Stream, StreamExt};

use crate::plan::exec::in_order::InOrder;
use crate::plan::exec::udf_exec::CallContext;
use crate::plan::prefetch::Handoff;

impl<U: ?Sized> CallContext<U> {
    /// A stream of no batches to chain after the operator's output: reached
    /// when the output is complete, it records in `copies_left` how many of
    /// the prefetched copies of this partition are still counted on (0 when
    /// every row released its files).
    pub fn end(&self) -> impl Stream<Item = DfResult<RecordBatch>> + Send + 'static {
        let (temp, gauge) = (self.temp.clone(), self.copies_left.clone());
        futures::stream::once(async move {
            if let Some(temp) = temp {
                gauge.set(temp.len());
            }
        })
        .filter_map(|()| futures::future::ready(None))
    }

    /// The operator's output stream: `calls` run `parallel` at once (results in
    /// input order, or as they finish with `ordered = false`), each call's
    /// skips recorded as its result is emitted, output rows counted, and the
    /// end-of-output bookkeeping of [`CallContext::end`] last.
    pub fn output<S, F>(self, calls: S, baseline: BaselineMetrics) -> SendableRecordBatchStream
    where
        U: Send + Sync + 'static,
        S: Stream<Item = F> + Send + 'static,
        F: Future<Output = DfResult<Done>> + Send + 'static,
    {
        use futures::TryStreamExt;
        let (parallel, ordered) = (self.call.parallel, self.call.ordered);
        let (schema, end) = (Arc::clone(&self.schema), self.end());
        let results = if ordered {
            calls.buffered(parallel).boxed()
        } else {
            calls.buffer_unordered(parallel).boxed()
        };
        let stream = results
            .try_filter_map(move |done| futures::future::ready(Ok(self.emit(done))))
            .inspect_ok(move |b| baseline.record_output(b.num_rows()))
            .chain(end);
        Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, stream))
    }

    /// The output stream of an operator whose calls come from a [`Handoff`]
    /// (rows as their downloads finish): each call's future resolves to the
    /// row's position and its result; `calls` run `parallel` at once, as they
    /// come, and their results are emitted in input order (see [`InOrder`]).
    pub fn output_in_order<S, F>(
        self,
        calls: S,
        handoff: Arc<Handoff>,
        baseline: BaselineMetrics,
    ) -> SendableRecordBatchStream
    where
        U: Send + Sync + 'static,
        S: Stream<Item = F> + Send + 'static,
        F: Future<Output = (Option<u64>, DfResult<Done>)> + Send + 'static,
    {
        use futures::TryStreamExt;
        let (schema, end) = (Arc::clone(&self.schema), self.end());
        let results = InOrder::new(calls.buffer_unordered(self.call.parallel).boxed(), handoff);
        let stream = results
            .try_filter_map(move |done| futures::future::ready(Ok(self.emit(done))))
            .inspect_ok(move |b| baseline.record_output(b.num_rows()))
            .chain(end);
        Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, stream))
    }

    /// Records the skips of a finished call and passes on its rows.
    pub fn emit(&self, done: Done) -> Option<RecordBatch> {
        self.record(done.skipped);
        done.batch
    }
}

/// The outcome of one call: the rows to emit and the skip-list entries of
/// the rows it dropped.
pub struct Done {
    pub batch: Option<RecordBatch>,
    pub skipped: Vec<String>,
}

impl Done {
    pub fn rows(batch: RecordBatch) -> DfResult<Self> {
        Ok(Self {
            batch: Some(batch),
            skipped: Vec::new(),
        })
    }

    /// The outcomes of consecutive calls as one: their rows in order, their skips.
    pub fn concat(
        schema: &datafusion::arrow::datatypes::SchemaRef,
        parts: Vec<Done>,
    ) -> DfResult<Self> {
        let (mut batches, mut skipped) = (Vec::new(), Vec::new());
        for d in parts {
            batches.extend(d.batch);
            skipped.extend(d.skipped);
        }
        let batch = match batches.len() {
            0 => None,
            1 => batches.pop(),
            _ => Some(datafusion::arrow::compute::concat_batches(
                schema, &batches,
            )?),
        };
        Ok(Self { batch, skipped })
    }

    pub fn dropped(skipped: Vec<String>) -> DfResult<Self> {
        Ok(Self {
            batch: None,
            skipped,
        })
    }
}
