//! Dataset verbs on DataFusion's operators: `diff` / `file_diff` (a full
//! outer join and a CASE), `subtract` (a left anti join), `merge` (a join
//! whose right columns are renamed on a clash), `shuffle`, `sample` and
//! `chunk` (a sort, a top-k and a filter on `row_hash`), `explode` (JSON
//! texts to a struct, `explode.rs`).
//!
//! Guarantees: a diff's status is `A` for a key only in this chain, `D` only
//! in the other, `M` in both with a compare value that differs or is null on
//! either side (a null never means "same"), `S` otherwise; a `D` row carries
//! the other chain's values. Null keys equal nothing (such a row is `A` or
//! `D`, and `subtract` keeps it). `shuffle` / `sample` with one seed give the
//! same order / rows for the same rows, on every machine; `chunk(i, n)` for
//! `i` in `0..n` are disjoint and together hold every row once.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchema, JoinConstraint, JoinType, NullEquality, ScalarValue};
use datafusion::logical_expr::{
    Expr, ExprSchemable, Join, LogicalPlan, LogicalPlanBuilder, cast, when,
};
use datafusion::prelude::lit;

use super::{Chain, Step, col, delta::file_change_token};
use crate::error::{Error, Result};
use crate::session::RowHash;

/// What [`Chain::diff`] compares and which rows it keeps (DataChain's
/// `diff` / `file_diff` parameters). `Diff::on(&["id"])` for rows,
/// `Diff::files("file")` for a `File` column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diff {
    on: Vec<String>,
    right_on: Option<Vec<String>>,
    compare: Option<Vec<String>>,
    right_compare: Option<Vec<String>>,
    files: bool,
    added: bool,
    deleted: bool,
    modified: bool,
    same: bool,
    status_col: Option<String>,
}

impl Diff {
    /// Rows matched by the key columns `on` (dots reach into structs);
    /// compared by every other column the two chains share. Keeps added,
    /// deleted and modified rows.
    pub fn on(on: &[&str]) -> Self {
        Self {
            on: on.iter().map(|s| s.to_string()).collect(),
            right_on: None,
            compare: None,
            right_compare: None,
            files: false,
            added: true,
            deleted: true,
            modified: true,
            same: false,
            status_col: None,
        }
    }

    /// Files of the `File` column `on` matched by `source` and `path`,
    /// changed when their change token differs (ETag and version, else size
    /// and last-modified, as delta saves compare; a file with none of them
    /// is always modified). Keeps added and modified files (DataChain's
    /// `file_diff` defaults).
    pub fn files(on: &str) -> Self {
        Self {
            files: true,
            deleted: false,
            ..Self::on(&[on])
        }
    }

    /// The other chain's key columns, when named differently.
    pub fn right_on(mut self, names: &[&str]) -> Self {
        self.right_on = Some(names.iter().map(|s| s.to_string()).collect());
        self
    }

    /// The columns whose values tell a modified row (default: every column
    /// but the keys that both chains have). Not used by `Diff::files`.
    pub fn compare(mut self, names: &[&str]) -> Self {
        self.compare = Some(names.iter().map(|s| s.to_string()).collect());
        self
    }

    /// The other chain's compare columns, when named differently.
    pub fn right_compare(mut self, names: &[&str]) -> Self {
        self.right_compare = Some(names.iter().map(|s| s.to_string()).collect());
        self
    }

    /// Keeps the rows only in this chain (`A`).
    pub fn added(mut self, on: bool) -> Self {
        self.added = on;
        self
    }

    /// Keeps the rows only in the other chain (`D`), with its values.
    pub fn deleted(mut self, on: bool) -> Self {
        self.deleted = on;
        self
    }

    /// Keeps the rows in both whose compare values differ (`M`).
    pub fn modified(mut self, on: bool) -> Self {
        self.modified = on;
        self
    }

    /// Keeps the rows in both with equal compare values (`S`).
    pub fn same(mut self, on: bool) -> Self {
        self.same = on;
        self
    }

    /// Adds the status (`A`, `D`, `M`, `S`) as a last column of this name.
    pub fn status_col(mut self, name: &str) -> Self {
        self.status_col = Some(name.to_string());
        self
    }
}

