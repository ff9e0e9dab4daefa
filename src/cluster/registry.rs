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

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use futures::stream::BoxStream;
use serde::Serialize;
use serde::de::DeserializeOwned;
use udfchain_udfs::{
    Aggregator, BatchMapper, BoxError, CallError, Generator, Mapper, Signature, UdfError, agg_fn,
    batch_map_fn, gen_fn, map_fn,
};

use udfchain_udfs::builtins::image::{DecodeSpec, decode_udf};

use crate::error::{Error, Result};
use crate::plan::Udf;

/// Builds a UDF for the params and output column a plan names.
type Make = Arc<dyn Fn(&[&str], &str) -> Result<Udf, UdfError> + Send + Sync>;

/// UDFs by name, with the kind each one is.
#[derive(Clone, Default)]
pub struct UdfRegistry {
    makers: BTreeMap<String, (&'static str, Make)>,
}

impl fmt::Debug for UdfRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.makers.keys()).finish()
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

    /// Every registered name.
    pub fn names(&self) -> Vec<String> {
        self.makers.keys().cloned().collect()
    }

    /// Whether a UDF named `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.makers.contains_key(name)
    }

    /// The UDF of kind `kind` (`map`, `gen`, `batch_map`, `agg`) named
    /// `sig.name`, built for `sig`'s params and output, carrying `sig`'s name.
    /// `node` names this node in the error when the name is not registered.
    pub fn resolve(
        &self,
        kind: &str,
        sig: &Signature,
        partition_by: &[String],
        node: &str,
    ) -> Result<Udf> {
        let unknown = |reason: String| Error::UnknownUdf {
            udf: sig.name.clone(),
            node: node.to_string(),
            reason,
        };
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
pub(crate) fn placeholder(kind: &str, sig: &Signature, partition_by: &[String]) -> Result<Udf> {
    let p = Arc::new(Placeholder { sig: sig.clone() });
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
    async fn map(&self, _input: RecordBatch) -> Result<ArrayRef, CallError> {
        Err(self.fail())
    }
}

impl Generator for Placeholder {
    fn signature(&self) -> &Signature {
        &self.sig
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
    async fn map_batch(&self, _input: RecordBatch) -> Result<ArrayRef, CallError> {
        Err(self.fail())
    }
}

#[async_trait]
impl Aggregator for Placeholder {
    fn signature(&self) -> &Signature {
        &self.sig
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
            .resolve("map", &sig("double", DataType::UInt64), &[], "exec 1")
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
            r.resolve(kind, &s, &[], "executor e1 at 10.0.0.1:50051")
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
            .resolve("map", &sig("x", DataType::UInt64), &[], "n")
            .expect_err("empty")
            .to_string();
        assert!(empty.ends_with("no UDF is registered there"), "{empty}");
    }

    #[test]
    fn the_builtins_include_the_script_udfs_and_the_tar_generators() {
        let r = UdfRegistry::with_builtins();
        for name in ["sha256", "file_size", "line_count", "tar_members"] {
            assert!(r.contains(name), "{name}");
        }
    }
}
