//! [`UdfRegistry`]: the UDFs a cluster node can run, by name.
//!
//! UDFs travel by name: a plan sent to an executor carries each UDF's name,
//! kind, params and output column, never its code. An executor rebuilds the
//! UDF from its registry ([`UdfRegistry::resolve`]); a name it does not have
//! (or has as another kind) is an [`Error::UnknownUdf`] naming the UDF and
//! the node, returned while the task's plan is decoded, before anything runs.
//!
//! A UDF's name is its `Signature::name`: the Rust function's name for a
//! function (`map("meta", meta)` is named `meta`), the output column for a
//! closure, the built-in's name for the script built-ins (`sha256`, ...);
//! an image decoder's name carries its spec
//! (`image_decode[mode=RGB,resize=224x224/bilinear]`), which any executor reads back.
//! Registered functions are rebuilt for the params and output column the plan
//! names, so one registration serves every call of the UDF in any chain.
//!
//! A UDF that travels as [`Code`] (a Python function) is loaded by the loader
//! registered for its runtime ([`UdfRegistry::register_runtime`]: a Python
//! executor registers `python`); a node without one refuses it naming the
//! runtime and how to start an executor that has it, and a loader's failure
//! (a module the executor cannot import, a version mismatch) is the reason in
//! the same [`Error::UnknownUdf`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use futures::stream::BoxStream;
use serde::Serialize;
use serde::de::DeserializeOwned;
use udfchain_udfs::{
    Aggregator, BatchMapper, BoxError, CallError, Code, Generator, Mapper, Signature, UdfError,
    agg_fn, batch_map_fn, gen_fn, map_fn,
};

use udfchain_udfs::builtins::image::{DecodeSpec, decode_udf};

use crate::error::{Error, Result};
use crate::plan::Udf;

/// Builds a UDF for the params and output column a plan names.
type Make = Arc<dyn Fn(&[&str], &str) -> Result<Udf, UdfError> + Send + Sync>;

/// Loads a UDF that travels as code: its kind (`map`, `gen`, `batch_map`,
/// `agg`), the plan's signature and aggregate keys, and the code's bytes; the
/// error is the reason the UDF cannot run here.
pub type CodeLoader =
    Arc<dyn Fn(&str, &Signature, &[String], &[u8]) -> Result<Udf, String> + Send + Sync>;