#[derive(Clone)]
pub(super) enum Verb {
    Diff {
        other: Box<Chain>,
        diff: Diff,
    },
    Subtract {
        other: Box<Chain>,
        on: Option<Vec<String>>,
        right_on: Option<Vec<String>>,
    },
    Order {
        seed: u64,
        limit: Option<usize>,
    },
    Chunk {
        index: u64,
        total: u64,
    },
    Explode {
        column: String,
        out: String,
        sample: usize,
    },
    Merge {
        right: Box<Chain>,
        on: Vec<String>,
        right_on: Vec<String>,
        how: JoinType,
        rname: String,
    },
}

/// A seed drawn from the OS, for `shuffle` / `sample` without one.
fn random_seed() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    })
}

impl Chain {
    /// Compares this chain with `other` by key (DataChain's `diff` and, with
    /// [`Diff::files`], `file_diff`): rows added (`A`), deleted (`D`),
    /// modified (`M`) or the same (`S`), as `diff` says which to keep; the
    /// columns of this chain, plus the status if [`Diff::status_col`] names it.
    ///
    /// ```no_run
    /// use udfchain::{Chain, Diff};
    ///
    /// # async fn run() -> udfchain::Result<()> {
    /// let new = Chain::from_dataset_version("images", 2);
    /// let old = Chain::from_dataset_version("images", 1);
    /// let changed = new.diff(old, Diff::on(&["id"]).status_col("status"));
    /// changed.show(10).await?;
    /// # Ok(()) }
    /// ```
    pub fn diff(self, other: Chain, diff: Diff) -> Self {
        self.step(Step::Verb(Verb::Diff {
            other: Box::new(other),
            diff,
        }))
    }

    /// Same as `diff(other, Diff::files(on))` with `diff`'s flags: files of
    /// the `File` column named like `diff`'s `on`, compared by their change token.
    pub fn file_diff(self, other: Chain, diff: Diff) -> Self {
        let diff = Diff {
            files: true,
            ..diff
        };
        self.diff(other, diff)
    }

    /// The rows of this chain whose `on` values (all columns when `None`) are
    /// not among `other`'s `right_on` (default: `on`) values: a left anti join.
    pub fn subtract(self, other: Chain, on: Option<&[&str]>, right_on: Option<&[&str]>) -> Self {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        self.step(Step::Verb(Verb::Subtract {
            other: Box::new(other),
            on: on.map(names),
            right_on: right_on.map(names),
        }))
    }

    /// The rows in an order drawn from `seed` (a random seed when `None`,
    /// drawn once, at this call): the same order for the same seed and rows.
    pub fn shuffle(self, seed: Option<u64>) -> Self {
        let seed = seed.unwrap_or_else(random_seed);
        self.step(Step::Verb(Verb::Order { seed, limit: None }))
    }

    /// `n` rows (all if there are fewer), chosen by `seed` (random when
    /// `None`): the same rows for the same seed and rows.
    pub fn sample(self, n: usize, seed: Option<u64>) -> Self {
        let seed = seed.unwrap_or_else(random_seed);
        self.step(Step::Verb(Verb::Order {
            seed,
            limit: Some(n),
        }))
    }

    /// DataChain's `merge`: joins `right` on equal `on` / `right_on` values
    /// (dots reach into structs; `right_on` empty: `on`), `how` one of
    /// `Left` (DataChain's default), `Inner`, `Full`; keeps every column of
    /// both, a right column whose name this chain has renamed `rname` + name
    /// (DataChain's default `right_`).
    pub fn merge(
        self,
        right: Chain,
        on: &[&str],
        right_on: &[&str],
        how: JoinType,
        rname: &str,
    ) -> Self {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let right_on = if right_on.is_empty() { on } else { right_on };
        self.step(Step::Verb(Verb::Merge {
            right: Box::new(right),
            on: names(on),
            right_on: names(right_on),
            how,
            rname: rname.to_string(),
        }))
    }

