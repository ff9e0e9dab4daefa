//! The cluster's plan codecs: [`LogicalCodec`] (client -> scheduler) and
//! [`PhysicalCodec`] (scheduler -> executors) encode every udfchain plan part
//! and hand everything else to Ballista's own codecs.
//!
//! Encoded here: the logical `UdfNode`, the `StorageTable` and in-memory
//! (`from_values`) table providers, the scalar functions `row_hash`,
//! `file_from_url` and `json_to_struct` (shuffle / sample / chunk, URL
//! files, explode: in logical and physical plans, carried by the codec so
//! no node's function registry needs them), and the physical `MapExec`,
//! `GenerateExec`, `BatchMapExec`, `AggregateExec`, `PrefetchExec` and
//! `ListingExec`. A UDF travels as its kind, name, params and output column
//! (its code only when it has no name an executor can resolve: a Python
//! function travels as its `Code`), with the settings it was added with (prefetch, cache,
//! on_error, parallel, max_connections, batch_size, ordered, storage options,
//! ...); an executor rebuilds it from its [`UdfRegistry`], and a name it does
//! not have fails the task's decoding with [`Error::UnknownUdf`] naming the UDF
//! and the executor. A scheduler (no registry) plans with placeholders that
//! carry the signature and fail if ever run.
//!
//! An executor's codec with a [`JobWatch`] wraps each decoded UDF operator in
//! a [`WatchExec`], which stops it (and its prefetch input) when its job
//! stops.
//!
//! Wire format of our nodes: the tag `udfchain/1:`, one byte naming the
//! part, then a JSON body (schemas inside it as Arrow IPC bytes). Any buffer
//! without the tag is Ballista's, and any node that is not ours is encoded by
//! Ballista.
//!
//! Storage options travel with the plan (executors open the stores with them),
//! so a plan carries the credentials given as settings: keep the cluster on a
//! trusted network, or give executors their credentials through the
//! environment instead.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use serde::{Deserialize, Serialize};
use udfchain_udfs::{Code, Signature};

use super::exactly_once::one_read_per_map_output;
use super::job_watch::{JobWatch, WatchExec};
use super::registry::{UdfRegistry, placeholder};
use crate::chain::JsonToStruct;
use crate::error::Error;
use crate::plan::{
    Instance, PrefetchExec, PrefetchOptions, Udf, UdfNode, prefetch_options, udf_exec,
    udf_exec_parts,
};
use crate::session::RowHash;
use crate::settings::{OnError, Prefetch, Settings};
use crate::storage::{ListingExec, StorageTable};
use udfchain_udfs::FileFromUrl;

const TAG: &[u8] = b"udfchain/1:";
const UDF_NODE: u8 = b'U';
const STORAGE_TABLE: u8 = b'S';
const MEMORY_TABLE: u8 = b'M';
const UDF_EXEC: u8 = b'E';
const PREFETCH_EXEC: u8 = b'P';
const LISTING_EXEC: u8 = b'L';
const WATCH_EXEC: u8 = b'W';
const SCALAR_FN: u8 = b'F';

/// A udfchain scalar function on the wire: plans of `shuffle` / `sample` /
/// `chunk` call `row_hash`, `explode` a `json_to_struct` with its fields,
/// `file_from_url` makes Files of URLs. Carried by the codecs themselves, so
/// a node decodes them whatever its function registry holds.
#[derive(Serialize, Deserialize)]
enum WireFn {
    RowHash,
    FileFromUrl,
    JsonToStruct {
        column: String,
        /// The fields, as an Arrow IPC schema.
        fields: Vec<u8>,
    },
}

