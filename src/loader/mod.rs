//! [`Loader`]: a dataset or a chain served to a training loop, partition by
//! partition, with the next partitions fetched while the trainer works.
//!
//! The rows are cut into partitions of at most `partition_rows` rows in
//! dataset order (the unit of prefetch and of shuffling). An epoch's
//! [`EpochPlan`] lists, in reading order, the partitions one (rank, worker)
//! reads; [`Loader::fetch`] materialises one of them; [`Loader::epoch`] is the
//! trainer's stream of batches, `prefetch_partitions` partitions ahead.
//!
//! Guarantees (one file per concept: `epoch_plan.rs` the arithmetic, `parquet_rows.rs`
//! reading rows by position, `partition.rs` one partition, `stream.rs` the epoch):
//! - every row of the source goes to exactly one (rank, worker) per epoch:
//!   each partition's rows are split among the `world_size * max(num_workers, 1)`
//!   consumers Modyn's way (consumer `rank * max(num_workers, 1) + worker` gets
//!   a contiguous run of the partition's row order, the first `n % w`
//!   consumers one row more; an empty share is valid and is fetched as no rows);
//!   every consumer sees every partition, in the same order;
//! - without `shuffle`, rows come in dataset order; with `shuffle(seed)`, the
//!   partition order and the row order inside each partition are permutations
//!   drawn from (seed, epoch): a new one every epoch, the same one for the same
//!   (seed, epoch) in any process;
//! - a partition is fetched whole or again: a storage failure part-way through
//!   never delivers a row twice nor drops one;
//! - while the trainer reads partition i, partitions i+1..=i+k are fetched
//!   (`prefetch_partitions(k)`), at most `parallel_requests(p)` at once, and at
//!   most k + 1 partitions are held, each charged to the session's memory pool.
//!
//! A chain source is run once, on the first plan, and spilled to a temporary
//! Parquet file kept as long as the loader (a dataset version is read in place).
//! Its latest version, likewise, is fixed by the first plan.

pub(crate) mod ahead;
mod epoch_plan;
mod parquet_rows;
mod partition;
mod stream;

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::execution::memory_pool::MemoryReservation;
use futures::stream::BoxStream;
use tokio::sync::OnceCell;
use udfchain_udfs::File;

use crate::chain::Chain;
use crate::error::{Error, Result};
use crate::session::Session;
use parquet_rows::Resolved;
use partition::Spec;

/// Rows per partition unless [`Loader::partition_rows`] says otherwise.
pub const DEFAULT_PARTITION_ROWS: usize = 1000;
/// Rows per batch unless [`Loader::batch_size`] says otherwise.
pub const DEFAULT_BATCH_SIZE: usize = 64;

#[derive(Clone)]
enum Rows {
    Dataset { name: String, version: Option<u32> },
    Chain(Box<Chain>),
}

/// A training loader over a dataset or a chain. Building is cheap and never
/// fails; settings are checked by [`plan`](Self::plan) and
/// [`epoch`](Self::epoch). Clones share the resolved source (a spilled chain
/// runs once for all of them).
#[derive(Clone)]
#[must_use = "a loader does nothing until an epoch is planned or streamed"]
pub struct Loader {
    rows: Rows,
    session: Option<Arc<Session>>,
    partition_rows: usize,
    prefetch: usize,
    parallel: usize,
    bytes: Option<(String, String)>,
    images: Option<Images>,
    batch_size: usize,
    drop_last: bool,
    columns: Option<Vec<String>>,
    shuffle: Option<u64>,
    shard: (usize, usize),
    worker: (usize, usize),
    resolved: Arc<OnceCell<Arc<Resolved>>>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("partition_rows", &self.partition_rows)
            .field("prefetch_partitions", &self.prefetch)
            .field("parallel_requests", &self.parallel)
            .field("batch_size", &self.batch_size)
            .field("shuffle", &self.shuffle)
            .field("shard", &self.shard)
            .field("worker", &self.worker)
            .finish()
    }
}

/// The partitions one (rank, worker) reads in an epoch, in reading order.
#[derive(Clone)]
pub struct EpochPlan {
    /// The epoch this plan is for.
    pub epoch: u64,
    /// The output columns (then the bytes column when `with_bytes`, then the
    /// images column when `with_images`).
    pub schema: SchemaRef,
    /// The partitions in reading order.
    pub partitions: Vec<PartitionInfo>,
    spec: Arc<Spec>,
}

