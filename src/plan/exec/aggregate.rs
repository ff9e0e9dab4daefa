//! `AggregateExec`: one call per group of rows with equal `partition_by`
//! values; zero or more output rows per group (the group's key columns plus the
//! UDF's value).
//!
//! Guarantees: the planner is told this operator needs one partition sorted by
//! the keys, so every group is contiguous and reaches exactly one call; groups
//! are cut across input batch boundaries; only one group per running call is
//! held in memory; up to `parallel` groups are processed at once. With
//! `ordered = true` groups are emitted in key order and the output declares
//! the input's ordering of the key columns; with `ordered = false` each group
//! is emitted as soon as its call finishes (the input still has to be sorted,
//! to cut the groups) and no order is declared.
//!
//! `on_error` (see `on_error.rs`): a failed group (its call erred, panicked or
//! returned a wrong value) fails the query naming the UDF, the group's first
//! row and its file (`fail`), emits one row with the group's keys and a null
//! output (`null`), or is dropped with every one of its input rows listed in
//! the skip list (`skip`).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::{concat_batches, partition};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexRequirement, OrderingRequirements, PhysicalSortRequirement};
use datafusion::physical_plan::Distribution;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use udfchain_udfs::Aggregator;

use crate::plan::exec::on_error::null_output;
use crate::plan::exec::output_stream::Done;
use crate::plan::exec::udf_call::UdfCall;
use crate::plan::exec::udf_exec::{Shape, UdfExec, UdfKind};
use crate::plan::logical::Udf;
use crate::plan::row_slices::{append_column, repeat_row};
use crate::settings::OnError;

/// The agg kind: one call per group of rows with equal keys.
#[derive(Debug, Clone)]
pub struct Aggregate {
    /// Key columns: (index in the input schema, name).
    pub keys: Vec<(usize, String)>,
}

/// The `AggregateExec` of plans: a UDF operator of the agg kind.
pub type AggregateExec = UdfExec<Aggregate>;

impl UdfKind for Aggregate {
    type Udf = dyn Aggregator;
    const NAME: &'static str = "AggregateExec";

    fn output_name(udf: &dyn Aggregator) -> &str {
        udf.signature().output.name()
    }

    fn udf(&self, udf: &Arc<dyn Aggregator>) -> Udf {
        Udf::Agg {
            udf: Arc::clone(udf),
            partition_by: self.keys.iter().map(|(_, k)| k.clone()).collect(),
        }
    }

    fn shape(&self) -> Shape {
        Shape::Group(self.keys.iter().map(|(i, _)| *i).collect())
    }

    fn fmt_settings(&self, call: &UdfCall, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<_> = self.keys.iter().map(|(_, n)| n.as_str()).collect();
        write!(
            f,
            ", partition_by=[{}], parallel={}",
            keys.join(", "),
            call.parallel
        )
    }

    /// Rows become groups, so no input order is kept row for row (under
    /// `ordered = true` the key order is declared through the plan properties).
    fn maintains_input_order(&self, _call: &UdfCall) -> bool {
        false
    }

    fn required_input_distribution(&self) -> Distribution {
        Distribution::SinglePartition
    }

    fn required_input_ordering(&self) -> Option<OrderingRequirements> {
        let reqs = self
            .keys
            .iter()
            .map(|(i, name)| PhysicalSortRequirement::new(Arc::new(Column::new(name, *i)), None));
        LexRequirement::new(reqs).map(OrderingRequirements::new)
    }

