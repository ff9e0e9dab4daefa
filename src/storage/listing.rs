//! `StorageTable` / `ListingExec`: the objects under a URI as rows with one
//! `file` struct column.
//!
//! Guarantees: listing is streamed (rows flow as the store returns pages, so a
//! `limit` above stops the listing early); `limit` pushed into the scan stops it
//! after that many files; the glob filters paths relative to the listed prefix;
//! the next page is requested while the second half of the current one is consumed;
//! a file's `path` is its key below the prefix verbatim, and its `etag` and
//! `version` are what later reads are pinned to; keys come in lexicographic
//! order on every store (S3, GCS, Azure and the memory store list so, local
//! directories are walked so by `local_listing`, an HTTP server's PROPFIND
//! answer is sorted).
//!
//! Metrics (read while the scan runs, e.g. by the progress display):
//! `files_listed` counts the files the listing has produced (after the glob),
//! and the gauge `listing_done` turns 1 once the listing has ended without
//! error (every file listed, or `limit` reached), so `files_listed` is then
//! the total.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::object_store::ObjectMeta;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::stream::RecordBatchReceiverStream;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::stream::{self, StreamExt, TryStreamExt};
use globset::{Glob, GlobMatcher};
use udfchain_udfs::{File, encode_column};

use super::{Location, open_store};
use crate::error::Error;
use crate::util::exec_boilerplate::exec_boilerplate;

/// Rows per listing batch: small enough that UDFs downstream start early.
const LIST_BATCH: usize = 256;

/// Listing batches read ahead of the consumer, besides the one being filled: with
/// S3's 1,000-key pages the next page is requested once the consumer has taken
/// about 500 rows (1,000 - 2 x 256), so a page's round trip overlaps the second
/// half of the page before it, and a query that stops early (a `limit` above a
/// UDF, which is not pushed into the scan) stops before a second request.
const LIST_AHEAD: usize = 1;

/// The schema of a listing: one non-null `file` struct column.
pub fn file_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "file",
        File::data_type(),
        false,
    )]))
}

/// Lists the objects under a URI. Cheap to create: nothing is read until a scan runs.
#[derive(Debug, Clone)]
pub struct StorageTable {
    loc: Location,
    recursive: bool,
    glob: Option<String>,
    options: BTreeMap<String, String>,
}

impl StorageTable {
    pub fn try_new(
        uri: &str,
        recursive: bool,
        glob: Option<String>,
        options: BTreeMap<String, String>,
    ) -> Result<Self, Error> {
        if let Some(g) = &glob {
            Glob::new(g).map_err(|e| Error::plan(format!("invalid glob {g:?}: {e}")))?;
        }
        Ok(Self {
            loc: Location::parse(uri)?,
            recursive,
            glob,
            options,
        })
    }

    pub fn location(&self) -> &Location {
        &self.loc
    }

    pub fn recursive(&self) -> bool {
        self.recursive
    }

    pub fn glob(&self) -> Option<&str> {
        self.glob.as_deref()
    }

    /// The storage options its scans open the store with.
    pub fn options(&self) -> &BTreeMap<String, String> {
        &self.options
    }
}

#[async_trait]
impl TableProvider for StorageTable {
    fn schema(&self) -> SchemaRef {
        file_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        // Open the store now so a bad URI or credentials fail at planning time.
        open_store(state.runtime_env(), &self.loc, &self.options).map_err(Error::into_df)?;
        let glob = match &self.glob {
            Some(g) => Some(
                Glob::new(g)
                    .map_err(|e| Error::plan(e.to_string()).into_df())?
                    .compile_matcher(),
            ),
            None => None,
        };
        let schema = match projection {
            Some(p) => Arc::new(file_schema().project(p)?),
            None => file_schema(),
        };
        Ok(Arc::new(ListingExec::new(
            self.clone(),
            glob,
            schema,
            limit,
        )))
    }
}