    /// DataChain's `explode`: column `out` (default `<column>_expl`), the
    /// JSON objects of the text column `column` as a struct whose fields are
    /// inferred from its first `schema_sample_size` (at least 1) non-null
    /// rows. A row that is not a JSON object, or whose values do not fit the
    /// inferred types, fails the run naming the row; fields the sample did
    /// not show are dropped.
    pub fn explode(self, column: &str, out: Option<&str>, schema_sample_size: usize) -> Self {
        let out = out.map_or_else(|| format!("{column}_expl"), str::to_string);
        self.step(Step::Verb(Verb::Explode {
            column: column.to_string(),
            out,
            sample: schema_sample_size.max(1),
        }))
    }

    /// Part `index` of `total` (`0 <= index < total`): the rows whose content
    /// hashes to `index` modulo `total`. The parts of one dataset version are
    /// disjoint and hold every row once; a row's part depends on its values only.
    pub fn chunk(self, index: usize, total: usize) -> Self {
        if total == 0 || index >= total {
            return self.fail(Error::plan(format!(
                "chunk({index}, {total}): the index is from 0 to total - 1"
            )));
        }
        self.step(Step::Verb(Verb::Chunk {
            index: index as u64,
            total: total as u64,
        }))
    }
}

fn named(name: &str) -> Expr {
    Expr::Column(Column::from_name(name))
}

/// The plan's own columns, by qualified reference.
fn own_columns(plan: &LogicalPlan) -> Vec<Expr> {
    plan.schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect()
}

/// `row_hash(seed, every column)`.
fn content_hash(plan: &LogicalPlan, seed: u64) -> Expr {
    let mut args = vec![lit(seed)];
    args.extend(own_columns(plan));
    RowHash::udf().call(args)
}

/// The leaf paths under `path` (itself unless it is a struct): structs are
/// compared and joined field by field.
fn leaves(schema: &DFSchema, path: &str) -> Result<Vec<String>> {
    let t = col(path)
        .get_type(schema)
        .map_err(|e| Error::plan(format!("no column {path:?}: {e}")))?;
    match t {
        DataType::Struct(fields) => {
            let mut out = Vec::new();
            for f in fields.iter() {
                out.extend(leaves(schema, &format!("{path}.{}", f.name()))?);
            }
            Ok(out)
        }
        _ => Ok(vec![path.to_string()]),
    }
}

fn all_leaves(schema: &DFSchema, paths: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for p in paths {
        out.extend(leaves(schema, p)?);
    }
    Ok(out)
}

fn top(path: &str) -> &str {
    path.split('.').next().unwrap_or(path)
}

impl Verb {
    pub(super) async fn apply(&self, chain: &Chain, plan: LogicalPlan) -> Result<LogicalPlan> {
        match self {
            Verb::Explode {
                column,
                out,
                sample,
            } => explode_plan(chain, plan, column, out, *sample).await,
            Verb::Diff { other, diff } => diff_plan(plan, other.logical_plan().await?, diff),
            Verb::Subtract {
                other,
                on,
                right_on,
            } => {
                let right = other.logical_plan().await?;
                subtract_plan(plan, right, on.as_deref(), right_on.as_deref())
            }
            Verb::Order { seed, limit } => {
                let own = own_columns(&plan);
                let h = content_hash(&plan, *seed).alias("__uc_hash");
                let b = LogicalPlanBuilder::from(plan)
                    .project(own.iter().cloned().chain([h]))?
                    .sort(vec![named("__uc_hash").sort(true, true)])?;
                let b = match limit {
                    Some(n) => b.limit(0, Some(*n))?,
                    None => b,
                };
                Ok(b.project(own)?.build()?)
            }
            Verb::Merge {
                right,
                on,
                right_on,
                how,
                rname,
            } => merge_plan(plan, right.logical_plan().await?, on, right_on, *how, rname),
            Verb::Chunk { index, total } => {
                let h = content_hash(&plan, 0);
                let keep = (h % lit(*total)).eq(lit(*index));
                Ok(LogicalPlanBuilder::from(plan).filter(keep)?.build()?)
            }
        }
    }
}