impl std::fmt::Debug for EpochPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochPlan")
            .field("epoch", &self.epoch)
            .field("schema", &self.schema)
            .field("partitions", &self.partitions)
            .finish()
    }
}

/// One partition of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Its position in this epoch's reading order.
    pub index: usize,
    /// Its number in dataset order (rows `source_partition * partition_rows ..`).
    pub source_partition: usize,
    /// The rows this (rank, worker) gets of it (0 is valid).
    pub rows: usize,
}

/// `with_images`: the File column, the output column, `(width, height)` and the mode.
#[derive(Clone, Debug)]
struct Images {
    file: String,
    out: String,
    size: (u32, u32),
    mode: udfchain_udfs::builtins::image::Mode,
}

impl Images {
    fn shape(&self) -> Result<udfchain_udfs::builtins::image::TensorShape> {
        udfchain_udfs::builtins::image::TensorShape::new(self.size.0, self.size.1, self.mode)
            .map_err(|e| Error::Setting {
                name: "with_images size".into(),
                value: format!("{}x{}", self.size.0, self.size.1),
                reason: e.to_string(),
            })
    }
}

/// One partition's rows, materialised; its memory stays charged to the
/// session's memory pool until this is dropped.
#[derive(Debug)]
pub struct PartitionData {
    /// The partition's rows.
    pub batches: Vec<RecordBatch>,
    /// The Arrow memory of `batches` (what is charged).
    pub bytes: usize,
    _reservation: MemoryReservation,
}

impl Loader {
    fn new(rows: Rows, session: Option<Arc<Session>>) -> Self {
        Self {
            rows,
            session,
            partition_rows: DEFAULT_PARTITION_ROWS,
            prefetch: 1,
            parallel: 1,
            bytes: None,
            images: None,
            batch_size: DEFAULT_BATCH_SIZE,
            drop_last: false,
            columns: None,
            shuffle: None,
            shard: (0, 1),
            worker: (0, 0),
            resolved: Arc::new(OnceCell::new()),
        }
    }

    /// The latest version of dataset `name` (fixed by the first plan).
    pub fn from_dataset(name: &str) -> Self {
        Self::new(
            Rows::Dataset {
                name: name.to_string(),
                version: None,
            },
            None,
        )
    }

    /// Version `version` of dataset `name`.
    pub fn from_dataset_version(name: &str, version: u32) -> Self {
        Self::new(
            Rows::Dataset {
                name: name.to_string(),
                version: Some(version),
            },
            None,
        )
    }

    /// The rows of `chain`, run once (on the first plan) in the chain's session
    /// and spilled to a temporary Parquet file.
    pub fn from_chain(chain: Chain) -> Self {
        let session = Arc::clone(chain.session());
        Self::new(Rows::Chain(Box::new(chain)), Some(session))
    }

    /// Reads in `session` (its catalog root, stores, settings, memory pool)
    /// instead of [`Session::global`] or the chain's session.
    pub fn in_session(mut self, session: Arc<Session>) -> Self {
        self.session = Some(session);
        self.resolved = Arc::new(OnceCell::new());
        self
    }

    /// Partitions of at most `n` rows (default [`DEFAULT_PARTITION_ROWS`]); 0 is an error.
    pub fn partition_rows(mut self, n: usize) -> Self {
        self.partition_rows = n;
        self
    }

    /// Partitions fetched ahead of the one being read (default 1; 0 = on demand).
    pub fn prefetch_partitions(mut self, k: usize) -> Self {
        self.prefetch = k;
        self
    }

    /// Partitions fetched at once (default 1); 0 is an error.
    pub fn parallel_requests(mut self, p: usize) -> Self {
        self.parallel = p;
        self
    }

    /// Adds column `out_col`: the bytes of the `File` in column `file_col`
    /// (null for a null file), downloaded under the session's settings.
    pub fn with_bytes(mut self, file_col: &str, out_col: &str) -> Self {
        self.bytes = Some((file_col.to_string(), out_col.to_string()));
        self
    }

    /// Adds column `out_col`: each `File` of `file_col` decoded, converted to
    /// `mode` and resized to `size = (width, height)` (bilinear, aspect not
    /// kept) on the engine's threads while the partition is fetched, `k`
    /// partitions ahead of the trainer, as one `H x W x C` uint8 block per row:
    /// an Arrow fixed-shape tensor (`arrow.fixed_shape_tensor`, shape `[H, W,
    /// C]`) that pyarrow and numpy read as one `(N, H, W, C)` array, no copy.
    /// A file that does not decode fails the partition naming the file; a
    /// null file is a null row. Sizes are 1 to 65,535 a side.
    pub fn with_images(
        mut self,
        file_col: &str,
        out_col: &str,
        size: (u32, u32),
        mode: udfchain_udfs::builtins::image::Mode,
    ) -> Self {
        self.images = Some(Images {
            file: file_col.to_string(),
            out: out_col.to_string(),
            size,
            mode,
        });
        self
    }

