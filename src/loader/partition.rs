//! One partition of an epoch plan, materialised: its rows read by position,
//! shuffled inside when the plan shuffles, cut to this consumer's share, and
//! with a binary column of each `File`'s bytes when asked.
//!
//! Guarantees:
//! - the rows are exactly the consumer's share of the source partition, in
//!   dataset order or in the (seed, epoch, partition) permutation;
//! - bytes are downloaded by a chain over the partition's rows with one map
//!   UDF, so they go through udfchain's prefetch machinery under the
//!   session's settings (`prefetch`, `max_connections`, retries, the shared
//!   cache when `cache = true`); the rows keep their order whatever the plan
//!   does (a hidden row number sorts them back);
//! - `with_images` decodes the files the same way, on rayon's pool, into one
//!   fixed-shape tensor column (see `udfs::builtins::image::tensor`);
//! - with shuffle, each consumer reads its source partition's rows from the
//!   local Parquet (the permutation spans the whole partition) but downloads
//!   bytes for its own share only;
//! - a partition is handed over whole or not at all: a failure part-way (a
//!   GET that fails after the prefetch's own retries, a store that goes away)
//!   drops what was read and fetches the whole partition again, up to
//!   [`ATTEMPTS`] times, so no row is delivered twice or dropped; only an
//!   error that may heal ([`Error::may_heal`]) is tried again: a missing
//!   object, a refused request or a UDF's own error fails at once;
//! - the partition's bytes are charged to the session's memory pool for as
//!   long as its [`PartitionData`] lives.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, AsArray, BinaryBuilder, RecordBatch, UInt64Array};
use datafusion::arrow::compute::{concat_batches, sort_to_indices, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::logical_expr::LogicalPlanBuilder;
use udfchain_udfs::builtins::image::{TensorShape, decode_to_tensor};
use udfchain_udfs::{CallError, File, Mapper, Signature, UdfError, decode_rows};

use crate::Udf;

use super::epoch_plan::{partitions, permutation, seed_of, share};
use super::parquet_rows::Resolved;
use super::{EpochPlan, PartitionData};
use crate::chain::Chain;
use crate::error::{Error, Result};
use crate::runtime::blocking;
use crate::session::Session;
use crate::settings::{OnError, Settings};

/// How many times a partition is fetched before its error is returned.
pub(crate) const ATTEMPTS: usize = 4;

/// The hidden row-number column that keeps a partition's order through the bytes chain.
const ROW: &str = "__udfchain_loader_row";

/// What `fetch` needs of a plan, fixed when it was made.
#[derive(Debug)]
pub(crate) struct Spec {
    pub(crate) session: Arc<Session>,
    pub(crate) source: Arc<Resolved>,
    pub(crate) partition_rows: usize,
    pub(crate) shuffle: Option<u64>,
    pub(crate) consumers: usize,
    pub(crate) consumer: usize,
    /// Indices into the source schema of the columns read.
    pub(crate) read: Vec<usize>,
    /// `(file column, output column)`.
    pub(crate) bytes: Option<(String, String)>,
    /// `(file column, output column, shape)`.
    pub(crate) images: Option<(String, String, TensorShape)>,
    /// The output columns, by name, in order (bytes column last).
    pub(crate) output: SchemaRef,
}

/// Fetches partition `index` of `plan`, retrying a failed attempt as a whole.
pub(crate) async fn fetch(plan: &EpochPlan, index: usize) -> Result<PartitionData> {
    let Some(info) = plan.partitions.get(index) else {
        return Err(Error::Setting {
            name: "partition".into(),
            value: index.to_string(),
            reason: format!(
                "must be below the plan's {} partitions",
                plan.partitions.len()
            ),
        });
    };
    let spec = &plan.spec;
    let mut attempt = 1;
    let batches = loop {
        match fetch_once(spec, plan.epoch, info.source_partition).await {
            Ok(b) => break b,
            Err(e) if attempt < ATTEMPTS && e.may_heal() => {
                tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    let reservation = MemoryConsumer::new(format!("loader partition {}", info.source_partition))
        .register(&spec.session.context().runtime_env().memory_pool);
    reservation.try_grow(bytes)?;
    Ok(PartitionData {
        batches,
        bytes,
        _reservation: reservation,
    })
}

async fn fetch_once(spec: &Spec, epoch: u64, source_partition: usize) -> Result<Vec<RecordBatch>> {
    let range = partitions(spec.source.rows(), spec.partition_rows)
        .get(source_partition)
        .cloned()
        .ok_or_else(|| Error::internal(format!("no source partition {source_partition}")))?;
    let len = range.len();
    let mine = share(len, spec.consumers, spec.consumer);
    let (start, end, take): (usize, usize, Option<Vec<usize>>) = match spec.shuffle {
        // Without shuffle the share is a run of rows in dataset order: read only it.
        None => (range.start + mine.start, range.start + mine.end, None),
        // With shuffle the share is a run of the partition's permutation: read
        // the partition and take those rows, in that order.
        Some(seed) => {
            let perm = permutation(len, seed_of(seed, epoch, source_partition as u64));
            (range.start, range.end, Some(perm[mine].to_vec()))
        }
    };
    if start == end || take.as_ref().is_some_and(|t| t.is_empty()) {
        return Ok(Vec::new());
    }
    let source = Arc::clone(&spec.source);
    let read = spec.read.clone();
    let batches = blocking(move || source.read(start, end, &read)).await?;
    let read_schema = Arc::new(spec.source.schema().project(&spec.read).map_err(df)?);
    let mut batch = concat_batches(&read_schema, &batches).map_err(df)?;
    drop(batches);
    if let Some(rows) = take {
        let idx = UInt64Array::from_iter_values(rows.iter().map(|&r| r as u64));
        batch = take_record_batch(&batch, &idx).map_err(df)?;
    }
    let batch = match &spec.bytes {
        None => batch,
        Some((file, out)) => {
            let mapper = Arc::new(BytesMapper {
                signature: file_signature("bytes", file, Field::new(out, DataType::Binary, true)),
            });
            with_column(&spec.session, batch, mapper).await?
        }
    };
    let batch = match &spec.images {
        None => batch,
        Some((file, out, shape)) => {
            let mapper = Arc::new(ImagesMapper {
                signature: file_signature("images", file, shape.field(out)),
                shape: *shape,
                max_pixels: spec.session.settings().get_max_image_pixels(),
            });
            with_column(&spec.session, batch, mapper).await?
        }
    };
    let columns: Vec<usize> = spec
        .output
        .fields()
        .iter()
        .map(|f| batch.schema().index_of(f.name()).map_err(df))
        .collect::<Result<_>>()?;
    let batch = batch.project(&columns).map_err(df)?;
    Ok(vec![batch])
}

/// The signature of a loader UDF reading column `file`, writing `output`.
fn file_signature(what: &str, file: &str, output: Field) -> Signature {
    Signature {
        name: format!("loader {what} of {file}"),
        params: vec![file.to_string()],
        input: Some(File::data_type()),
        output,
    }
}

/// Adds `mapper`'s output column (made of each row's file) through a
/// one-UDF chain, so the files come through the engine's prefetch.
async fn with_column(
    session: &Arc<Session>,
    batch: RecordBatch,
    mapper: Arc<dyn Mapper>,
) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let mut fields: Vec<Arc<Field>> = batch.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(ROW, DataType::UInt64, false)));
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(UInt64Array::from_iter_values(0..n as u64)));
    let numbered = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(df)?;
    let table = MemTable::try_new(numbered.schema(), vec![vec![numbered]])?;
    let plan = LogicalPlanBuilder::scan(
        "loader_partition",
        provider_as_source(Arc::new(table)),
        None,
    )?
    .build()?;
    let batches = Chain::from_plan(Arc::clone(session), plan)
        .settings(
            Settings::new()
                .ordered(true)
                .on_error(OnError::Fail)
                // Each call reads its file, then decodes: two per core keep
                // the cores busy while calls read (as SQL's decode nodes).
                .parallel(2 * crate::runtime::cores()),
        )
        .udf(Udf::Map(mapper))
        .collect()
        .await?;
    let Some(first) = batches.first() else {
        return Err(Error::internal("the loader's file chain returned no batch"));
    };
    let all = if batches.len() == 1 {
        batches[0].clone()
    } else {
        concat_batches(&first.schema(), &batches).map_err(df)?
    };
    if all.num_rows() != n {
        return Err(Error::internal(format!(
            "the loader's file chain returned {} rows for {n}",
            all.num_rows()
        )));
    }
    let rows = all.column(all.schema().index_of(ROW).map_err(df)?);
    // Ordered prefetch keeps the order: then no copy is needed.
    let in_order = rows
        .as_primitive_opt::<UInt64Type>()
        .is_some_and(|r| r.values().iter().enumerate().all(|(i, &v)| v == i as u64));
    if in_order {
        return Ok(all);
    }
    let order = sort_to_indices(rows, None, None).map_err(df)?;
    take_record_batch(&all, &order).map_err(df)
}

