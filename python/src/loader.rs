//! `Loader`: the Rust training loader (`udfchain::loader::Loader`) from
//! Python. `udfchain.Loader` (`udfchain/_loader.py`) picks the rank and worker
//! (from torch when it is there) and turns batches into Python values.
//!
//! Guarantees: the loader's own (every row once per epoch across ranks and
//! workers, shuffles drawn from (seed, epoch), partitions fetched ahead); each
//! `next()` waits with the GIL released and stops at Ctrl-C, which drops the
//! epoch stream and with it every fetch in flight.

use std::sync::Mutex;

use futures::StreamExt;
use futures::stream::BoxStream;
use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use udfchain::loader::Loader;

use crate::arrow::to_ipc;
use crate::chain::PyChain;
use crate::cluster::placed;
use crate::error::to_py;
use crate::runtime::{engine, wait};

#[pyclass(frozen, name = "Loader", module = "udfchain._internal")]
pub struct PyLoader {
    loader: Loader,
}

#[pymethods]
impl PyLoader {
    /// A loader over `chain` (or dataset `dataset`, at `version`).
    #[new]
    #[pyo3(signature = (chain=None, dataset=None, version=None, partition_rows=1000,
        prefetch_partitions=1, parallel_requests=1, batch_size=64, drop_last=false,
        columns=None, with_bytes=None, with_images=None, shuffle=None, rank=0, world_size=1,
        worker=0, num_workers=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        chain: Option<&PyChain>,
        dataset: Option<&str>,
        version: Option<u32>,
        partition_rows: usize,
        prefetch_partitions: usize,
        parallel_requests: usize,
        batch_size: usize,
        drop_last: bool,
        columns: Option<Vec<String>>,
        with_bytes: Option<(String, String)>,
        with_images: Option<(String, String, (u32, u32), String)>,
        shuffle: Option<u64>,
        rank: usize,
        world_size: usize,
        worker: usize,
        num_workers: usize,
    ) -> PyResult<Self> {
        engine()?;
        let mut l = match (chain, dataset, version) {
            (Some(c), None, None) => {
                // On its cluster when it names one (a chain runs when resolved).
                let chain = c.chain().clone();
                Loader::from_chain(wait(py, placed(chain))?.map_err(to_py)?)
            }
            (None, Some(d), None) => Loader::from_dataset(d),
            (None, Some(d), Some(v)) => Loader::from_dataset_version(d, v),
            _ => {
                return Err(PyValueError::new_err(
                    "a Loader reads a chain or a dataset (with an optional version)",
                ));
            }
        };
        l = l
            .partition_rows(partition_rows)
            .prefetch_partitions(prefetch_partitions)
            .parallel_requests(parallel_requests)
            .batch_size(batch_size)
            .drop_last(drop_last)
            .shard(rank, world_size)
            .worker(worker, num_workers);
        if let Some(cols) = columns {
            l = l.columns(cols);
        }
        if let Some((file_col, out_col)) = with_bytes {
            l = l.with_bytes(&file_col, &out_col);
        }
        if let Some((file_col, out_col, size, mode)) = with_images {
            let mode = udfchain::udfs::builtins::image::Mode::parse(&mode)
                .map_err(|e| PyValueError::new_err(format!("with_images mode: {e}")))?;
            l = l.with_images(&file_col, &out_col, size, mode);
        }
        if let Some(seed) = shuffle {
            l = l.shuffle(seed);
        }
        Ok(Self { loader: l })
    }

    /// The batches of `epoch` for this rank and worker.
    fn epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<Batches> {
        let l = self.loader.clone();
        let stream = wait(py, async move { l.epoch(epoch).await })?.map_err(to_py)?;
        Ok(Batches {
            stream: Mutex::new(Some(stream)),
        })
    }
}

/// An epoch's batches: an iterator of Arrow IPC streams, one batch each.
#[pyclass(frozen, module = "udfchain._internal")]
pub struct Batches {
    stream:
        Mutex<Option<BoxStream<'static, udfchain::Result<datafusion::arrow::array::RecordBatch>>>>,
}

#[pymethods]
impl Batches {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let taken = self.stream.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(mut stream) = taken else {
            return Err(PyStopIteration::new_err(()));
        };
        // A Ctrl-C here drops the stream: the epoch ends with it.
        let (item, stream) = wait(py, async move { (stream.next().await, stream) })?;
        match item {
            None => Err(PyStopIteration::new_err(())),
            Some(Err(e)) => Err(to_py(e)),
            Some(Ok(batch)) => {
                *self.stream.lock().unwrap_or_else(|p| p.into_inner()) = Some(stream);
                let ipc = to_ipc(&batch.schema(), std::slice::from_ref(&batch)).map_err(to_py)?;
                Ok(PyBytes::new(py, &ipc))
            }
        }
    }
}
