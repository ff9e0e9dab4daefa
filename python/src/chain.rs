//! `Chain`: the Rust `udfchain::Chain` seen from Python. The Python class
//! `udfchain.Chain` (`udfchain/_chain.py`) wraps it with DataChain's names and
//! turns Python functions into [`PyUdf`]s; this file only forwards.
//!
//! Guarantees: building never blocks and never fails (errors come from the
//! first run, as in Rust); every run releases the GIL and stops at Ctrl-C
//! (see `runtime::wait`); settings are set by name from text with
//! `Settings::set`, so Python accepts and refuses exactly what `SET` does.

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::Field;
use datafusion::common::JoinType;
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::logical_expr::LogicalPlanBuilder;
use futures::StreamExt;
use futures::stream::BoxStream;
use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use udfchain::{Chain, Diff, Session, Settings};

use crate::arrow::{from_ipc, to_ipc};
use crate::cluster::placed;
use crate::error::to_py;
use crate::expr::PyExpr;
use crate::runtime::{drop_in_runtime, engine, wait};
use crate::udf::{InvokerInfo, PyUdf};

#[pyclass(frozen, name = "Chain", module = "udfchain._internal")]
pub struct PyChain {
    chain: Chain,
}

fn of(chain: Chain) -> PyChain {
    PyChain { chain }
}

/// The settings `(name, text)` pairs give, as `SET name = text` would.
pub fn settings(pairs: Vec<(String, String)>) -> PyResult<Settings> {
    pairs
        .into_iter()
        .try_fold(Settings::new(), |s, (name, value)| s.set(&name, &value))
        .map_err(to_py)
}

/// The output field a UDF declares: the one field of an IPC schema.
pub fn output_field(schema_ipc: &[u8]) -> PyResult<Field> {
    let (schema, _) = from_ipc(schema_ipc).map_err(to_py)?;
    match schema.fields().first() {
        Some(f) if schema.fields().len() == 1 => Ok(f.as_ref().clone()),
        _ => Err(PyValueError::new_err(
            "a UDF declares exactly one output field",
        )),
    }
}

fn bytes<'py>(py: Python<'py>, b: Vec<u8>) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &b)
}

#[pyfunction]
#[pyo3(signature = (uri, recursive=true, glob=None))]
pub fn read_storage(uri: &str, recursive: bool, glob: Option<&str>) -> PyResult<PyChain> {
    engine()?;
    let mut c = Chain::from_storage(uri);
    if !recursive {
        c = c.non_recursive();
    }
    if let Some(g) = glob {
        c = c.glob(g);
    }
    Ok(of(c))
}

/// Rows of an Arrow IPC stream (made by pyarrow from Python values).
#[pyfunction]
pub fn read_arrow(ipc: &[u8]) -> PyResult<PyChain> {
    engine()?;
    let (schema, batches) = from_ipc(ipc).map_err(to_py)?;
    let table = MemTable::try_new(schema, vec![batches]).map_err(to_py)?;
    let plan = LogicalPlanBuilder::scan("values", provider_as_source(Arc::new(table)), None)
        .and_then(|b| b.build())
        .map_err(to_py)?;
    Ok(of(Chain::from_plan(Session::global(), plan)))
}

#[pyfunction]
pub fn read_parquet(uri: &str) -> PyResult<PyChain> {
    engine()?;
    Ok(of(Chain::from_parquet(uri)))
}

#[pyfunction]
pub fn read_csv(uri: &str) -> PyResult<PyChain> {
    engine()?;
    Ok(of(Chain::from_csv(uri)))
}

#[pyfunction]
pub fn read_json(uri: &str) -> PyResult<PyChain> {
    engine()?;
    Ok(of(Chain::from_json(uri)))
}

#[pyfunction]
#[pyo3(signature = (name, version=None))]
pub fn read_dataset(name: &str, version: Option<u32>) -> PyResult<PyChain> {
    engine()?;
    Ok(of(match version {
        Some(v) => Chain::from_dataset_version(name, v),
        None => Chain::from_dataset(name),
    }))
}