/// Encodes `node` when it is one of ours; `false` (nothing written) otherwise.
fn encode_fn(node: &datafusion::logical_expr::ScalarUDF, buf: &mut Vec<u8>) -> DfResult<bool> {
    let inner = node.inner().as_ref();
    let wire = if inner.downcast_ref::<RowHash>().is_some() {
        WireFn::RowHash
    } else if inner.downcast_ref::<FileFromUrl>().is_some() {
        WireFn::FileFromUrl
    } else if let Some(j) = inner.downcast_ref::<JsonToStruct>() {
        WireFn::JsonToStruct {
            column: j.column().to_string(),
            fields: ipc(&Schema::new(j.fields().clone()), &[])?,
        }
    } else {
        return Ok(false);
    };
    write(buf, SCALAR_FN, &wire)?;
    Ok(true)
}

/// The function `buf` holds when it is one of ours (see [`WireFn`]).
fn decode_fn(buf: &[u8]) -> Option<DfResult<Arc<datafusion::logical_expr::ScalarUDF>>> {
    let (SCALAR_FN, body) = ours(buf)? else {
        return None;
    };
    let decode = || -> DfResult<_> {
        Ok(Arc::new(match read::<WireFn>(body)? {
            WireFn::RowHash => RowHash::udf(),
            WireFn::FileFromUrl => FileFromUrl::udf(),
            WireFn::JsonToStruct { column, fields } => {
                let (schema, _) = from_ipc(&fields)?;
                JsonToStruct::udf(&column, schema.fields().clone())
            }
        }))
    };
    Some(decode())
}

fn df(e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Internal(format!("cluster codec: {e}"))
}

/// Our part in `buf`: its kind byte and body, or `None` for Ballista's.
fn ours(buf: &[u8]) -> Option<(u8, &[u8])> {
    let rest = buf.strip_prefix(TAG)?;
    let (&kind, body) = rest.split_first()?;
    Some((kind, body))
}

fn write<T: Serialize>(buf: &mut Vec<u8>, kind: u8, body: &T) -> DfResult<()> {
    buf.extend_from_slice(TAG);
    buf.push(kind);
    serde_json::to_writer(buf, body).map_err(df)
}

fn read<'a, T: Deserialize<'a>>(body: &'a [u8]) -> DfResult<T> {
    serde_json::from_slice(body).map_err(df)
}

/// `schema` and `batches` as an Arrow IPC stream.
fn ipc(schema: &Schema, batches: &[RecordBatch]) -> DfResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new(&mut out, schema)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()?;
    drop(w);
    Ok(out)
}

fn from_ipc(bytes: &[u8]) -> DfResult<(SchemaRef, Vec<RecordBatch>)> {
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    Ok((schema, batches))
}

/// A UDF as it travels: kind, signature, aggregate keys, settings.
#[derive(Serialize, Deserialize)]
struct WireUdf {
    kind: String,
    name: String,
    params: Vec<String>,
    /// IPC schema of the output field, then (when declared) the input type
    /// as a field named `input`.
    types: Vec<u8>,
    partition_by: Vec<String>,
    settings: WireSettings,
    /// The UDF's code, when it travels as code (a Python function).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<WireCode>,
}

/// A UDF's [`Code`] on the wire: its runtime, its bytes in base64.
#[derive(Serialize, Deserialize)]
struct WireCode {
    runtime: String,
    bytes: String,
}

impl WireCode {
    fn new(code: &Code) -> Self {
        Self {
            runtime: code.runtime.clone(),
            bytes: BASE64.encode(&code.bytes),
        }
    }

    fn code(&self) -> DfResult<Code> {
        let bytes = BASE64
            .decode(&self.bytes)
            .map_err(|e| df(format!("the code of a {} UDF: {e}", self.runtime)))?;
        Ok(Code {
            runtime: self.runtime.clone(),
            bytes: bytes.into(),
        })
    }
}

