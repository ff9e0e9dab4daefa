//! Built-in and registered UDFs by name in SQL, wherever an expression stands:
//! `SELECT count(sha256(file)) FROM read_storage('...') WHERE line_count(file) > 1`.
//!
//! Each name is registered as a scalar function stub so DataFusion's SQL planner
//! resolves and types it; the [`BuiltinRewrite`] analyzer rule (it runs after
//! type coercion, before every optimizer rule) then replaces each call in a
//! projection, filter, sort, aggregate, window or join, in subqueries and CTEs
//! too, by a column of a `map` UDF node placed directly on that operator's
//! input, so the call gets the same `PrefetchExec` as from the Rust API.
//! Guarantees:
//! - output names stay as written (`count(sha256(...))` keeps its name);
//! - one UDF over the same column twice in a statement is one node, run once
//!   per row: its column flows up through filters, sorts, limits and the
//!   projections that keep the column, to the operator that reads it;
//! - `WHERE` conjuncts that call no UDF filter below the UDF nodes, so the rows
//!   they drop are never fetched; the optimizer cannot push a filter or a
//!   projection through a UDF node (see `plan/node.rs`), so nothing above moves
//!   below it;
//! - a call over a column of the enclosing query (a correlated subquery) gets
//!   its node on the enclosing operator's input, and nodes go below a
//!   subquery's correlated filters, so decorrelation still applies;
//! - a call over a `File`-valued expression (`sha256(file_from_url(url))`)
//!   gets the expression projected as a column of the input holding its
//!   columns (once per statement for the same expression), then the node;
//! - a call whose argument is no File is a plan error naming the UDF and what
//!   it takes.
//!
//! `image_size` reads only the header, so it is planned with `prefetch = 0`.
//! The image decoders take constants after the File column
//! (`image_decode(file, 'RGB')`, `image_thumbnail(file, 256)`), and a decode
//! under a convert or a resize of constant arguments is fused into one node
//! (see `builtins/image_calls.rs`): calls of one spec over one column are one node.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Column;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr::{Exists, InSubquery, ScalarFunction, SetComparison};
use datafusion::logical_expr::expr_rewriter::{NamePreserver, SavedName};
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, Filter, LogicalPlan, Projection, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, Subquery, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use udfchain_udfs::builtins::image::{DecodeInput, DecodeSpec, decode_udf};
use udfchain_udfs::builtins::{file_size, image_size, line_count, md5, read_text, sha256};
use udfchain_udfs::engine::is_binary;
use udfchain_udfs::{File, Mapper, UdfError, map_fn};

use crate::plan::{Udf, UdfNode};
use crate::settings::Settings;
use crate::util::lock::lock;

/// Builds the UDF for a call: `make(param column, output column)`.
pub type Make = Arc<dyn Fn(&str, &str) -> Result<Arc<dyn Mapper>, UdfError> + Send + Sync>;

mod image_calls;