/// UDFs by name, with the kind each one is, and the loaders of UDFs that
/// travel as code, by runtime.
#[derive(Clone, Default)]
pub struct UdfRegistry {
    makers: BTreeMap<String, (&'static str, Make)>,
    runtimes: BTreeMap<String, CodeLoader>,
}

impl fmt::Debug for UdfRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdfRegistry")
            .field("udfs", &self.makers.keys().collect::<Vec<_>>())
            .field("runtimes", &self.runtimes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl UdfRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The script built-ins (`file_size`, `sha256`, `md5`, `read_text`,
    /// `line_count`, `image_size`): what `udfchain cluster executor` runs.
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        for b in crate::script::builtins() {
            let name = b.name.clone();
            r.insert(
                &name,
                "map",
                Arc::new(move |params: &[&str], output: &str| {
                    let param = params.first().copied().unwrap_or("file");
                    b.make(param, output).map(Udf::Map)
                }),
            );
        }
        r.register_gen("tar_members", udfchain_udfs::builtins::tar_members)
            .register_gen("tar_entries", udfchain_udfs::builtins::tar_entries)
            .register_gen(
                "webdataset_samples",
                udfchain_udfs::builtins::webdataset_samples,
            )
    }

    fn insert(&mut self, name: &str, kind: &'static str, make: Make) {
        self.makers.insert(name.to_string(), (kind, make));
    }

    /// Registers `f` as map UDF `name` (as [`map_fn`] wraps it).
    pub fn register_map<I, O, E, F, Fut>(mut self, name: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
    {
        let f = Arc::new(f);
        self.insert(
            name,
            "map",
            Arc::new(move |params: &[&str], output: &str| {
                let f = Arc::clone(&f);
                map_fn(params, output, move |i: I| f(i)).map(Udf::Map)
            }),
        );
        self
    }

    /// Registers `f` as gen UDF `name` (as [`gen_fn`] wraps it).
    pub fn register_gen<I, O, E, F, S>(mut self, name: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + Send + 'static,
        F: Fn(I) -> S + Send + Sync + 'static,
        S: futures::Stream<Item = Result<O, E>> + Send + 'static,
    {
        let f = Arc::new(f);
        self.insert(
            name,
            "gen",
            Arc::new(move |params: &[&str], output: &str| {
                let f = Arc::clone(&f);
                gen_fn(params, output, move |i: I| f(i)).map(Udf::Gen)
            }),
        );
        self
    }

    /// Registers `f` as batch_map UDF `name` (as [`batch_map_fn`] wraps it).
    pub fn register_batch_map<I, O, E, F, Fut>(mut self, name: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>, E>> + Send + 'static,
    {
        let f = Arc::new(f);
        self.insert(
            name,
            "batch_map",
            Arc::new(move |params: &[&str], output: &str| {
                let f = Arc::clone(&f);
                batch_map_fn(params, output, move |i: Vec<I>| f(i)).map(Udf::BatchMap)
            }),
        );
        self
    }

    /// Registers `f` as agg UDF `name` (as [`agg_fn`] wraps it).
    pub fn register_agg<I, O, E, F, Fut>(mut self, name: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>, E>> + Send + 'static,
    {
        let f = Arc::new(f);
        self.insert(
            name,
            "agg",
            Arc::new(move |params: &[&str], output: &str| {
                let f = Arc::clone(&f);
                agg_fn(params, output, move |i: Vec<I>| f(i)).map(|udf| Udf::Agg {
                    udf,
                    partition_by: vec![],
                })
            }),
        );
        self
    }

    /// Registers a UDF object under its signature's name, as it is: plans
    /// naming it must read its params and write its output column.
    pub fn register(mut self, udf: Udf) -> Self {
        let name = udf.signature().name.clone();
        let kind = udf.kind_name();
        self.insert(
            &name,
            kind,
            Arc::new(move |_: &[&str], _: &str| Ok(udf.clone())),
        );
        self
    }

    /// Loads the UDFs that travel as code of `runtime` (`"python"`) with
    /// `load` (see [`CodeLoader`]).
    pub fn register_runtime(mut self, runtime: &str, load: CodeLoader) -> Self {
        self.runtimes.insert(runtime.to_string(), load);
        self
    }

    /// Every registered name.
    pub fn names(&self) -> Vec<String> {
        self.makers.keys().cloned().collect()
    }

    /// Whether a UDF named `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.makers.contains_key(name)
    }

    /// The UDF of kind `kind` (`map`, `gen`, `batch_map`, `agg`) named
    /// `sig.name`, built for `sig`'s params and output, carrying `sig`'s name;
    /// or, when it travels as `code`, loaded by its runtime's loader.
    /// `node` names this node in the error when the UDF cannot run here.
    pub fn resolve(
        &self,
        kind: &str,
        sig: &Signature,
        partition_by: &[String],
        code: Option<&Code>,
        node: &str,
    ) -> Result<Udf> {
        let unknown = |reason: String| Error::UnknownUdf {
            udf: sig.name.clone(),
            node: node.to_string(),
            reason,
        };
        if let Some(code) = code {
            let Some(load) = self.runtimes.get(&code.runtime) else {
                return Err(unknown(format!(
                    "it is a {runtime} UDF and this node runs no {runtime} UDFs \
                     (start the executors with `python -m udfchain cluster executor`)",
                    runtime = code.runtime
                )));
            };
            return load(kind, sig, partition_by, &code.bytes).map_err(unknown);
        }
        let params: Vec<&str> = sig.params.iter().map(String::as_str).collect();
        // An image decoder travels as its spec, written in its name.
        if let (Some(spec), "map", [param]) = (DecodeSpec::from_name(&sig.name), kind, &params[..])
        {
            let made =
                decode_udf(param, sig.output.name(), spec).map_err(|e| unknown(e.to_string()))?;
            return Ok(Udf::Map(made).renamed(sig, partition_by));
        }
        let Some((registered, make)) = self.makers.get(&sig.name) else {
            let known = self.names();
            return Err(unknown(if known.is_empty() {
                "no UDF is registered there".to_string()
            } else {
                format!("registered there: {}", known.join(", "))
            }));
        };
        if *registered != kind {
            return Err(unknown(format!(
                "it is registered there as a {registered} UDF, the plan calls a {kind} UDF"
            )));
        }
        let made = make(&params, sig.output.name()).map_err(|e| unknown(e.to_string()))?;
        if made.signature().output.data_type() != sig.output.data_type() {
            return Err(unknown(format!(
                "its output type there is {}, the plan expects {}",
                made.signature().output.data_type(),
                sig.output.data_type()
            )));
        }
        Ok(made.renamed(sig, partition_by))
    }
}

/// The UDF a plan names, on a node that plans but never runs UDFs (the
/// scheduler): its signature, and an error if it is ever called.
pub(crate) fn placeholder(
    kind: &str,
    sig: &Signature,
    partition_by: &[String],
    code: Option<Code>,
) -> Result<Udf> {
    let p = Arc::new(Placeholder {
        sig: sig.clone(),
        code,
    });
    Ok(match kind {
        "map" => Udf::Map(p),
        "gen" => Udf::Gen(p),
        "batch_map" => Udf::BatchMap(p),
        "agg" => Udf::Agg {
            udf: p,
            partition_by: partition_by.to_vec(),
        },
        other => {
            return Err(Error::plan(format!(
                "UDF {}: unknown UDF kind {other:?} in a cluster plan",
                sig.name
            )));
        }
    })
}

#[derive(Debug)]
struct Placeholder {
    sig: Signature,
    /// The UDF's code, passed on to the executors.
    code: Option<Code>,
}

impl Placeholder {
    fn fail(&self) -> CallError {
        let msg = format!(
            "UDF {} was planned on a node that does not run UDFs (a scheduler)",
            self.sig.name
        );
        CallError::from(UdfError::Contract(msg))
    }
}

#[async_trait]
impl Mapper for Placeholder {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    fn code(&self) -> Result<Option<Code>, UdfError> {
        Ok(self.code.clone())
    }
    async fn map(&self, _input: RecordBatch) -> Result<ArrayRef, CallError> {
        Err(self.fail())
    }
}

impl Generator for Placeholder {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    fn code(&self) -> Result<Option<Code>, UdfError> {
        Ok(self.code.clone())
    }
    fn generate(
        &self,
        _input: RecordBatch,
        _max_rows: usize,
    ) -> BoxStream<'static, Result<ArrayRef, CallError>> {
        let e = self.fail();
        Box::pin(futures::stream::once(async move { Err(e) }))
    }
}

#[async_trait]
impl BatchMapper for Placeholder {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    fn code(&self) -> Result<Option<Code>, UdfError> {
        Ok(self.code.clone())
    }
    async fn map_batch(&self, _input: RecordBatch) -> Result<ArrayRef, CallError> {
        Err(self.fail())
    }
}

#[async_trait]
impl Aggregator for Placeholder {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    fn code(&self) -> Result<Option<Code>, UdfError> {
        Ok(self.code.clone())
    }
    async fn aggregate(&self, _group: RecordBatch) -> Result<ArrayRef, CallError> {
        Err(self.fail())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field};

    async fn double(x: u64) -> Result<u64, std::io::Error> {
        Ok(x * 2)
    }

    fn sig(name: &str, output: DataType) -> Signature {
        Signature {
            name: name.into(),
            params: vec!["x".into()],
            input: Some(DataType::UInt64),
            output: Field::new("y", output, true),
        }
    }

    #[test]
    fn a_registered_function_is_rebuilt_for_the_plan_under_its_name() {
        let r = UdfRegistry::new().register_map("double", double);
        let udf = r
            .resolve("map", &sig("double", DataType::UInt64), &[], None, "exec 1")
            .expect("resolve");
        let s = udf.signature();
        assert_eq!((s.name.as_str(), s.output.name().as_str()), ("double", "y"));
        assert_eq!(s.params, vec!["x".to_string()]);
        assert_eq!(udf.kind_name(), "map");
    }

    #[test]
    fn an_unknown_name_a_wrong_kind_or_type_names_the_udf_and_the_node() {
        let r = UdfRegistry::new().register_map("double", double);
        let err = |kind: &str, s: Signature| {
            r.resolve(kind, &s, &[], None, "executor e1 at 10.0.0.1:50051")
                .expect_err("refused")
                .to_string()
        };
        let unknown = err("map", sig("triple", DataType::UInt64));
        assert_eq!(
            unknown,
            "UDF triple is not available on executor e1 at 10.0.0.1:50051: registered there: double"
        );
        let kind = err("gen", sig("double", DataType::UInt64));
        assert!(kind.contains("registered there as a map UDF"), "{kind}");
        let typed = err("map", sig("double", DataType::Utf8));
        assert!(typed.contains("output type there is UInt64"), "{typed}");
        let empty = UdfRegistry::new()
            .resolve("map", &sig("x", DataType::UInt64), &[], None, "n")
            .expect_err("empty")
            .to_string();
        assert!(empty.ends_with("no UDF is registered there"), "{empty}");
    }

    #[test]
    fn code_goes_to_its_runtimes_loader_and_a_node_without_one_names_it() {
        let code = Code {
            runtime: "python".into(),
            bytes: b"pickled".to_vec().into(),
        };
        let s = sig("f", DataType::UInt64);
        let none = UdfRegistry::with_builtins()
            .resolve("map", &s, &[], Some(&code), "executor e1 at h:1")
            .expect_err("no python runtime")
            .to_string();
        assert!(
            none.contains("it is a python UDF and this node runs no python UDFs")
                && none.contains("python -m udfchain cluster executor"),
            "{none}"
        );
        let loader: CodeLoader = Arc::new(|kind, sig, _, bytes| {
            if bytes != b"pickled" {
                return Err(format!("cannot import module for {}", sig.name));
            }
            assert_eq!(kind, "map");
            Ok(Udf::Map(Arc::new(Placeholder {
                sig: sig.clone(),
                code: None,
            })))
        });
        let r = UdfRegistry::new().register_runtime("python", loader);
        let udf = r.resolve("map", &s, &[], Some(&code), "n").expect("loaded");
        assert_eq!(udf.signature().name, "f");
        let bad = Code {
            bytes: b"other".to_vec().into(),
            ..code
        };
        let err = r
            .resolve("map", &s, &[], Some(&bad), "executor e2 at h:2")
            .expect_err("loader's error")
            .to_string();
        assert_eq!(
            err,
            "UDF f is not available on executor e2 at h:2: cannot import module for f"
        );
    }

    #[test]
    fn the_builtins_include_the_script_udfs_and_the_tar_generators() {
        let r = UdfRegistry::with_builtins();
        for name in ["sha256", "file_size", "line_count", "tar_members"] {
            assert!(r.contains(name), "{name}");
        }
    }
}