/// Streams the listing of a [`StorageTable`] (one partition).
#[derive(Debug)]
pub struct ListingExec {
    table: StorageTable,
    glob: Option<GlobMatcher>,
    schema: SchemaRef,
    limit: Option<usize>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl ListingExec {
    /// The scan of `table` producing `schema` (the file schema or its empty
    /// projection), stopping after `limit` files.
    pub fn try_new(
        table: StorageTable,
        schema: SchemaRef,
        limit: Option<usize>,
    ) -> Result<Self, Error> {
        let glob = match &table.glob {
            Some(g) => Some(
                Glob::new(g)
                    .map_err(|e| Error::plan(format!("invalid glob {g:?}: {e}")))?
                    .compile_matcher(),
            ),
            None => None,
        };
        Ok(Self::new(table, glob, schema, limit))
    }

    pub fn table(&self) -> &StorageTable {
        &self.table
    }

    pub fn limit(&self) -> Option<usize> {
        self.limit
    }

    fn new(
        table: StorageTable,
        glob: Option<GlobMatcher>,
        schema: SchemaRef,
        limit: Option<usize>,
    ) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Self {
            table,
            glob,
            schema,
            limit,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for ListingExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "ListingExec: source={}, recursive={}",
            self.table.loc.source, self.table.recursive
        )?;
        if let Some(g) = &self.table.glob {
            write!(f, ", glob={g}")?;
        }
        if let Some(l) = self.limit {
            write!(f, ", limit={l}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for ListingExec {
    exec_boilerplate!("ListingExec", leaf, metrics);

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let t = &self.table;
        let store = open_store(context.runtime_env().as_ref(), &t.loc, &t.options)
            .map_err(Error::into_df)?;
        let loc = t.loc.clone();
        let prefix = (!loc.prefix.as_ref().is_empty()).then(|| loc.prefix.clone());
        let url = loc.source.clone();
        let (err_loc, options) = (loc.clone(), t.options.clone());
        let scheme = loc.store_url.scheme();
        let metas = if scheme == "file" {
            // Walked in key order, as S3 lists (see `local_listing`).
            super::local_listing::list_local(&loc.prefix, t.recursive)
        } else if matches!(scheme, "http" | "https") {
            // One PROPFIND answers the whole listing, in the server's order:
            // it is in memory already, so sorting it costs no extra wait.
            let (store, recursive) = (Arc::clone(&store), t.recursive);
            stream::once(async move {
                let mut metas: Vec<ObjectMeta> = if recursive {
                    store.list(prefix.as_ref()).try_collect().await?
                } else {
                    store.list_with_delimiter(prefix.as_ref()).await?.objects
                };
                metas.sort_unstable_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
                Ok::<_, object_store::Error>(stream::iter(metas.into_iter().map(Ok)))
            })
            .try_flatten()
            .boxed()
        } else if t.recursive {
            store.list(prefix.as_ref()).boxed()
        } else {
            let store = Arc::clone(&store);
            stream::once(async move {
                store
                    .list_with_delimiter(prefix.as_ref())
                    .await
                    .map(|r| stream::iter(r.objects.into_iter().map(Ok)))
            })
            .try_flatten()
            .boxed()
        };
        let glob = self.glob.clone();
        let source = loc.source.clone();
        let listed = MetricBuilder::new(&self.metrics).counter("files_listed", partition);
        let done = MetricBuilder::new(&self.metrics).gauge("listing_done", partition);
        let files = metas
            .map_err(move |e| {
                Error::Storage {
                    url: url.clone(),
                    source: Arc::from(super::explain_at(e, &err_loc, &options)),
                }
                .into_df()
            })
            .try_filter_map(move |meta| {
                let file = to_file(&loc, &source, meta);
                let keep = glob.as_ref().is_none_or(|g| g.is_match(&file.path));
                if keep {
                    listed.add(1);
                }
                futures::future::ready(Ok(keep.then_some(file)))
            });
        let files = match self.limit {
            Some(n) => files.take(n).boxed(),
            None => files.boxed(),
        };
        let schema = Arc::clone(&self.schema);
        let batches = files.try_chunks(LIST_BATCH).map(move |chunk| {
            let files = chunk.map_err(|e| e.1)?;
            to_batch(&schema, &files)
        });
        // Read ahead (`LIST_AHEAD`): a store returns a page (1,000 keys on S3)
        // per request and asks for the next one only when the last key is
        // taken, so without this the downloads behind the listing stall for a
        // whole LIST round trip once per page. The task stops with the stream
        // (dropped: aborted) and after `limit` files.
        let mut ahead = RecordBatchReceiverStream::builder(Arc::clone(&self.schema), LIST_AHEAD);
        let tx = ahead.tx();
        ahead.spawn(async move {
            let mut batches = std::pin::pin!(batches);
            while let Some(batch) = batches.next().await {
                let failed = batch.is_err();
                if tx.send(batch).await.is_err() || failed {
                    return Ok(());
                }
            }
            // The last batch is queued: every file is counted.
            done.set(1);
            Ok(())
        });
        Ok(ahead.build())
    }
}

fn to_file(loc: &Location, source: &str, meta: ObjectMeta) -> File {
    let full = meta.location.as_ref();
    let prefix = loc.prefix.as_ref();
    let path = if prefix.is_empty() {
        full
    } else {
        full.strip_prefix(prefix)
            .map(|p| p.trim_start_matches('/'))
            .unwrap_or(full)
    };
    File {
        source: source.to_string(),
        path: path.to_string(),
        size: meta.size,
        version: meta.version,
        etag: meta.e_tag,
        last_modified: Some(meta.last_modified.timestamp_millis()),
        location: None,
    }
}

fn to_batch(schema: &SchemaRef, files: &[File]) -> DfResult<RecordBatch> {
    if schema.fields().is_empty() {
        let opts = RecordBatchOptions::new().with_row_count(Some(files.len()));
        return Ok(RecordBatch::try_new_with_options(
            Arc::clone(schema),
            vec![],
            &opts,
        )?);
    }
    let field = Field::new("file", File::data_type(), false);
    let array: ArrayRef = encode_column(&field, files)
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
    Ok(RecordBatch::try_new(Arc::clone(schema), vec![array])?)
}