/// A scalar UDF callable by name in scripts: its constructor and whether it
/// reads only a header (then it is planned with `prefetch = 0`).
#[derive(Clone)]
pub struct Builtin {
    pub name: String,
    make: Make,
    header_only: bool,
    /// For an image decoder, what it decodes (its constant arguments after
    /// the File column refine it: see [`image_calls::spec_for`]).
    decode: Option<DecodeSpec>,
    /// What makes two calls one node: the name, or a decoder's spec.
    key: String,
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
            decode: None,
            key: name.to_string(),
        }
    }

    /// This decoder reading the encoded images from a binary column.
    fn over_bytes(&self) -> Builtin {
        match self.decode {
            Some(spec) => Self::decoder(
                &self.name,
                DecodeSpec {
                    input: DecodeInput::Bytes,
                    ..spec
                },
            ),
            None => self.clone(),
        }
    }

    /// Whether this built-in reads a binary column (a decoder of bytes).
    fn takes_bytes(&self) -> bool {
        self.decode.is_some_and(|d| d.input == DecodeInput::Bytes)
    }

    /// The image decoder `name` decoding as `spec` says.
    fn decoder(name: &str, spec: DecodeSpec) -> Self {
        let mut b = Self::new(name, false, Arc::new(move |p, o| decode_udf(p, o, spec)));
        b.decode = Some(spec);
        b.key = spec.name();
        b
    }

    /// This built-in for a call's arguments after its File column (none, or
    /// a decoder's constants) under `settings` (a decoder's pixel limit).
    fn for_args(&self, rest: &[Expr], settings: &Settings) -> DfResult<Builtin> {
        match self.decode {
            Some(base) => {
                let mut spec = image_calls::spec_for(&self.name, base, rest)?;
                spec.max_pixels = settings.get_max_image_pixels();
                Ok(Self::decoder(&self.name, spec))
            }
            None if rest.is_empty() => Ok(self.clone()),
            None => plan(format!(
                "{}; got {} arguments",
                self.takes(),
                rest.len() + 1
            )),
        }
    }

    /// What this built-in takes, for its plan errors: an image decoder also
    /// takes a binary column.
    fn takes(&self) -> String {
        let name = &self.name;
        if self.decode.is_some() {
            format!("{name}() takes a File column or a binary column, e.g. {name}(file)")
        } else {
            format!("{name}() takes a File column, e.g. {name}(file)")
        }
    }

    /// The UDF for a call reading column `param`, writing column `output`.
    pub fn make(&self, param: &str, output: &str) -> Result<Arc<dyn Mapper>, UdfError> {
        (self.make)(param, output)
    }

    /// The scalar-function stub DataFusion resolves this name to.
    pub fn stub(&self) -> Option<ScalarUDF> {
        let udf = (self.make)("file", "out").ok()?;
        Some(ScalarUDF::new_from_impl(Stub {
            name: self.name.clone(),
            output: udf.signature().output.data_type().clone(),
            signature: Signature::variadic_any(Volatility::Volatile),
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
        Builtin::decoder("image_decode", DecodeSpec::default()),
        Builtin::decoder("image_thumbnail", DecodeSpec::thumbnail(256)),
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
        plan(format!(
            "{}() takes a File column of a table, e.g. {}(file) FROM read_storage('...')",
            self.name, self.name
        ))
    }
}

/// Rewrites built-in and registered UDF calls, wherever an expression stands,
/// into UDF nodes with the script's current settings.
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
        let table = lock(&self.udfs).clone();
        let mut any = false;
        plan.apply_with_subqueries(|p| {
            for e in p.expressions() {
                any |= calls_udf(&table, &e)?;
            }
            Ok(if any {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })?;
        if !any {
            return Ok(plan);
        }
        let mut taken = HashSet::new();
        plan.apply_with_subqueries(|p| {
            taken.extend(p.schema().fields().iter().map(|f| f.name().clone()));
            Ok(TreeNodeRecursion::Continue)
        })?;
        let settings = lock(&self.settings).clone();
        let mut rewriter = Rewriter {
            table,
            settings,
            taken,
            next: 0,
            made: Vec::new(),
            projected: Vec::new(),
            generated: HashSet::new(),
        };
        let plan = plan
            .transform_up_with_subqueries(|node| rewriter.node(node))?
            .data;
        rewriter.restore(plan)
    }
}

/// One UDF node made by the rewrite: `udf(arg)` is column `out` above it.
struct Made {
    udf: String,
    arg: Column,
    out: String,
}

/// The state of one rewrite: the columns it generated (UDF outputs, and
/// arguments renamed where their name alone was ambiguous) and the calls made.
struct Rewriter {
    table: Vec<Builtin>,
    settings: Settings,
    taken: HashSet<String>,
    next: usize,
    made: Vec<Made>,
    /// `File` expressions given to a UDF, each projected as this column.
    projected: Vec<(Expr, String)>,
    generated: HashSet<String>,
}

impl Rewriter {
    /// A column name unused anywhere in the statement.
    fn fresh(&mut self, base: &str) -> String {
        loop {
            let name = format!("__{base}_{}", self.next);
            self.next += 1;
            if self.taken.insert(name.clone()) {
                self.generated.insert(name.clone());
                return name;
            }
        }
    }

    fn has_generated(&self, plan: &LogicalPlan) -> bool {
        plan.schema()
            .fields()
            .iter()
            .any(|f| self.generated.contains(f.name()))
    }

    /// `plan` without the generated columns it carries (its schema before the
    /// rewrite).
    fn restore(&self, plan: LogicalPlan) -> DfResult<LogicalPlan> {
        if !self.has_generated(&plan) {
            return Ok(plan);
        }
        let keep = plan
            .schema()
            .iter()
            .filter(|(_, f)| !self.generated.contains(f.name()))
            .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())))
            .collect::<Vec<_>>();
        Ok(LogicalPlan::Projection(Projection::try_new(
            keep,
            Arc::new(plan),
        )?))
    }

    /// Visits one node, its children already rewritten.
    ///
    /// Generated columns flow up through filters, sorts, limits, windows and
    /// joins, and through projections that keep their argument (so a call
    /// above reuses a node made below); aggregates end them, and every other
    /// node (subquery, alias, union, distinct, ...) gets its children's schemas
    /// back, so its own schema stays valid. The statement's root gets its
    /// schema back too.
    fn node(&mut self, plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
        let extras = plan.inputs().iter().any(|c| self.has_generated(c));
        let plan = match plan {
            LogicalPlan::Filter(_)
            | LogicalPlan::Sort(_)
            | LogicalPlan::Limit(_)
            | LogicalPlan::Projection(_)
            | LogicalPlan::Aggregate(_) => plan,
            LogicalPlan::Window(_) | LogicalPlan::Join(_) if extras => plan.recompute_schema()?,
            _ if extras => {
                plan.map_children(|c| Ok(Transformed::yes(self.restore(c)?)))?
                    .data
            }
            _ => plan,
        };
        let rewritten = match plan {
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::Sort(_)
            | LogicalPlan::Aggregate(_)
            | LogicalPlan::Window(_)
            | LogicalPlan::Join(_) => self.exprs(plan)?,
            _ => Transformed::no(plan),
        };
        let Transformed {
            data, transformed, ..
        } = rewritten;
        let (data, passed) = match data {
            LogicalPlan::Projection(p) => self.pass_through(p)?,
            other => (other, false),
        };
        Ok(Transformed::new_transformed(
            data,
            transformed || extras || passed,
        ))
    }

    /// Appends to a projection the UDF outputs of its input whose argument it
    /// keeps as is, so an `ORDER BY` above reuses them.
    fn pass_through(&self, p: Projection) -> DfResult<(LogicalPlan, bool)> {
        let input = p.input.schema();
        let out = &p.schema;
        let more: Vec<Expr> = self
            .made
            .iter()
            .filter(|m| {
                input.has_column_with_unqualified_name(&m.out)
                    && !out.has_column_with_unqualified_name(&m.out)
                    && p.expr
                        .iter()
                        .any(|e| matches!(e, Expr::Column(c) if *c == m.arg))
            })
            .map(|m| Expr::Column(Column::new_unqualified(m.out.clone())))
            .collect();
        if more.is_empty() {
            return Ok((LogicalPlan::Projection(p), false));
        }
        let mut exprs = p.expr;
        exprs.extend(more);
        Ok((
            LogicalPlan::Projection(Projection::try_new(exprs, p.input)?),
            true,
        ))
    }

    /// Replaces the UDF calls in `plan`'s expressions by columns of UDF nodes
    /// placed directly on its inputs; output names stay as they were.
    fn exprs(&mut self, plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
        let plan = match plan {
            LogicalPlan::Filter(f) => LogicalPlan::Filter(self.split(f)?),
            other => other,
        };
        let exprs = plan.expressions();
        let mut any = false;
        for e in &exprs {
            any |= calls_udf(&self.table, e)?;
        }
        if !any {
            return Ok(Transformed::no(plan));
        }
        let names = matches!(
            plan,
            LogicalPlan::Projection(_) | LogicalPlan::Aggregate(_) | LogicalPlan::Window(_)
        );
        let preserver = NamePreserver::new(&plan);
        let mut inputs: Vec<LogicalPlan> = plan.inputs().into_iter().cloned().collect();
        let mut new = Vec::with_capacity(exprs.len());
        for e in exprs {
            let saved = if names && !matches!(e, Expr::GroupingSet(_)) {
                preserver.save(&e)
            } else {
                SavedName::None
            };
            let e = image_calls::fuse(e, &self.table)?;
            let e = e.transform_up(|x| self.call(x, &mut inputs))?.data;
            new.push(saved.restore(e));
        }
        Ok(Transformed::yes(plan.with_new_exprs(new, inputs)?))
    }

    /// The conjuncts of a filter that call no UDF (and hold no subquery or
    /// outer reference) go into a filter below the others, so rows they drop are never fetched.
    fn split(&self, f: Filter) -> DfResult<Filter> {
        if !calls_udf(&self.table, &f.predicate)? {
            return Ok(f);
        }
        let mut free = Vec::new();
        let mut rest = Vec::new();
        for e in split_conjunction_owned(f.predicate.clone()) {
            let subquery = e.exists(|x| {
                Ok(matches!(
                    x,
                    Expr::Exists(_)
                        | Expr::InSubquery(_)
                        | Expr::ScalarSubquery(_)
                        | Expr::SetComparison(_)
                        | Expr::OuterReferenceColumn(..)
                ))
            })?;
            if subquery || calls_udf(&self.table, &e)? {
                rest.push(e);
            } else {
                free.push(e);
            }
        }
        let (Some(free), Some(rest)) = (conjunction(free), conjunction(rest)) else {
            return Ok(f);
        };
        let below = Filter::try_new(free, f.input)?;
        Filter::try_new(rest, Arc::new(LogicalPlan::Filter(below)))
    }

    /// `udf(column)` -> the column of a UDF node over the input holding
    /// `column`. A call over a column of an enclosing query (`outer_ref`) is
    /// left for that query's operator (see [`Self::subquery`]); a subquery in
    /// `x` gets those calls resolved against `inputs`.
    fn call(&mut self, x: Expr, inputs: &mut [LogicalPlan]) -> DfResult<Transformed<Expr>> {
        match x {
            Expr::Exists(Exists { subquery, negated }) => {
                let subquery = self.subquery(subquery, inputs)?;
                return Ok(Transformed::yes(Expr::Exists(Exists { subquery, negated })));
            }
            Expr::InSubquery(InSubquery {
                expr,
                subquery,
                negated,
            }) => {
                let subquery = self.subquery(subquery, inputs)?;
                return Ok(Transformed::yes(Expr::InSubquery(InSubquery {
                    expr,
                    subquery,
                    negated,
                })));
            }
            Expr::ScalarSubquery(subquery) => {
                let subquery = self.subquery(subquery, inputs)?;
                return Ok(Transformed::yes(Expr::ScalarSubquery(subquery)));
            }
            Expr::SetComparison(mut cmp) => {
                cmp.subquery = self.subquery(cmp.subquery, inputs)?;
                return Ok(Transformed::yes(Expr::SetComparison(cmp)));
            }
            _ => {}
        }
        let Expr::ScalarFunction(ScalarFunction { func, args }) = &x else {
            return Ok(Transformed::no(x));
        };
        let Some(b) = self.builtin(func) else {
            return Ok(Transformed::no(x));
        };
        let Some((first, rest)) = args.split_first() else {
            return plan(format!("{}; got no argument", b.takes()));
        };
        let mut b = b.for_args(rest, &self.settings)?;
        if matches!(first, Expr::OuterReferenceColumn(..)) {
            return Ok(Transformed::no(x));
        }
        // A decoder over a binary column decodes its bytes as they are.
        if b.decode.is_some() && arg_type(first, inputs)?.as_ref().is_some_and(is_binary) {
            b = b.over_bytes();
        }
        let c = match first {
            Expr::Column(c) => c.clone(),
            other => match self.arg_column(other, inputs, b.takes_bytes())? {
                Some(c) => c,
                None => return plan(format!("{}; got {other}", b.takes())),
            },
        };
        let out = self.node_for(&b, c, inputs)?;
        Ok(Transformed::yes(Expr::Column(Column::new_unqualified(out))))
    }

    /// The built-in a function call is: a fused image decode, or one of the
    /// table's by name.
    fn builtin(&self, func: &ScalarUDF) -> Option<Builtin> {
        if let Some(spec) = image_calls::fused_spec(func) {
            return Some(Builtin::decoder("image_decode", spec));
        }
        self.table.iter().find(|b| b.name == func.name()).cloned()
    }

    /// Resolves, in a subquery's plan, the calls over columns of the
    /// enclosing query: each becomes an outer reference to the output of a
    /// UDF node on `inputs` (the enclosing operator's).
    fn subquery(&mut self, mut sub: Subquery, inputs: &mut [LogicalPlan]) -> DfResult<Subquery> {
        if !subquery_calls(&self.table, &sub)? {
            return Ok(sub);
        }
        let plan = Arc::unwrap_or_clone(sub.subquery);
        let plan = plan
            .transform_up(|p| {
                let preserver = NamePreserver::new(&p);
                let p = p.map_expressions(|e| {
                    let saved = if matches!(e, Expr::GroupingSet(_)) {
                        SavedName::None
                    } else {
                        preserver.save(&e)
                    };
                    let t = e.transform_up(|x| {
                        let Expr::ScalarFunction(ScalarFunction { func, args }) = &x else {
                            return Ok(Transformed::no(x));
                        };
                        let Some(b) = self.builtin(func) else {
                            return Ok(Transformed::no(x));
                        };
                        let [Expr::OuterReferenceColumn(_, c), rest @ ..] = args.as_slice() else {
                            return Ok(Transformed::no(x));
                        };
                        let b = b.for_args(rest, &self.settings)?;
                        let out = self.node_for(&b, c.clone(), inputs)?;
                        let i = inputs
                            .iter()
                            .position(|p| p.schema().has_column_with_unqualified_name(&out))
                            .ok_or_else(|| {
                                DataFusionError::Internal(format!("{out} not in any input"))
                            })?;
                        let field =
                            Arc::clone(inputs[i].schema().field_with_unqualified_name(&out)?);
                        Ok(Transformed::yes(Expr::OuterReferenceColumn(
                            field,
                            Column::new_unqualified(out),
                        )))
                    })?;
                    Ok(t.update_data(|e| saved.restore(e)))
                })?;
                if p.transformed {
                    Ok(Transformed::yes(p.data.recompute_schema()?))
                } else {
                    Ok(p)
                }
            })?
            .data;
        // As DataFusion's SQL planner lists them.
        sub.outer_ref_columns = plan.all_out_ref_exprs();
        sub.subquery = Arc::new(plan);
        Ok(sub)
    }

    /// A `File`-valued expression that is not a column (`file_from_url(url)`),
    /// or a binary-valued one when `bytes` (a decoder's argument), as a
    /// column: projected onto the input holding its columns, once per
    /// statement for the same expression. `None` when it is neither or
    /// reads no single input.
    fn arg_column(
        &mut self,
        e: &Expr,
        inputs: &mut [LogicalPlan],
        bytes: bool,
    ) -> DfResult<Option<Column>> {
        if e.contains_outer() {
            return Ok(None);
        }
        let Some(i) = input_of(e, inputs) else {
            return Ok(None);
        };
        let schema = Arc::clone(inputs[i].schema());
        let t = e.get_type(&schema)?;
        if !(File::is_file_type(&t) || bytes && is_binary(&t)) {
            return Ok(None);
        }
        if let Some((_, name)) = self
            .projected
            .iter()
            .find(|(p, name)| p == e && schema.has_column_with_unqualified_name(name))
        {
            return Ok(Some(Column::new_unqualified(name.clone())));
        }
        let name = self.fresh("file");
        let mut exprs: Vec<Expr> = schema
            .iter()
            .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())))
            .collect();
        exprs.push(e.clone().alias(name.clone()));
        let input = std::mem::take(&mut inputs[i]);
        inputs[i] = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input))?);
        self.projected.push((e.clone(), name.clone()));
        Ok(Some(Column::new_unqualified(name)))
    }

    /// The output column of `b(c)` over the input holding `c`: the node
    /// already made there for the same call, else a new one.
    fn node_for(&mut self, b: &Builtin, c: Column, inputs: &mut [LogicalPlan]) -> DfResult<String> {
        let name = &b.name;
        let Some(i) = inputs.iter().position(|p| p.schema().has_column(&c)) else {
            return plan(format!(
                "{}; column {c} is not an input of this query",
                b.takes()
            ));
        };
        let schema = Arc::clone(inputs[i].schema());
        if let Some(m) = self.made.iter().find(|m| {
            m.udf == b.key && m.arg == c && schema.has_column_with_unqualified_name(&m.out)
        }) {
            return Ok(m.out.clone());
        }
        let (_, field) = schema.qualified_field_from_column(&c)?;
        let arg_type = field.data_type().clone();
        // The node finds its param by name alone: rename an ambiguous one.
        let same_name = schema
            .fields()
            .iter()
            .filter(|f| f.name() == &c.name)
            .count();
        let mut input = inputs[i].clone();
        let param = if same_name == 1 {
            c.name.clone()
        } else {
            let param = self.fresh("arg");
            let mut exprs: Vec<Expr> = schema
                .iter()
                .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())))
                .collect();
            exprs.push(Expr::Column(c.clone()).alias(param.clone()));
            input = LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(input))?);
            param
        };
        let out = self.fresh(name);
        let udf = (b.make)(&param, &out).map_err(|e| DataFusionError::Plan(e.to_string()))?;
        if udf
            .signature()
            .input
            .as_ref()
            .is_some_and(File::is_file_type)
            && !File::is_file_type(&arg_type)
        {
            return plan(format!("{}; {c} is {arg_type}", b.takes()));
        }
        let mut s = self.settings.clone();
        if b.header_only {
            s = s.prefetch(0);
        }
        if b.decode.is_some() {
            // A decode call reads its file, then holds a core for
            // milliseconds: with one call per core a core idles while its
            // call reads (measured locally: 405 files/s at 2 calls on 2
            // cores, 527 at 4, 536 at 8).
            s = s.parallel_by_default(2 * crate::runtime::cores());
        }
        inputs[i] = attach(input, &param, Udf::Map(udf), s)?;
        self.made.push(Made {
            udf: b.key.clone(),
            arg: c,
            out: out.clone(),
        });
        Ok(out)
    }
}