/// `names` or, when `None`, every top-level column of `schema`.
fn names_or_all(names: Option<&[String]>, schema: &DFSchema) -> Vec<String> {
    match names {
        Some(n) => n.to_vec(),
        None => schema.fields().iter().map(|f| f.name().clone()).collect(),
    }
}

fn join(left: LogicalPlan, right: LogicalPlan, n: usize, how: JoinType) -> Result<LogicalPlan> {
    let on = (0..n)
        .map(|i| (named(&format!("__uc_lk{i}")), named(&format!("__uc_rk{i}"))))
        .collect();
    key_join(left, right, on, how)
}

/// `left` joined with `right` on the pairs of key expressions `on`, a null
/// key equal to nothing (the rule every verb and delta saves keep: a null
/// never means "the same row").
pub(super) fn key_join(
    left: LogicalPlan,
    right: LogicalPlan,
    on: Vec<(Expr, Expr)>,
    how: JoinType,
) -> Result<LogicalPlan> {
    Ok(LogicalPlan::Join(Join::try_new(
        Arc::new(left),
        Arc::new(right),
        on,
        None,
        how,
        JoinConstraint::On,
        NullEquality::NullEqualsNothing,
        false,
    )?))
}

fn subtract_plan(
    left: LogicalPlan,
    right: LogicalPlan,
    on: Option<&[String]>,
    right_on: Option<&[String]>,
) -> Result<LogicalPlan> {
    let on = names_or_all(on, left.schema());
    let right_on = match right_on {
        Some(r) => r.to_vec(),
        None => on.clone(),
    };
    let lkeys = all_leaves(left.schema(), &on)?;
    let rkeys = all_leaves(right.schema(), &right_on)?;
    if lkeys.len() != rkeys.len() || lkeys.is_empty() {
        return Err(Error::plan(format!(
            "subtract: on {on:?} and right_on {right_on:?} name different numbers of values"
        )));
    }
    let own = own_columns(&left);
    let l = LogicalPlanBuilder::from(left)
        .project(
            own.iter().cloned().chain(
                lkeys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| col(k).alias(format!("__uc_lk{i}"))),
            ),
        )?
        .build()?;
    let r = LogicalPlanBuilder::from(right)
        .project(
            rkeys
                .iter()
                .enumerate()
                .map(|(i, k)| col(k).alias(format!("__uc_rk{i}"))),
        )?
        .build()?;
    let joined = join(l, r, lkeys.len(), JoinType::LeftAnti)?;
    Ok(LogicalPlanBuilder::from(joined).project(own)?.build()?)
}

/// A diff's keys and compare values of each side (expressions over that
/// side), and the compare columns as named.
struct Sides {
    lkeys: Vec<Expr>,
    rkeys: Vec<Expr>,
    lcmp: Vec<Expr>,
    rcmp: Vec<Expr>,
    compare: Vec<String>,
    right_compare: Vec<String>,
}