/// The chain of a SQL query (DataFusion's dialect, udfchain's table
/// functions and UDFs, the functions registered with `register`).
pub fn from_sql(py: Python<'_>, session: Arc<Session>, sql: String) -> PyResult<PyChain> {
    let s = Arc::clone(&session);
    let plan = wait(py, async move {
        s.context()
            .sql(&sql)
            .await
            .map(|df| df.into_unoptimized_plan())
    })?
    .map_err(to_py)?;
    Ok(of(Chain::from_plan(session, plan)))
}

impl PyChain {
    /// The Rust chain (for the loader).
    pub fn chain(&self) -> &Chain {
        &self.chain
    }
}

#[pymethods]
impl PyChain {
    fn settings(&self, pairs: Vec<(String, String)>) -> PyResult<PyChain> {
        Ok(of(self.chain.clone().settings(settings(pairs)?)))
    }

    fn filter(&self, e: PyExpr) -> PyChain {
        of(self.chain.clone().filter(e.expr))
    }

    fn select(&self, exprs: Vec<PyExpr>) -> PyChain {
        of(self.chain.clone().select(exprs.into_iter().map(|e| e.expr)))
    }

    fn mutate(&self, name: &str, e: PyExpr) -> PyChain {
        of(self.chain.clone().mutate(name, e.expr))
    }

    fn order_by(&self, exprs: Vec<PyExpr>) -> PyChain {
        of(self.chain.clone().order_by(exprs.iter().map(PyExpr::sort)))
    }

    fn limit(&self, n: usize) -> PyChain {
        of(self.chain.clone().limit(n))
    }

    fn offset(&self, n: usize) -> PyChain {
        of(self.chain.clone().offset(n))
    }

    fn distinct(&self) -> PyChain {
        of(self.chain.clone().distinct())
    }

    fn union(&self, other: &PyChain) -> PyChain {
        of(self.chain.clone().union(other.chain.clone()))
    }

