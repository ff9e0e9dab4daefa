//! Built-in UDFs by name in SQL: `SELECT sha256(file) FROM read_storage('...')`.
//!
//! Each name is registered as a scalar function so DataFusion's SQL planner
//! resolves and types it; the [`BuiltinRewrite`] analyzer rule then replaces
//! every such call in a projection by a `map` UDF node under it — so the call
//! gets the same `PrefetchExec` as from the Rust API. `image_size` reads only the
//! header, so it is planned with `prefetch = 0`.

use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, Projection, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use udfchain_udfs::builtins::{file_size, image_size, line_count, md5, read_text, sha256};
use udfchain_udfs::{Mapper, UdfError, map_fn};

use crate::chain::Settings;
use crate::plan::{UdfKind, UdfNode};

/// Builds the UDF for a call: `make(param column, output column)`.
pub type Make = Arc<dyn Fn(&str, &str) -> Result<Arc<dyn Mapper>, UdfError> + Send + Sync>;

/// A scalar UDF callable by name in scripts: its constructor and whether it
/// reads only a header (then it is planned with `prefetch = 0`).
#[derive(Clone)]
pub struct Builtin {
    pub name: String,
    make: Make,
    header_only: bool,
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Builtin({})", self.name)
    }
}

impl Builtin {
    pub fn new(name: &str, header_only: bool, make: Make) -> Self {
        Self {
            name: name.to_string(),
            make,
            header_only,
        }
    }

    /// The scalar-function stub DataFusion resolves this name to.
    pub fn stub(&self) -> Option<ScalarUDF> {
        let udf = (self.make)("file", "out").ok()?;
        Some(ScalarUDF::new_from_impl(Stub {
            name: self.name.clone(),
            output: udf.signature().output.data_type().clone(),
            signature: Signature::any(1, Volatility::Volatile),
        }))
    }
}

/// Every built-in scalar UDF.
pub fn builtins() -> Vec<Builtin> {
    type MakeFn = fn(&str, &str) -> Result<Arc<dyn Mapper>, UdfError>;
    fn b(name: &str, make: MakeFn, header_only: bool) -> Builtin {
        Builtin::new(name, header_only, Arc::new(make))
    }
    vec![
        b("file_size", |p, o| map_fn(&[p], o, file_size), false),
        b("sha256", |p, o| map_fn(&[p], o, sha256), false),
        b("md5", |p, o| map_fn(&[p], o, md5), false),
        b("read_text", |p, o| map_fn(&[p], o, read_text), false),
        b("line_count", |p, o| map_fn(&[p], o, line_count), false),
        b("image_size", |p, o| map_fn(&[p], o, image_size), true),
    ]
}

/// The scalar-function stub DataFusion resolves a built-in name to.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Stub {
    name: String,
    output: DataType,
    signature: Signature,
}

impl ScalarUDFImpl for Stub {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(self.output.clone())
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        Err(DataFusionError::Plan(format!(
            "{}() takes a column and must be called in a SELECT list",
            self.name
        )))
    }
}

/// Rewrites built-in calls in projections into UDF nodes with the script's
/// current settings.
#[derive(Debug)]
pub struct BuiltinRewrite {
    pub settings: Arc<Mutex<Settings>>,
    pub udfs: Arc<Mutex<Vec<Builtin>>>,
}

impl AnalyzerRule for BuiltinRewrite {
    fn name(&self) -> &str {
        "udfchain_builtins"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        let settings = self
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let table = self.udfs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut next = 0usize;
        plan.transform_up(|node| {
            let LogicalPlan::Projection(p) = node else {
                return Ok(Transformed::no(node));
            };
            let mut input = Arc::unwrap_or_clone(p.input.clone());
            let mut changed = false;
            let mut exprs = Vec::with_capacity(p.expr.len());
            for e in &p.expr {
                let name = e.schema_name().to_string();
                let rewritten = e.clone().transform_up(|x| {
                    let Expr::ScalarFunction(ScalarFunction { func, args }) = &x else {
                        return Ok(Transformed::no(x));
                    };
                    let Some(b) = table.iter().find(|b| b.name == func.name()) else {
                        return Ok(Transformed::no(x));
                    };
                    let [Expr::Column(c)] = args.as_slice() else {
                        return Err(DataFusionError::Plan(format!(
                            "{}() takes one column, e.g. {}(file)",
                            b.name, b.name
                        )));
                    };
                    let out = format!("__{}_{next}", b.name);
                    next += 1;
                    let udf = (b.make)(&c.name, &out)
                        .map_err(|e| DataFusionError::Plan(e.to_string()))?;
                    let mut s = settings.clone();
                    if b.header_only {
                        s = s.prefetch(0);
                    }
                    let node = UdfNode::try_new(input.clone(), UdfKind::Map(udf), s)
                        .map_err(|e| e.into_df())?;
                    input = node.into_plan();
                    changed = true;
                    Ok(Transformed::yes(datafusion::prelude::col(out)))
                })?;
                let expr = if rewritten.transformed {
                    rewritten.data.alias(name)
                } else {
                    rewritten.data
                };
                exprs.push(expr);
            }
            if !changed {
                return Ok(Transformed::no(LogicalPlan::Projection(p)));
            }
            Ok(Transformed::yes(LogicalPlan::Projection(
                Projection::try_new(exprs, Arc::new(input))?,
            )))
        })
        .map(|t| t.data)
    }
}