fn diff_plan(left: LogicalPlan, right: LogicalPlan, d: &Diff) -> Result<LogicalPlan> {
    let ls = Arc::clone(left.schema());
    let rs = Arc::clone(right.schema());
    let right_on = d.right_on.clone().unwrap_or_else(|| d.on.clone());
    if right_on.len() != d.on.len() || d.on.is_empty() {
        return Err(Error::plan(format!(
            "diff: on {:?} and right_on {right_on:?} differ in length",
            d.on
        )));
    }
    // Keys and compare values of each side, as expressions over that side.
    let Sides {
        lkeys,
        rkeys,
        lcmp,
        rcmp,
        compare,
        right_compare,
    } = if d.files {
        if d.on.len() != 1 {
            return Err(Error::plan("file_diff: on names one File column"));
        }
        let (l, r) = (d.on[0].clone(), right_on[0].clone());
        let field = |base: &str, k: &str| col(&format!("{base}.{k}"));
        let token =
            |base: String| file_change_token(move |name| col(&name.replacen("file", &base, 1)));
        Sides {
            lkeys: vec![field(&l, "source"), field(&l, "path")],
            rkeys: vec![field(&r, "source"), field(&r, "path")],
            lcmp: vec![token(l)],
            rcmp: vec![token(r)],
            compare: Vec::new(),
            right_compare: Vec::new(),
        }
    } else {
        let lk = all_leaves(&ls, &d.on)?;
        let rk = all_leaves(&rs, &right_on)?;
        if lk.len() != rk.len() {
            return Err(Error::plan(format!(
                "diff: on {:?} and right_on {right_on:?} have different fields",
                d.on
            )));
        }
        let keys: Vec<&str> = d.on.iter().map(|k| top(k)).collect();
        let compare = match &d.compare {
            Some(c) => c.clone(),
            None => ls
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .filter(|n| {
                    !keys.contains(&n.as_str()) && rs.field_with_unqualified_name(n).is_ok()
                })
                .collect(),
        };
        let right_compare = d.right_compare.clone().unwrap_or_else(|| compare.clone());
        let lc = all_leaves(&ls, &compare)?;
        let rc = all_leaves(&rs, &right_compare)?;
        if lc.len() != rc.len() {
            return Err(Error::plan(format!(
                "diff: compare {compare:?} and right_compare {right_compare:?} have different fields"
            )));
        }
        let exprs = |v: &[String]| v.iter().map(|k| col(k)).collect::<Vec<_>>();
        Sides {
            lkeys: exprs(&lk),
            rkeys: exprs(&rk),
            lcmp: exprs(&lc),
            rcmp: exprs(&rc),
            compare,
            right_compare,
        }
    };
    // Which right column fills a left column in a `D` row.
    let mut from_right: HashMap<String, String> = HashMap::new();
    for (l, r) in
        d.on.iter()
            .zip(&right_on)
            .chain(compare.iter().zip(&right_compare))
    {
        if !l.contains('.') && !r.contains('.') {
            from_right.insert(l.clone(), r.clone());
        }
    }

    let own = own_columns(&left);
    let (nk, nc) = (lkeys.len(), lcmp.len());
    let l = LogicalPlanBuilder::from(left)
        .project(
            own.iter()
                .cloned()
                .chain([lit(true).alias("__uc_lp")])
                .chain(
                    lkeys
                        .into_iter()
                        .enumerate()
                        .map(|(i, k)| k.alias(format!("__uc_lk{i}"))),
                )
                .chain(
                    lcmp.into_iter()
                        .enumerate()
                        .map(|(i, k)| k.alias(format!("__uc_lc{i}"))),
                ),
        )?
        .build()?;
    let r = LogicalPlanBuilder::from(right)
        .project(
            rs.fields()
                .iter()
                .map(|f| col_exact(&rs, f.name()).alias(format!("__uc_r_{}", f.name())))
                .chain([lit(true).alias("__uc_rp")])
                .chain(
                    rkeys
                        .into_iter()
                        .enumerate()
                        .map(|(i, k)| k.alias(format!("__uc_rk{i}"))),
                )
                .chain(
                    rcmp.into_iter()
                        .enumerate()
                        .map(|(i, k)| k.alias(format!("__uc_rc{i}"))),
                ),
        )?
        .build()?;
    let joined = join(l, r, nk, JoinType::Full)?;

    let modified = (0..nc)
        .map(|i| {
            let (a, b) = (named(&format!("__uc_lc{i}")), named(&format!("__uc_rc{i}")));
            a.clone().is_null().or(b.clone().is_null()).or(a.not_eq(b))
        })
        .reduce(Expr::or)
        .unwrap_or(lit(false));
    let status = when(named("__uc_rp").is_null(), lit("A"))
        .when(named("__uc_lp").is_null(), lit("D"))
        .when(modified, lit("M"))
        .otherwise(lit("S"))?;
    let mut columns = Vec::new();
    for (c, (_, field)) in own.iter().zip(ls.iter()) {
        let name = field.name();
        let rname = from_right.get(name).unwrap_or(name);
        let fill = match rs.field_with_unqualified_name(rname) {
            Ok(rf) if rf.data_type() == field.data_type() => named(&format!("__uc_r_{rname}")),
            Ok(_) => cast(named(&format!("__uc_r_{rname}")), field.data_type().clone()),
            Err(_) => cast(lit(ScalarValue::Null), field.data_type().clone()),
        };
        columns.push(
            when(named("__uc_lp").is_null(), fill)
                .otherwise(c.clone())?
                .alias(name),
        );
    }
    let wanted: Vec<Expr> = [
        (d.added, "A"),
        (d.deleted, "D"),
        (d.modified, "M"),
        (d.same, "S"),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, s)| lit(s))
    .collect();
    let keep = if wanted.is_empty() {
        lit(false)
    } else {
        named("__uc_status").in_list(wanted, false)
    };
    let names: Vec<Expr> = ls.fields().iter().map(|f| named(f.name())).collect();
    let mut out = names.clone();
    if let Some(s) = &d.status_col {
        out.push(named("__uc_status").alias(s));
    }
    Ok(LogicalPlanBuilder::from(joined)
        .project(columns.into_iter().chain([status.alias("__uc_status")]))?
        .filter(keep)?
        .project(out)?
        .build()?)
}