    fn join(
        &self,
        right: &PyChain,
        how: &str,
        left_on: Vec<String>,
        right_on: Vec<String>,
    ) -> PyResult<PyChain> {
        let how = match how {
            "inner" => JoinType::Inner,
            "left" => JoinType::Left,
            "right" => JoinType::Right,
            "full" | "outer" => JoinType::Full,
            "semi" | "left_semi" => JoinType::LeftSemi,
            "anti" | "left_anti" => JoinType::LeftAnti,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "unknown join {how:?}: inner, left, right, full, semi or anti"
                )));
            }
        };
        let l: Vec<&str> = left_on.iter().map(String::as_str).collect();
        let r: Vec<&str> = right_on.iter().map(String::as_str).collect();
        Ok(of(self.chain.clone().join(
            right.chain.clone(),
            how,
            &l,
            &r,
        )))
    }

    fn group_by(&self, keys: Vec<PyExpr>, aggs: Vec<PyExpr>) -> PyChain {
        of(self.chain.clone().group_by(
            keys.into_iter().map(|e| e.expr),
            aggs.into_iter().map(|e| e.expr),
        ))
    }

    /// `diff` / `file_diff` (`files=True`): see `Chain::diff`.
    #[pyo3(signature = (other, on, right_on=None, compare=None, right_compare=None, added=true, deleted=true, modified=true, same=false, status_col=None, files=false))]
    #[allow(clippy::too_many_arguments)]
    fn diff(
        &self,
        other: &PyChain,
        on: Vec<String>,
        right_on: Option<Vec<String>>,
        compare: Option<Vec<String>>,
        right_compare: Option<Vec<String>>,
        added: bool,
        deleted: bool,
        modified: bool,
        same: bool,
        status_col: Option<String>,
        files: bool,
    ) -> PyResult<PyChain> {
        let mut d = if files {
            match on.as_slice() {
                [one] => Diff::files(one),
                _ => return Err(PyValueError::new_err("file_diff: on names one File column")),
            }
        } else {
            Diff::on(&strs(&on))
        };
        if let Some(r) = &right_on {
            d = d.right_on(&strs(r));
        }
        if let Some(c) = &compare {
            d = d.compare(&strs(c));
        }
        if let Some(c) = &right_compare {
            d = d.right_compare(&strs(c));
        }
        d = d
            .added(added)
            .deleted(deleted)
            .modified(modified)
            .same(same);
        if let Some(s) = &status_col {
            d = d.status_col(s);
        }
        Ok(of(self.chain.clone().diff(other.chain.clone(), d)))
    }

    #[pyo3(signature = (other, on=None, right_on=None))]
    fn subtract(
        &self,
        other: &PyChain,
        on: Option<Vec<String>>,
        right_on: Option<Vec<String>>,
    ) -> PyChain {
        let on: Option<Vec<&str>> = on.as_ref().map(|v| v.iter().map(String::as_str).collect());
        let right_on: Option<Vec<&str>> = right_on
            .as_ref()
            .map(|v| v.iter().map(String::as_str).collect());
        of(self
            .chain
            .clone()
            .subtract(other.chain.clone(), on.as_deref(), right_on.as_deref()))
    }

    /// DataChain's `merge`: `how` is "left", "inner" or "full".
    fn merge(
        &self,
        right: &PyChain,
        on: Vec<String>,
        right_on: Vec<String>,
        how: &str,
        rname: &str,
    ) -> PyResult<PyChain> {
        let how = match how {
            "left" => JoinType::Left,
            "inner" => JoinType::Inner,
            "full" => JoinType::Full,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "merge: unknown join {how:?}"
                )));
            }
        };
        Ok(of(self.chain.clone().merge(
            right.chain.clone(),
            &strs(&on),
            &strs(&right_on),
            how,
            rname,
        )))
    }

    #[pyo3(signature = (col, column=None, schema_sample_size=1))]
    fn explode(&self, col: &str, column: Option<&str>, schema_sample_size: usize) -> PyChain {
        of(self.chain.clone().explode(col, column, schema_sample_size))
    }

    #[pyo3(signature = (seed=None))]
    fn shuffle(&self, seed: Option<u64>) -> PyChain {
        of(self.chain.clone().shuffle(seed))
    }

    #[pyo3(signature = (n, seed=None))]
    fn sample(&self, n: usize, seed: Option<u64>) -> PyChain {
        of(self.chain.clone().sample(n, seed))
    }

    fn chunk(&self, index: usize, total: usize) -> PyChain {
        of(self.chain.clone().chunk(index, total))
    }

    /// Adds a Python UDF of `kind` (map, gen, batch_map, agg) named `name`,
    /// reading `params`, writing the one field of `output` (an IPC schema).
    /// `ship() -> bytes`: the UDF's code for cluster executors.
    #[pyo3(signature = (kind, name, params, output, invoke, partition_by=Vec::new(), ship=None))]
    #[allow(clippy::too_many_arguments)]
    fn udf(
        &self,
        py: Python<'_>,
        kind: &str,
        name: &str,
        params: Vec<String>,
        output: &[u8],
        invoke: Py<PyAny>,
        partition_by: Vec<String>,
        ship: Option<Py<PyAny>>,
    ) -> PyResult<PyChain> {
        let info = InvokerInfo::of(invoke.bind(py))?;
        let mut udf = PyUdf::new(name, params, output_field(output)?, Arc::new(invoke), info);
        if let Some(ship) = ship {
            udf = udf.with_ship(ship);
        }
        let udf = Arc::new(udf)
            .of_kind(kind, partition_by)
            .ok_or_else(|| PyValueError::new_err(format!("unknown UDF kind {kind:?}")))?;
        Ok(of(self.chain.clone().udf(udf)))
    }

    /// Declares the version of the UDF added last (`Chain::version`): a
    /// save's checkpoint is keyed by it, so a new version starts over.
    fn version(&self, version: &str) -> PyChain {
        of(self.chain.clone().version(version))
    }

    /// Runs the chain: its rows as one Arrow IPC stream.
    fn collect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let c = self.chain.clone();
        let (schema, batches) = wait(py, async move {
            let c = placed(c).await?;
            let batches = c.collect().await?;
            let schema = match batches.first() {
                Some(b) => b.schema(),
                None => Arc::new(c.logical_plan().await?.schema().as_arrow().clone()),
            };
            Ok::<_, udfchain::Error>((schema, batches))
        })?
        .map_err(to_py)?;
        Ok(bytes(py, to_ipc(&schema, &batches).map_err(to_py)?))
    }

    /// Runs the chain as a stream: its batches as they come, pulled from
    /// the engine as the reader asks (see [`ResultStream`]). Waits for the
    /// first batch, whose schema the stream declares.
    fn stream(&self, py: Python<'_>) -> PyResult<ResultStream> {
        let c = self.chain.clone();
        let (schema, first, rest) = wait(py, async move {
            let c = placed(c).await?;
            let mut s = c.stream().await?;
            let first = s.next().await.transpose()?;
            let schema = match &first {
                Some(b) => b.schema(),
                None => Arc::new(c.logical_plan().await?.schema().as_arrow().clone()),
            };
            Ok::<_, udfchain::Error>((schema, first, s))
        })?
        .map_err(to_py)?;
        Ok(ResultStream {
            schema: to_ipc(&schema, &[]).map_err(to_py)?,
            first: Mutex::new(first),
            rest: Mutex::new(Some(rest)),
        })
    }

    fn count(&self, py: Python<'_>) -> PyResult<usize> {
        let c = self.chain.clone();
        wait(py, async move { placed(c).await?.count().await })?.map_err(to_py)
    }

    /// One aggregate (an expression of `aggregate`) over every row, as an
    /// Arrow IPC stream of one row and one column.
    fn aggregate_value<'py>(&self, py: Python<'py>, agg: PyExpr) -> PyResult<Bound<'py, PyBytes>> {
        let c = self.chain.clone();
        let value = wait(py, async move {
            placed(c).await?.aggregate_value(agg.expr).await
        })?
        .map_err(to_py)?;
        let array = value
            .to_array()
            .map_err(|e| to_py(udfchain::Error::from(e)))?;
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![Field::new(
            "value",
            array.data_type().clone(),
            true,
        )]));
        let batch =
            datafusion::arrow::array::RecordBatch::try_new(Arc::clone(&schema), vec![array])
                .map_err(|e| {
                    to_py(udfchain::Error::from(
                        datafusion::error::DataFusionError::from(e),
                    ))
                })?;
        Ok(bytes(py, to_ipc(&schema, &[batch]).map_err(to_py)?))
    }

    fn to_table_string(&self, py: Python<'_>, n: usize) -> PyResult<String> {
        let c = self.chain.clone();
        wait(py, async move { placed(c).await?.to_table_string(n).await })?.map_err(to_py)
    }

    #[pyo3(signature = (analyze=false))]
    fn explain(&self, py: Python<'_>, analyze: bool) -> PyResult<String> {
        let c = self.chain.clone();
        wait(py, async move {
            let c = placed(c).await?;
            if analyze {
                c.explain_analyze().await
            } else {
                c.explain().await
            }
        })?
        .map_err(to_py)
    }

    /// Saves the rows as the next version of dataset `name`: (name, version, rows).
    fn save(&self, py: Python<'_>, name: String) -> PyResult<(String, u32, u64)> {
        let c = self.chain.clone();
        let info = wait(py, async move { placed(c).await?.save(&name).await })?.map_err(to_py)?;
        Ok((info.name, info.version, info.rows))
    }

    /// Writes the files of column `signal` below `output`: (written, skipped).
    fn to_storage(
        &self,
        py: Python<'_>,
        output: String,
        signal: String,
        placement: String,
        link_type: String,
    ) -> PyResult<(u64, u64)> {
        let placement: udfchain::Placement = placement.parse().map_err(to_py)?;
        let link_type: udfchain::LinkType = link_type.parse().map_err(to_py)?;
        let c = self.chain.clone();
        let done = wait(py, async move {
            placed(c)
                .await?
                .to_storage(&output, &signal, placement, link_type)
                .await
        })?
        .map_err(to_py)?;
        Ok((done.written, done.skipped))
    }

    fn to_parquet(&self, py: Python<'_>, uri: String) -> PyResult<()> {
        let c = self.chain.clone();
        wait(py, async move { placed(c).await?.to_parquet(&uri).await })?.map_err(to_py)
    }
}