impl WireUdf {
    fn new(kind: &Udf, settings: &Settings) -> DfResult<Self> {
        let sig = kind.signature();
        let mut fields = vec![sig.output.clone()];
        if let Some(t) = &sig.input {
            fields.push(Field::new("input", t.clone(), true));
        }
        Ok(Self {
            kind: kind.kind_name().to_string(),
            name: sig.name.clone(),
            params: sig.params.clone(),
            types: ipc(&Schema::new(fields), &[])?,
            partition_by: match kind {
                Udf::Agg { partition_by, .. } => partition_by.clone(),
                _ => vec![],
            },
            settings: WireSettings::new(settings),
            code: kind
                .code()
                .map_err(|e| {
                    DataFusionError::Execution(format!(
                        "UDF {} cannot be sent to the cluster: {e}",
                        sig.name
                    ))
                })?
                .as_ref()
                .map(WireCode::new),
        })
    }

    fn code(&self) -> DfResult<Option<Code>> {
        self.code.as_ref().map(WireCode::code).transpose()
    }

    fn signature(&self) -> DfResult<Signature> {
        let (schema, _) = from_ipc(&self.types)?;
        let output = schema
            .fields()
            .first()
            .ok_or_else(|| df(format!("UDF {} has no output field", self.name)))?;
        Ok(Signature {
            name: self.name.clone(),
            params: self.params.clone(),
            input: schema.fields().get(1).map(|f| f.data_type().clone()),
            output: Field::clone(output),
        })
    }
}

/// The settings a UDF was added with, resolved (defaults applied).
#[derive(Serialize, Deserialize)]
struct WireSettings {
    prefetch: String,
    cache: bool,
    cache_limit: Option<u64>,
    parallel: usize,
    workers: usize,
    batch_size: usize,
    ordered: bool,
    max_connections: usize,
    on_error: String,
    root: PathBuf,
    memory_file_limit: u64,
    #[serde(default)]
    temp_dir_limit: Option<u64>,
    storage_options: BTreeMap<String, String>,
}

fn on_error_name(o: OnError) -> &'static str {
    match o {
        OnError::Fail => "fail",
        OnError::Skip => "skip",
        OnError::Null => "null",
    }
}

fn prefetch_name(p: Prefetch) -> String {
    match p {
        Prefetch::Auto => "auto".into(),
        Prefetch::Fixed(n) => n.to_string(),
    }
}

impl WireSettings {
    fn new(s: &Settings) -> Self {
        Self {
            prefetch: prefetch_name(s.get_prefetch()),
            cache: s.get_cache(),
            cache_limit: s.get_cache_limit(),
            parallel: s.get_parallel(),
            workers: s.get_workers(),
            batch_size: s.get_batch_size(),
            ordered: s.get_ordered(),
            max_connections: s.get_max_connections(),
            on_error: on_error_name(s.get_on_error()).into(),
            root: s.get_root(),
            memory_file_limit: s.get_memory_file_limit(),
            temp_dir_limit: s.get_temp_dir_limit(),
            storage_options: s.get_storage_options().clone(),
        }
    }

    /// The settings again; `root` replaced by the node's own when it has one.
    fn settings(&self, root: Option<&PathBuf>) -> DfResult<Settings> {
        let mut s = Settings::new()
            .set("prefetch", &self.prefetch)
            .and_then(|s| s.set("on_error", &self.on_error))
            .map_err(Error::into_df)?
            .cache(self.cache)
            .parallel(self.parallel)
            .workers(self.workers)
            .batch_size(self.batch_size)
            .ordered(self.ordered)
            .max_connections(self.max_connections)
            .root(root.unwrap_or(&self.root))
            .memory_file_limit(self.memory_file_limit);
        if let Some(l) = self.cache_limit {
            s = s.cache_limit(l);
        }
        if let Some(l) = self.temp_dir_limit {
            s = s.temp_dir_limit(l);
        }
        for (k, v) in &self.storage_options {
            s = s.storage_option(k, v);
        }
        Ok(s)
    }
}