    /// Rows per batch of [`epoch`](Self::epoch) (default [`DEFAULT_BATCH_SIZE`]); 0 is an error.
    pub fn batch_size(mut self, b: usize) -> Self {
        self.batch_size = b;
        self
    }

    /// Drops the epoch's last batch when it has fewer than `batch_size` rows.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }

    /// Keeps only these columns, in this order (default: all); the bytes
    /// column is added after them.
    pub fn columns<I, S>(mut self, cols: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.columns = Some(cols.into_iter().map(Into::into).collect());
        self
    }

    /// Shuffles the partition order and the rows inside each partition, a new
    /// permutation every epoch, deterministic for (seed, epoch).
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.shuffle = Some(seed);
        self
    }

    /// Reads the share of `rank` among `world_size` distributed trainers.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Self {
        self.shard = (rank, world_size);
        self
    }

    /// Reads the share of data-loader worker `id` of `num_workers` within
    /// this rank's; `num_workers = 0` is no split (loading in the main process).
    pub fn worker(mut self, id: usize, num_workers: usize) -> Self {
        self.worker = (id, num_workers);
        self
    }

    fn session(&self) -> Arc<Session> {
        self.session.clone().unwrap_or_else(Session::global)
    }

    fn check(&self) -> Result<()> {
        let bad = |name: &str, value: usize, reason: String| {
            Err(Error::Setting {
                name: name.to_string(),
                value: value.to_string(),
                reason,
            })
        };
        let (rank, world) = self.shard;
        let (worker, workers) = self.worker;
        if self.partition_rows == 0 {
            return bad("partition_rows", 0, "must be at least 1".into());
        }
        if self.batch_size == 0 {
            return bad("batch_size", 0, "must be at least 1".into());
        }
        if self.parallel == 0 {
            return bad("parallel_requests", 0, "must be at least 1".into());
        }
        if world == 0 {
            return bad("world_size", 0, "must be at least 1".into());
        }
        if rank >= world {
            return bad("rank", rank, format!("must be below world_size {world}"));
        }
        if workers > 0 && worker >= workers {
            return bad(
                "worker",
                worker,
                format!("must be below num_workers {workers}"),
            );
        }
        if workers == 0 && worker != 0 {
            return bad("worker", worker, "must be 0 when num_workers is 0".into());
        }
        Ok(())
    }

    async fn resolve(&self, session: &Arc<Session>) -> Result<Arc<Resolved>> {
        let r = self
            .resolved
            .get_or_try_init(|| async {
                let r = match &self.rows {
                    Rows::Dataset { name, version } => {
                        Resolved::dataset(session, name, *version).await?
                    }
                    Rows::Chain(chain) => {
                        let chain = match &self.session {
                            Some(s) => chain.as_ref().clone().in_session(Arc::clone(s)),
                            None => chain.as_ref().clone(),
                        };
                        Resolved::chain(&chain).await?
                    }
                };
                Ok::<_, Error>(Arc::new(r))
            })
            .await?;
        Ok(Arc::clone(r))
    }

    /// The partitions this (rank, worker) reads in `epoch`, in the order the
    /// trainer should read them (shuffled if shuffle is on). Checks every
    /// setting: a zero size, a rank or worker out of range, an unknown column,
    /// a bytes column over something that is not a `File` or whose name is
    /// taken are [`Error::Setting`] errors. The first plan resolves the source
    /// (a chain runs here).
    ///
    /// # Cancel safety
    /// Dropping the future stops the resolution; a later call starts it again.
    pub async fn plan(&self, epoch: u64) -> Result<EpochPlan> {
        self.check()?;
        let session = self.session();
        let source = self.resolve(&session).await?;
        let schema = source.schema();
        let unknown = |name: &str, what: &str| Error::Setting {
            name: what.to_string(),
            value: name.to_string(),
            reason: format!(
                "{name:?} is not a column of the rows (they have {})",
                schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let out_names: Vec<String> = match &self.columns {
            Some(c) => c.clone(),
            None => schema.fields().iter().map(|f| f.name().clone()).collect(),
        };
        let mut read = Vec::new();
        for name in &out_names {
            let i = schema
                .index_of(name)
                .map_err(|_| unknown(name, "columns"))?;
            if read.contains(&i) {
                return Err(Error::Setting {
                    name: "columns".into(),
                    value: name.clone(),
                    reason: "is listed twice".into(),
                });
            }
            read.push(i);
        }
        let mut fields: Vec<Field> = read.iter().map(|&i| schema.field(i).clone()).collect();
        // A column made of a File column's files: its File column must be
        // one, and its name must be free.
        let mut added = |file: &str, out: &str, field: Field, what: &str| -> Result<()> {
            let i = schema
                .index_of(file)
                .map_err(|_| unknown(file, &format!("{what} file column")))?;
            if !File::is_file_type(schema.field(i).data_type()) {
                return Err(Error::Setting {
                    name: format!("{what} file column"),
                    value: file.to_string(),
                    reason: format!("holds {}, not a File", schema.field(i).data_type()),
                });
            }
            if out_names.iter().any(|n| n == out)
                || out == file
                || fields.iter().any(|f| f.name() == out)
            {
                return Err(Error::Setting {
                    name: format!("{what} output column"),
                    value: out.to_string(),
                    reason: "is already a column of the rows".into(),
                });
            }
            if !read.contains(&i) {
                read.push(i);
            }
            fields.push(field);
            Ok(())
        };
        if let Some((file, out)) = &self.bytes {
            added(
                file,
                out,
                Field::new(out, DataType::Binary, true),
                "with_bytes",
            )?;
        }
        let images = match &self.images {
            None => None,
            Some(im) => {
                let shape = im.shape()?;
                added(&im.file, &im.out, shape.field(&im.out), "with_images")?;
                Some((im.file.clone(), im.out.clone(), shape))
            }
        };
        let output = Arc::new(Schema::new(fields));
        let (rank, world) = self.shard;
        let (worker, workers) = self.worker;
        let consumers = world * workers.max(1);
        let consumer = rank * workers.max(1) + worker;
        let ranges = epoch_plan::partitions(source.rows(), self.partition_rows);
        let order: Vec<usize> = match self.shuffle {
            None => (0..ranges.len()).collect(),
            Some(seed) => {
                epoch_plan::permutation(ranges.len(), epoch_plan::seed_of(seed, epoch, u64::MAX))
            }
        };
        let partitions = order
            .into_iter()
            .enumerate()
            .map(|(index, j)| PartitionInfo {
                index,
                source_partition: j,
                rows: epoch_plan::share(ranges[j].len(), consumers, consumer).len(),
            })
            .collect();
        Ok(EpochPlan {
            epoch,
            schema: Arc::clone(&output),
            partitions,
            spec: Arc::new(Spec {
                session,
                source,
                partition_rows: self.partition_rows,
                shuffle: self.shuffle,
                consumers,
                consumer,
                read,
                bytes: self.bytes.clone(),
                images,
                output,
            }),
        })
    }

    /// Partition `index` of `plan`, fully materialised: rows shuffled inside
    /// if the plan shuffles, the bytes column added if `with_bytes`. A storage
    /// failure part-way is retried by fetching the whole partition again (no
    /// row twice, none dropped). The data stays charged to the session's
    /// memory pool while the [`PartitionData`] lives. The plan's settings
    /// apply, whatever this loader's are now.
    ///
    /// # Cancel safety
    /// Dropping the future aborts the partition's downloads; nothing is kept.
    pub async fn fetch(&self, plan: &EpochPlan, index: usize) -> Result<PartitionData> {
        partition::fetch(plan, index).await
    }

    /// The trainer's stream: batches of `batch_size` rows over the whole
    /// epoch, in plan order. Batches straddle partitions, shuffled or not
    /// (only the epoch's last batch may be short, and `drop_last` drops it).
    /// While the trainer reads partition i, partitions i+1..=i+k are fetched,
    /// `p` at once; at most k + 1 partitions are held, charged to the
    /// session's memory pool. Runs its fetches on the current tokio runtime.
    ///
    /// # Cancel safety
    /// Dropping the stream (or this future) aborts every fetch in flight and
    /// frees the partitions held.
    pub async fn epoch(&self, epoch: u64) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        let plan = self.plan(epoch).await?;
        stream::epoch_stream(
            plan,
            self.prefetch,
            self.parallel,
            self.batch_size,
            self.drop_last,
        )
    }
}