type Batches = BoxStream<'static, udfchain::Result<RecordBatch>>;

/// A chain's result as it runs: an iterator of Arrow IPC streams of one
/// batch each (`udfchain.Chain.__arrow_c_stream__` hands them to pyarrow as a
/// `RecordBatchReader`, which exports the Arrow C stream interface).
///
/// Guarantees: a batch is computed when the reader asks for it and not
/// before (beyond what the engine's operators buffer), so memory holds a few
/// batches whatever the result's size; each `next()` waits with the GIL
/// released and stops at Ctrl-C, which ends the stream; an error of the run
/// is raised by the `next()` that meets it (of its kind's class, see
/// `error.rs`) and ends the stream; dropping the stream (or abandoning it
/// unread) cancels the run, its UDF calls and downloads.
#[pyclass(frozen, module = "udfchain._internal")]
pub struct ResultStream {
    /// The IPC schema message of every batch.
    schema: Vec<u8>,
    /// The batch read to learn the schema, until `next()` hands it out.
    first: Mutex<Option<RecordBatch>>,
    /// `None` once ended (by its end, an error or Ctrl-C) or while a `next()` waits.
    rest: Mutex<Option<Batches>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[pymethods]
impl ResultStream {
    /// The schema of every batch, as an IPC stream without batches.
    fn schema<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.schema)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch as an IPC stream; `StopIteration` at the end.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let batch = match locked(&self.first).take() {
            Some(b) => b,
            None => {
                let Some(mut rest) = locked(&self.rest).take() else {
                    return Err(PyStopIteration::new_err(()));
                };
                // A Ctrl-C here drops the stream: the run ends with it.
                let (item, rest) = wait(py, async move { (rest.next().await, rest) })?;
                match item {
                    None => return Err(PyStopIteration::new_err(())),
                    Some(Err(e)) => return Err(to_py(e)),
                    Some(Ok(b)) => {
                        *locked(&self.rest) = Some(rest);
                        b
                    }
                }
            }
        };
        let ipc = to_ipc(&batch.schema(), std::slice::from_ref(&batch)).map_err(to_py)?;
        Ok(PyBytes::new(py, &ipc))
    }
}