/// A `PrefetchExec` as it travels.
#[derive(Serialize, Deserialize)]
struct WirePrefetch {
    file_cols: Vec<usize>,
    prefetch: String,
    ordered: bool,
    max_connections: usize,
    on_error: String,
    root: PathBuf,
    cache: bool,
    cache_limit: Option<u64>,
    memory_file_limit: u64,
    #[serde(default)]
    temp_dir_limit: Option<u64>,
    storage_options: BTreeMap<String, String>,
}

impl WirePrefetch {
    fn new(file_cols: &[usize], o: &PrefetchOptions) -> Self {
        Self {
            file_cols: file_cols.to_vec(),
            prefetch: prefetch_name(o.prefetch),
            ordered: o.ordered,
            max_connections: o.max_connections,
            on_error: on_error_name(o.on_error).into(),
            root: o.root.clone(),
            cache: o.cache,
            cache_limit: o.cache_limit,
            memory_file_limit: o.memory_file_limit,
            temp_dir_limit: o.temp_dir_limit,
            storage_options: o.storage_options.clone(),
        }
    }

    fn options(&self, root: Option<&PathBuf>) -> DfResult<PrefetchOptions> {
        let s = Settings::new()
            .set("prefetch", &self.prefetch)
            .and_then(|s| s.set("on_error", &self.on_error))
            .map_err(Error::into_df)?;
        let mut o = prefetch_options(&s, self.ordered);
        o.max_connections = self.max_connections;
        o.root = root.unwrap_or(&self.root).clone();
        o.cache = self.cache;
        o.cache_limit = self.cache_limit;
        o.memory_file_limit = self.memory_file_limit;
        o.temp_dir_limit = self.temp_dir_limit;
        o.storage_options = self.storage_options.clone();
        Ok(o)
    }
}

/// A `StorageTable` (and its `ListingExec`) as it travels.
#[derive(Serialize, Deserialize)]
struct WireStorage {
    uri: String,
    recursive: bool,
    glob: Option<String>,
    options: BTreeMap<String, String>,
    /// `ListingExec` only: files it stops after, and whether it projects no column.
    limit: Option<usize>,
    no_columns: bool,
}

impl WireStorage {
    fn new(t: &StorageTable) -> Self {
        Self {
            uri: t.location().source.clone(),
            recursive: t.recursive(),
            glob: t.glob().map(str::to_string),
            options: t.options().clone(),
            limit: None,
            no_columns: false,
        }
    }

    fn table(&self) -> DfResult<StorageTable> {
        StorageTable::try_new(
            &self.uri,
            self.recursive,
            self.glob.clone(),
            self.options.clone(),
        )
        .map_err(Error::into_df)
    }
}

/// A UDF operator as it travels: the UDF and its settings, whether its input
/// is its `PrefetchExec`, and its output schema.
#[derive(Serialize, Deserialize)]
struct WireExec {
    udf: WireUdf,
    prefetched: bool,
    schema: Vec<u8>,
}

/// The logical codec: `UdfNode`s and udfchain's table providers, Ballista's
/// codec for the rest. Decoded `UdfNode`s hold placeholders of their UDFs
/// (the scheduler plans, executors run).
#[derive(Debug, Default)]
pub struct LogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalCodec {
    /// The codec of udfchain's logical plan parts.
    pub fn new() -> Self {
        Self::default()
    }
}

impl LogicalExtensionCodec for LogicalCodec {
    fn try_decode_udf(
        &self,
        name: &str,
        buf: &[u8],
    ) -> DfResult<Arc<datafusion::logical_expr::ScalarUDF>> {
        match decode_fn(buf) {
            Some(f) => f,
            None => self.inner.try_decode_udf(name, buf),
        }
    }