/// The map UDF that reads a `File`'s bytes (from the prefetched local copy).
#[derive(Debug)]
struct BytesMapper {
    signature: Signature,
}

#[async_trait]
impl Mapper for BytesMapper {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    async fn map(&self, input: RecordBatch) -> std::result::Result<ArrayRef, CallError> {
        let files: Vec<Option<File>> = decode_rows(&input, &self.signature.params)?;
        let mut out = BinaryBuilder::new();
        for (row, file) in files.into_iter().enumerate() {
            match file {
                Some(f) => out.append_value(f.read().await.map_err(|e| CallError::at_row(row, e))?),
                None => out.append_null(),
            }
        }
        Ok(Arc::new(out.finish()))
    }
}

fn df(e: impl Into<datafusion::error::DataFusionError>) -> Error {
    Error::from(e.into())
}

/// The map UDF that decodes each `File` into a block of a tensor column
/// (the files read from their prefetched copies, decoded on rayon's pool).
#[derive(Debug)]
struct ImagesMapper {
    signature: Signature,
    shape: TensorShape,
    /// The session's `max_image_pixels`.
    max_pixels: u64,
}

#[async_trait]
impl Mapper for ImagesMapper {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    async fn map(&self, input: RecordBatch) -> std::result::Result<ArrayRef, CallError> {
        let files: Vec<Option<File>> = decode_rows(&input, &self.signature.params)?;
        let mut encoded = Vec::with_capacity(files.len());
        for (row, file) in files.iter().enumerate() {
            encoded.push(match file {
                Some(f) => Some(f.read().await.map_err(|e| CallError::at_row(row, e))?),
                None => None,
            });
        }
        let rows: Vec<Option<&[u8]>> = encoded.iter().map(|b| b.as_deref()).collect();
        decode_to_tensor(&rows, &self.shape, self.max_pixels).map_err(|(row, e)| {
            let e = match files.get(row).cloned().flatten() {
                Some(f) => UdfError::Read {
                    url: f.url(),
                    source: Box::new(e),
                },
                None => e,
            };
            CallError::at_row(row, e)
        })
    }
}