impl Drop for ResultStream {
    fn drop(&mut self) {
        if let Some(rest) = locked(&self.rest).take() {
            drop_in_runtime(rest);
        }
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Dataset `name`'s version `version` (default: latest) with what it read,
/// as JSON (`udfchain.dataset_info` makes it a dict): name, version,
/// versions, rows, bytes, created (seconds since the epoch), schema (`name:
/// type` lines), sources (lineage entries: `kind` and `uri`, or `name` and
/// `version`). The root is the global session's (settings or `$UDFCHAIN_ROOT`).
#[pyfunction]
#[pyo3(signature = (name, version=None))]
pub fn dataset_info(py: Python<'_>, name: String, version: Option<u32>) -> PyResult<String> {
    engine()?;
    let root = Session::global().settings().get_root();
    let json = wait(py, async move {
        let catalog = udfchain::Catalog::open(root).await?;
        let info = catalog.get(&name, version).await?;
        let sources = catalog.lineage(&info.name, Some(info.version)).await?;
        let versions: Vec<u32> = catalog
            .list()
            .await?
            .into_iter()
            .filter(|v| v.name == info.name)
            .map(|v| v.version)
            .collect();
        Ok::<_, udfchain::Error>(serde_json::json!({
            "name": info.name,
            "version": info.version,
            "versions": versions,
            "rows": info.rows,
            "bytes": info.bytes,
            "created": info.created,
            "schema": info.schema.lines().collect::<Vec<_>>(),
            "sources": sources,
        }))
    })?
    .map_err(to_py)?;
    Ok(json.to_string())
}