/// The one column of `schema` named `name` (with its qualifier).
fn col_exact(schema: &DFSchema, name: &str) -> Expr {
    match schema.qualified_field_with_unqualified_name(name) {
        Ok((q, f)) => Expr::Column(Column::new(q.cloned(), f.name())),
        Err(_) => named(name),
    }
}

fn merge_plan(
    left: LogicalPlan,
    right: LogicalPlan,
    on: &[String],
    right_on: &[String],
    how: JoinType,
    rname: &str,
) -> Result<LogicalPlan> {
    if on.is_empty() || on.len() != right_on.len() {
        return Err(Error::plan(format!(
            "merge: on {on:?} and right_on {right_on:?} name the same number of columns (at least one)"
        )));
    }
    let ls = Arc::clone(left.schema());
    let rs = Arc::clone(right.schema());
    let left_names: Vec<&String> = ls.fields().iter().map(|f| f.name()).collect();
    let own = own_columns(&left);
    let l = LogicalPlanBuilder::from(left)
        .project(
            own.iter().cloned().chain(
                on.iter()
                    .enumerate()
                    .map(|(i, k)| col(k).alias(format!("__uc_lk{i}"))),
            ),
        )?
        .build()?;
    let mut right_out = Vec::new();
    let mut right_cols = Vec::new();
    for f in rs.fields() {
        let mut name = f.name().clone();
        while left_names.contains(&&name) || right_out.contains(&name) {
            name = format!("{rname}{name}");
        }
        right_cols.push(col_exact(&rs, f.name()).alias(&name));
        right_out.push(name);
    }
    let r = LogicalPlanBuilder::from(right)
        .project(
            right_cols.into_iter().chain(
                right_on
                    .iter()
                    .enumerate()
                    .map(|(i, k)| col(k).alias(format!("__uc_rk{i}"))),
            ),
        )?
        .build()?;
    let joined = join(l, r, on.len(), how)?;
    Ok(LogicalPlanBuilder::from(joined)
        .project(own.into_iter().chain(right_out.iter().map(|n| named(n))))?
        .build()?)
}

async fn explode_plan(
    chain: &Chain,
    plan: LogicalPlan,
    column: &str,
    out: &str,
    sample: usize,
) -> Result<LogicalPlan> {
    use datafusion::arrow::array::AsArray;
    let sample_plan = LogicalPlanBuilder::from(plan.clone())
        .project(vec![col(column).alias("__uc_json")])?
        .filter(named("__uc_json").is_not_null())?
        .limit(0, Some(sample))?
        .build()?;
    let batches = datafusion::prelude::DataFrame::new(chain.session.state(), sample_plan)
        .collect()
        .await?;
    let mut texts = Vec::new();
    for b in &batches {
        let a = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8)
            .map_err(|e| Error::plan(format!("explode({column}): not text: {e}")))?;
        texts.extend(a.as_string::<i32>().iter().flatten().map(str::to_string));
    }
    let fields = super::explode::infer_fields(column, &texts).map_err(Error::plan)?;
    let value = super::explode::JsonToStruct::udf(column, fields).call(vec![col(column)]);
    let own = own_columns(&plan);
    Ok(LogicalPlanBuilder::from(plan)
        .project(own.into_iter().chain([value.alias(out)]))?
        .build()?)
}