    fn execute(
        exec: &AggregateExec,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let (input, part, baseline) = exec.start(partition, &ctx)?;
        let key_idx: Vec<usize> = exec.kind.keys.iter().map(|(i, _)| *i).collect();
        let mut seen = 0u64;
        let out = part.clone();
        let calls = groups(input, key_idx.clone())?
            .map_ok(move |g| {
                let base = seen;
                seen += g.num_rows() as u64;
                (base, g)
            })
            .map(move |group| {
                let (part, key_idx) = (part.clone(), key_idx.clone());
                async move {
                    let (base, group) = group?;
                    let params = part.call.params_batch(&group)?;
                    let udf = Arc::clone(&part.udf);
                    let result = part
                        .call
                        .run(Arc::clone(&part.source), async move {
                            udf.aggregate(params).await
                        })
                        .await;
                    part.call.release(&part.local, &group);
                    let values: ArrayRef = match result {
                        Ok(v) => v,
                        Err(f) => match part.call.on_error_for(&f) {
                            OnError::Fail => return Err(part.call.locate(f, &group, base)),
                            OnError::Skip => {
                                return Done::dropped(part.skips(
                                    &group,
                                    base,
                                    0..group.num_rows(),
                                ));
                            }
                            OnError::Null => null_output(&part.schema, 1),
                        },
                    };
                    if values.is_empty() {
                        return Done::dropped(Vec::new());
                    }
                    let keys = group.project(&key_idx)?;
                    // No keys (one group of every row): a batch of no column
                    // says its row count itself.
                    let repeated = RecordBatch::try_new_with_options(
                        keys.schema(),
                        repeat_row(&keys, 0, values.len())?,
                        &RecordBatchOptions::new().with_row_count(Some(values.len())),
                    )?;
                    Done::rows(append_column(&part.schema, &repeated, values)?)
                }
            });
        Ok(out.output(calls, baseline))
    }
}

/// Cuts a key-sorted stream into one batch per group.
fn groups(
    input: SendableRecordBatchStream,
    keys: Vec<usize>,
) -> DfResult<BoxStream<'static, DfResult<RecordBatch>>> {
    let schema = input.schema();
    let sort_fields = keys
        .iter()
        .map(|&i| SortField::new(schema.field(i).data_type().clone()))
        .collect();
    let state = Grouper {
        input,
        schema,
        converter: RowConverter::new(sort_fields)?,
        keys,
        current: None,
        pieces: Vec::new(),
        ready: VecDeque::new(),
        done: false,
    };
    Ok(futures::stream::unfold(state, |mut s| async move {
        let next = s.next().await?;
        Some((next, s))
    })
    .boxed())
}

struct Grouper {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    converter: RowConverter,
    keys: Vec<usize>,
    current: Option<OwnedRow>,
    pieces: Vec<RecordBatch>,
    ready: VecDeque<RecordBatch>,
    done: bool,
}

impl Grouper {
    async fn next(&mut self) -> Option<DfResult<RecordBatch>> {
        loop {
            if let Some(g) = self.ready.pop_front() {
                return Some(Ok(g));
            }
            if self.done {
                return None;
            }
            let step = match self.input.next().await {
                Some(Ok(batch)) => self.split(&batch),
                Some(Err(e)) => Err(e),
                None => {
                    self.done = true;
                    self.flush()
                }
            };
            if let Err(e) = step {
                self.done = true;
                return Some(Err(e));
            }
        }
    }

    fn flush(&mut self) -> DfResult<()> {
        if !self.pieces.is_empty() {
            let group = concat_batches(&self.schema, &self.pieces)?;
            self.pieces.clear();
            self.ready.push_back(group);
        }
        Ok(())
    }

    fn split(&mut self, batch: &RecordBatch) -> DfResult<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.keys.is_empty() {
            self.pieces.push(batch.clone());
            return Ok(());
        }
        let cols: Vec<ArrayRef> = self
            .keys
            .iter()
            .map(|&i| Arc::clone(batch.column(i)))
            .collect();
        let rows = self.converter.convert_columns(&cols)?;
        for range in partition(&cols)?.ranges() {
            let key = rows.row(range.start);
            if self.current.as_ref().is_none_or(|k| k.row() != key) {
                self.flush()?;
                self.current = Some(key.owned());
            }
            self.pieces
                .push(batch.slice(range.start, range.end - range.start));
        }
        Ok(())
    }
}