/// A UDF node on `input`, placed below the correlated filters at its top (a
/// subquery's filter over columns of the enclosing query) so the optimizer can
/// still pull them up into a join.
fn attach(input: LogicalPlan, param: &str, kind: Udf, s: Settings) -> DfResult<LogicalPlan> {
    match input {
        LogicalPlan::Filter(f)
            if f.predicate.contains_outer()
                && f.input.schema().has_column_with_unqualified_name(param) =>
        {
            let below = attach(Arc::unwrap_or_clone(f.input), param, kind, s)?;
            Ok(LogicalPlan::Filter(Filter::try_new(
                f.predicate,
                Arc::new(below),
            )?))
        }
        other => Ok(UdfNode::try_new(other, kind, s)
            .map_err(|e| e.into_df())?
            .into_plan()),
    }
}

/// Whether `e` calls one of `table`'s UDFs, or holds a subquery that still
/// does (over a column of the enclosing query).
fn calls_udf(table: &[Builtin], e: &Expr) -> DfResult<bool> {
    e.exists(|x| match x {
        Expr::ScalarFunction(f) => Ok(table.iter().any(|b| b.name == f.func.name())),
        Expr::Exists(Exists { subquery, .. })
        | Expr::InSubquery(InSubquery { subquery, .. })
        | Expr::SetComparison(SetComparison { subquery, .. })
        | Expr::ScalarSubquery(subquery) => subquery_calls(table, subquery),
        _ => Ok(false),
    })
}

/// Whether a subquery's plan (its own nested subqueries included) calls one
/// of `table`'s UDFs.
fn subquery_calls(table: &[Builtin], sub: &Subquery) -> DfResult<bool> {
    let mut found = false;
    sub.subquery.apply_with_subqueries(|p| {
        for e in p.expressions() {
            found |= calls_udf(table, &e)?;
        }
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    Ok(found)
}

/// The index of the input holding every column `e` reads.
fn input_of(e: &Expr, inputs: &[LogicalPlan]) -> Option<usize> {
    let refs = e.column_refs();
    inputs
        .iter()
        .position(|p| refs.iter().all(|c| p.schema().has_column(c)))
}

/// `e`'s type over the input holding its columns (`None`: no one input does).
fn arg_type(e: &Expr, inputs: &[LogicalPlan]) -> DfResult<Option<DataType>> {
    if e.contains_outer() {
        return Ok(None);
    }
    match input_of(e, inputs) {
        Some(i) => Ok(Some(e.get_type(inputs[i].schema())?)),
        None => Ok(None),
    }
}

fn plan<T>(message: String) -> DfResult<T> {
    Err(DataFusionError::Plan(message))
}
