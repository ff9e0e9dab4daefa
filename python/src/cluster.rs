//! The cluster from Python: a Python executor (a Ballista executor in this
//! process that runs, besides the Rust built-ins, the Python UDFs a plan
//! carries as code), a scheduler, and the cluster session a chain with a
//! `cluster` setting runs in.
//!
//! Guarantees:
//! - A Python UDF travels as its `Code` (runtime `python`: what
//!   `udfchain._ship.ship` made on the client) and is loaded by
//!   `udfchain._ship.load`; a UDF that cannot be loaded (a module the
//!   executor cannot import, a version mismatch) fails the task's decoding,
//!   so the query, with the UDF, this executor and the Python error named.
//! - One load per UDF per executor process: the same code gives the same
//!   `PyUdf`, so a UDF's state (a class UDF's `setup()`, `Chain.setup`
//!   values) is built once per executor process, not per task (the
//!   executor's codec keeps it while it runs).
//! - A chain runs on the cluster its `cluster` setting (or `connect`'s)
//!   names: one session per scheduler (and `workers`,
//!   `cluster_executor_timeout`) per process, made on first use, reused by
//!   later runs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use udfchain::cluster::{Executor, Scheduler, UdfRegistry};
use udfchain::udfs::Signature;
use udfchain::{Chain, Session, Settings, Udf};

use crate::error::to_py;
use crate::runtime::{engine, wait};
use crate::udf::{InvokerInfo, PyUdf};

/// The runtime name of Python UDFs' code.
pub const RUNTIME: &str = "python";

/// Loaded UDFs are kept by this many distinct codes at most (then forgotten
/// and loaded again: a long-lived executor serving many chains).
const LOADED_MAX: usize = 256;

/// What identifies one load: kind, name, params, output column and the code.
type LoadKey = (String, String, Vec<String>, String, Vec<u8>);

fn loaded() -> std::sync::MutexGuard<'static, HashMap<LoadKey, Arc<PyUdf>>> {
    static LOADED: OnceLock<Mutex<HashMap<LoadKey, Arc<PyUdf>>>> = OnceLock::new();
    let all = LOADED.get_or_init(Default::default);
    all.lock().unwrap_or_else(|p| p.into_inner())
}

/// Loads a Python UDF's code on an executor (the registry's `python` loader).
fn load(kind: &str, sig: &Signature, partition_by: &[String], code: &[u8]) -> Result<Udf, String> {
    let key: LoadKey = (
        kind.to_string(),
        sig.name.clone(),
        sig.params.clone(),
        sig.output.name().clone(),
        code.to_vec(),
    );
    let known = loaded().get(&key).cloned();
    let udf = match known {
        Some(udf) => udf,
        None => {
            let udf = Arc::new(load_code(kind, sig, code)?);
            let mut all = loaded();
            if all.len() >= LOADED_MAX {
                all.clear();
            }
            Arc::clone(all.entry(key).or_insert(udf))
        }
    };
    udf.of_kind(kind, partition_by.to_vec())
        .ok_or_else(|| format!("unknown UDF kind {kind:?}"))
}

/// `udfchain._ship.load(code, kind)` as a `PyUdf` with the plan's signature;
/// the error is the Python exception's text.
fn load_code(kind: &str, sig: &Signature, code: &[u8]) -> Result<PyUdf, String> {
    Python::attach(|py| {
        let loaded = py
            .import("udfchain._ship")
            .and_then(|ship| ship.call_method1("load", (PyBytes::new(py, code), kind)));
        let invoke = loaded.map_err(|e| e.value(py).to_string())?;
        let info = InvokerInfo::of(&invoke).map_err(|e| e.value(py).to_string())?;
        Ok(PyUdf::new(
            &sig.name,
            sig.params.clone(),
            sig.output.clone(),
            Arc::new(invoke.unbind()),
            info,
        ))
    })
}