    fn try_encode_udf(
        &self,
        node: &datafusion::logical_expr::ScalarUDF,
        buf: &mut Vec<u8>,
    ) -> DfResult<()> {
        if encode_fn(node, buf)? {
            return Ok(());
        }
        self.inner.try_encode_udf(node, buf)
    }

    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> DfResult<Extension> {
        let Some((UDF_NODE, body)) = ours(buf) else {
            return self.inner.try_decode(buf, inputs, ctx);
        };
        let wire: WireUdf = read(body)?;
        let [input] = inputs else {
            return Err(df("a UDF node takes one input"));
        };
        let kind = placeholder(
            &wire.kind,
            &wire.signature()?,
            &wire.partition_by,
            wire.code()?,
        )
        .map_err(Error::into_df)?;
        let node = UdfNode::try_new(input.clone(), kind, wire.settings.settings(None)?)
            .map_err(Error::into_df)?;
        Ok(Extension {
            node: Arc::new(node),
        })
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> DfResult<()> {
        match node.node.as_any().downcast_ref::<UdfNode>() {
            Some(n) => write(buf, UDF_NODE, &WireUdf::new(&n.kind, &n.settings)?),
            None => self.inner.try_encode(node, buf),
        }
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> DfResult<Arc<dyn TableProvider>> {
        match ours(buf) {
            Some((STORAGE_TABLE, body)) => Ok(Arc::new(read::<WireStorage>(body)?.table()?)),
            Some((MEMORY_TABLE, body)) => {
                let (_, batches) = from_ipc(body)?;
                Ok(Arc::new(MemTable::try_new(schema, vec![batches])?))
            }
            _ => self
                .inner
                .try_decode_table_provider(buf, table_ref, schema, ctx),
        }
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> DfResult<()> {
        if let Some(t) = node.downcast_ref::<StorageTable>() {
            return write(buf, STORAGE_TABLE, &WireStorage::new(t));
        }
        if let Some(t) = node.downcast_ref::<MemTable>() {
            let mut batches = Vec::new();
            for part in &t.batches {
                let part = part
                    .try_read()
                    .map_err(|_| df("an in-memory table is being written"))?;
                batches.extend(part.iter().cloned());
            }
            buf.extend_from_slice(TAG);
            buf.push(MEMORY_TABLE);
            buf.extend_from_slice(&ipc(&t.schema(), &batches)?);
            return Ok(());
        }
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> DfResult<Arc<dyn datafusion::datasource::file_format::FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn datafusion::datasource::file_format::FileFormatFactory>,
    ) -> DfResult<()> {
        self.inner.try_encode_file_format(buf, node)
    }
}

/// The physical codec: udfchain's operators, Ballista's codec for the rest.
/// With a registry (an executor) UDFs are rebuilt from it; without one (a
/// scheduler) they are placeholders.
#[derive(Debug, Default)]
pub struct PhysicalCodec {
    registry: Option<Arc<UdfRegistry>>,
    /// This node, as errors name it.
    node: String,
    /// The root caches and temp dirs go under on this node (an executor's
    /// work dir), instead of the client's.
    root: Option<PathBuf>,
    /// On an executor: stops its udfchain operators when their job stops.
    watch: Option<Arc<JobWatch>>,
    /// On an executor: the state of each UDF with a lifecycle its tasks
    /// resolved, kept while the executor runs, so that a model is set up
    /// once per executor process, not once per task (torn down when the
    /// executor stops and drops its codec).
    kept: std::sync::Mutex<Vec<Arc<Instance>>>,
    inner: BallistaPhysicalExtensionCodec,
}

impl PhysicalCodec {
    /// The codec of a node that plans but runs no UDF (a scheduler).
    pub fn planner() -> Self {
        Self {
            node: "the scheduler".into(),
            ..Self::default()
        }
    }

    /// The codec of an executor named `node` running the UDFs of `registry`,
    /// with its caches and temp dirs under `root` (the client's when `None`).
    pub fn executor(registry: Arc<UdfRegistry>, node: &str, root: Option<PathBuf>) -> Self {
        Self {
            registry: Some(registry),
            node: node.to_string(),
            root,
            watch: None,
            kept: Default::default(),
            inner: BallistaPhysicalExtensionCodec::default(),
        }
    }

    /// Decoded UDF operators stop when `watch` sees their job fail or
    /// be cancelled (`WatchExec`).
    pub(crate) fn with_job_watch(mut self, watch: Arc<JobWatch>) -> Self {
        self.watch = Some(watch);
        self
    }

    fn watched(&self, plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        match &self.watch {
            Some(w) => Arc::new(WatchExec::new(plan, Arc::clone(w))),
            None => plan,
        }
    }

    fn udf(&self, wire: &WireUdf) -> DfResult<Udf> {
        let sig = wire.signature()?;
        match &self.registry {
            // Ballista reports a task's error with `{:?}`: keep it readable.
            Some(r) => {
                let code = wire.code()?;
                let kind = r
                    .resolve(
                        &wire.kind,
                        &sig,
                        &wire.partition_by,
                        code.as_ref(),
                        &self.node,
                    )
                    .map_err(|e| DataFusionError::Execution(e.to_string()))?;
                if kind.lifecycle().is_some() {
                    let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
                    if !kept.iter().any(|i| i.key() == kind.address()) {
                        kept.push(Instance::of(&kind));
                    }
                }
                Ok(kind)
            }
            None => placeholder(&wire.kind, &sig, &wire.partition_by, wire.code()?)
                .map_err(Error::into_df),
        }
    }
}

impl PhysicalExtensionCodec for PhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let Some((kind, body)) = ours(buf) else {
            // Ballista's node; a shuffle read after a rerun reads each map
            // output once (see exactly_once.rs).
            let fixed = one_read_per_map_output(buf);
            let buf = fixed.as_deref().unwrap_or(buf);
            return self.inner.try_decode(buf, inputs, ctx, proto_converter);
        };
        let one = || match inputs {
            [input] => Ok(Arc::clone(input)),
            _ => Err(df("a udfchain operator takes one input")),
        };
        match kind {
            UDF_EXEC => {
                let wire: WireExec = read(body)?;
                let udf = self.udf(&wire.udf)?;
                let settings = wire.udf.settings.settings(self.root.as_ref())?;
                let (schema, _) = from_ipc(&wire.schema)?;
                let exec = udf_exec(&udf, &settings, one()?, wire.prefetched, schema, None)?;
                Ok(self.watched(exec))
            }
            PREFETCH_EXEC => {
                let wire: WirePrefetch = read(body)?;
                let options = wire.options(self.root.as_ref())?;
                Ok(Arc::new(PrefetchExec::new(one()?, wire.file_cols, options)))
            }
            // Its input was wrapped again when decoded, if this codec watches.
            WATCH_EXEC => one(),
            LISTING_EXEC => {
                let wire: WireStorage = read(body)?;
                let schema = if wire.no_columns {
                    Arc::new(Schema::empty())
                } else {
                    crate::storage::file_schema()
                };
                Ok(Arc::new(
                    ListingExec::try_new(wire.table()?, schema, wire.limit)
                        .map_err(Error::into_df)?,
                ))
            }
            other => Err(df(format!("unknown udfchain operator tag {other}"))),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        if let Some(parts) = udf_exec_parts(node.as_ref()) {
            let wire = WireExec {
                udf: WireUdf::new(&parts.kind, &parts.settings)?,
                prefetched: parts.prefetched,
                schema: ipc(&parts.schema, &[])?,
            };
            return write(buf, UDF_EXEC, &wire);
        }
        if let Some(p) = node.downcast_ref::<PrefetchExec>() {
            return write(
                buf,
                PREFETCH_EXEC,
                &WirePrefetch::new(p.file_cols(), p.options()),
            );
        }
        if node.downcast_ref::<WatchExec>().is_some() {
            return write(buf, WATCH_EXEC, &());
        }
        if let Some(l) = node.downcast_ref::<ListingExec>() {
            let mut wire = WireStorage::new(l.table());
            wire.limit = l.limit();
            wire.no_columns = l.schema().fields().is_empty();
            return write(buf, LISTING_EXEC, &wire);
        }
        self.inner.try_encode(node, buf, proto_converter)
    }

    fn try_decode_udf(
        &self,
        name: &str,
        buf: &[u8],
    ) -> DfResult<Arc<datafusion::logical_expr::ScalarUDF>> {
        match decode_fn(buf) {
            Some(f) => f,
            None => self.inner.try_decode_udf(name, buf),
        }
    }

    fn try_encode_udf(
        &self,
        node: &datafusion::logical_expr::ScalarUDF,
        buf: &mut Vec<u8>,
    ) -> DfResult<()> {
        if encode_fn(node, buf)? {
            return Ok(());
        }
        self.inner.try_encode_udf(node, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_travel_resolved_and_root_is_the_nodes_own() {
        let s = Settings::new()
            .prefetch_auto()
            .cache(true)
            .cache_limit(1 << 20)
            .parallel(3)
            .workers(5)
            .batch_size(7)
            .ordered(false)
            .max_connections(9)
            .on_error(OnError::Skip)
            .root("/client/root")
            .memory_file_limit(11)
            .temp_dir_limit(13)
            .storage_option("region", "eu-west-1");
        let json = serde_json::to_vec(&WireSettings::new(&s)).expect("encode");
        let wire: WireSettings = serde_json::from_slice(&json).expect("decode");
        let back = wire.settings(None).expect("settings");
        assert_eq!(back.get_prefetch(), Prefetch::Auto);
        assert!(back.get_cache());
        assert_eq!(back.get_cache_limit(), Some(1 << 20));
        assert_eq!(
            (
                back.get_parallel(),
                back.get_workers(),
                back.get_batch_size()
            ),
            (3, 5, 7)
        );
        assert!(!back.get_ordered());
        assert_eq!(back.get_max_connections(), 9);
        assert_eq!(back.get_on_error(), OnError::Skip);
        assert_eq!(back.get_memory_file_limit(), 11);
        assert_eq!(back.get_temp_dir_limit(), Some(13));
        assert_eq!(back.get_root(), PathBuf::from("/client/root"));
        assert_eq!(back.get_storage_options()["region"], "eu-west-1");
        let node = PathBuf::from("/exec/udfchain");
        assert_eq!(wire.settings(Some(&node)).expect("s").get_root(), node);
    }

    #[test]
    fn a_signature_travels_with_its_types() {
        let sig = Signature {
            name: "meta".into(),
            params: vec!["file".into()],
            input: Some(udfchain_udfs::File::data_type()),
            output: Field::new(
                "meta",
                datafusion::arrow::datatypes::DataType::Struct(
                    vec![Field::new(
                        "len",
                        datafusion::arrow::datatypes::DataType::UInt64,
                        false,
                    )]
                    .into(),
                ),
                true,
            ),
        };
        let code = Code {
            runtime: "python".into(),
            bytes: (0..=255u8).collect::<Vec<_>>().into(),
        };
        let kind = placeholder("map", &sig, &[], Some(code.clone())).expect("placeholder");
        let wire = WireUdf::new(&kind, &Settings::new()).expect("wire");
        let json = serde_json::to_vec(&wire).expect("encode");
        let wire: WireUdf = serde_json::from_slice(&json).expect("decode");
        assert_eq!(wire.code().expect("code"), Some(code));
        let back = wire.signature().expect("signature");
        assert_eq!(back.name, "meta");
        assert_eq!(back.params, sig.params);
        assert_eq!(back.input, sig.input);
        assert_eq!(back.output, sig.output);
        assert!(ours(b"udfchain/1:Ex").is_some() && ours(b"\x0a\x02ballista").is_none());
    }
}