/// Runs a Python executor until the process ends or Ctrl-C (see
/// `udfchain.cluster.executor`).
#[pyfunction]
#[pyo3(signature = (scheduler, slots=None, work_dir=None, bind_host="127.0.0.1", port=0))]
pub fn cluster_executor(
    py: Python<'_>,
    scheduler: &str,
    slots: Option<usize>,
    work_dir: Option<PathBuf>,
    bind_host: &str,
    port: u16,
) -> PyResult<()> {
    engine()?;
    let registry = UdfRegistry::with_builtins().register_runtime(RUNTIME, Arc::new(load));
    let mut b = Executor::builder()
        .scheduler(scheduler)
        .registry(registry)
        .bind_host(bind_host)
        .port(port);
    if let Some(n) = slots {
        b = b.slots(n);
    }
    if let Some(dir) = work_dir {
        b = b.work_dir(dir);
    }
    wait(py, b.run())?.map_err(to_py)
}

/// Runs a scheduler on `bind` (`host:port`) until the process ends or Ctrl-C.
#[pyfunction]
#[pyo3(signature = (bind="127.0.0.1:50050"))]
pub fn cluster_scheduler(py: Python<'_>, bind: &str) -> PyResult<()> {
    engine()?;
    let b = Scheduler::builder().bind(bind);
    wait(py, b.run())?.map_err(to_py)
}

/// What a cluster session is made for: scheduler, workers, executor timeout.
type SessionKey = (String, usize, std::time::Duration);

/// The settings `connect` set: what every chain starts from (its own
/// settings override them), `None` before `connect` or after `connect(None)`.
fn connected() -> std::sync::MutexGuard<'static, Option<Settings>> {
    static CONNECTED: Mutex<Option<Settings>> = Mutex::new(None);
    CONNECTED.lock().unwrap_or_else(|p| p.into_inner())
}

/// `chain` in the cluster session its `cluster` setting (or `connect`'s)
/// names, made on first use and kept for the process; as it is when it runs
/// locally.
pub async fn placed(chain: Chain) -> udfchain::Result<Chain> {
    let base = connected().clone();
    let settings = match base {
        Some(c) => c.merge(chain.get_settings()),
        None => chain.get_settings().clone(),
    };
    let Some(url) = settings.get_cluster().map(str::to_string) else {
        return Ok(chain);
    };
    static SESSIONS: OnceLock<Mutex<HashMap<SessionKey, Arc<Session>>>> = OnceLock::new();
    let sessions = || {
        let all = SESSIONS.get_or_init(Default::default);
        all.lock().unwrap_or_else(|p| p.into_inner())
    };
    let key: SessionKey = (
        url.clone(),
        settings.get_workers(),
        settings.get_cluster_executor_timeout(),
    );
    let known = sessions().get(&key).cloned();
    let session = match known {
        Some(s) if Arc::ptr_eq(chain.session(), &s) => return Ok(chain),
        Some(s) => s,
        None => {
            let made = Session::remote(&url, settings).await?;
            Arc::clone(sessions().entry(key).or_insert(made))
        }
    };
    Ok(chain.in_session(session))
}

/// Runs the chains of this process on the cluster `pairs` name (`cluster`
/// and other settings every chain then starts from), after checking that
/// its scheduler answers; no `cluster` (or `local`) goes back to local runs.
#[pyfunction]
pub fn connect(py: Python<'_>, pairs: Vec<(String, String)>) -> PyResult<()> {
    engine()?;
    let settings = crate::chain::settings(pairs)?;
    if settings.get_cluster().is_none() {
        *connected() = None;
        return Ok(());
    }
    let chain = Chain::from_storage("memory:///").settings(settings.clone());
    wait(py, async move { placed(chain).await.map(drop) })?.map_err(to_py)?;
    *connected() = Some(settings);
    Ok(())
}

/// The version of the engine this module was built from.
#[pyfunction]
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
