//! `Expr`: a DataFusion expression built from Python (`uc.C("file.size") > 0`).
//!
//! Guarantees: `C("a.b")` reaches into struct fields as the Rust API's `col`
//! does; Python operands that are not expressions become literals (None,
//! bool, int, float, str, bytes; anything else is a TypeError naming its
//! type); comparisons, arithmetic, `&`, `|` and `~` build the same
//! expressions as their Rust counterparts, planned and type-checked when the
//! chain runs.

use datafusion::functions_aggregate::expr_fn as agg;
use datafusion::logical_expr::{Expr, Operator, SortExpr, binary_expr};
use datafusion::prelude::lit;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyString};

/// An expression over a chain's columns (`udfchain.C("file.size") > 0`):
/// combined with `<`, `==`, `+`, `*`, `&` (and), `|` (or), `~` (not), ...;
/// a Python value on the other side is a literal. Nothing is computed until
/// the chain runs.
#[pyclass(frozen, from_py_object, name = "Expr", module = "udfchain._internal")]
#[derive(Clone)]
pub struct PyExpr {
    pub expr: Expr,
    /// Sort direction when used in `order_by` (ascending unless `.desc()`).
    pub ascending: bool,
}

impl PyExpr {
    pub fn of(expr: Expr) -> Self {
        Self {
            expr,
            ascending: true,
        }
    }

    pub fn sort(&self) -> SortExpr {
        self.expr.clone().sort(self.ascending, !self.ascending)
    }
}

/// An expression from an `Expr` or a Python literal.
pub fn operand(v: &Bound<'_, PyAny>) -> PyResult<Expr> {
    if let Ok(e) = v.cast::<PyExpr>() {
        return Ok(e.get().expr.clone());
    }
    if v.is_none() {
        return Ok(lit(datafusion::scalar::ScalarValue::Null));
    }
    if v.is_instance_of::<PyBool>() {
        return Ok(lit(v.extract::<bool>()?));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(lit(v.extract::<i64>()?));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(lit(v.extract::<f64>()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(lit(v.extract::<String>()?));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(lit(b.as_bytes().to_vec()));
    }
    Err(PyTypeError::new_err(format!(
        "cannot use a {} in an expression (use None, bool, int, float, str, bytes or udfchain.C)",
        v.get_type().name()?
    )))
}

fn binary(l: Expr, op: Operator, r: Expr) -> PyExpr {
    PyExpr::of(binary_expr(l, op, r))
}

/// A column; dots reach into struct fields.
#[pyfunction]
pub fn col(name: &str) -> PyExpr {
    PyExpr::of(udfchain::col(name))
}

/// A literal value.
#[pyfunction]
pub fn literal(value: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
    operand(value).map(PyExpr::of)
}

/// An aggregate for `group_by`: count, sum, avg, min, max (count(None) counts rows).
#[pyfunction]
#[pyo3(signature = (name, arg=None))]
pub fn aggregate(name: &str, arg: Option<&Bound<'_, PyAny>>) -> PyResult<PyExpr> {
    let arg = match arg {
        Some(a) => operand(a)?,
        None => lit(1i64),
    };
    let e = match name {
        "count" => agg::count(arg),
        "sum" => agg::sum(arg),
        "avg" | "mean" => agg::avg(arg),
        "min" => agg::min(arg),
        "max" => agg::max(arg),
        _ => {
            return Err(PyTypeError::new_err(format!(
                "unknown aggregate {name}: count, sum, avg, min or max"
            )));
        }
    };
    Ok(PyExpr::of(e))
}

#[pymethods]
impl PyExpr {
    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<PyExpr> {
        let op = match op {
            CompareOp::Lt => Operator::Lt,
            CompareOp::Le => Operator::LtEq,
            CompareOp::Eq => Operator::Eq,
            CompareOp::Ne => Operator::NotEq,
            CompareOp::Gt => Operator::Gt,
            CompareOp::Ge => Operator::GtEq,
        };
        Ok(binary(self.expr.clone(), op, operand(other)?))
    }

    fn __add__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(self.expr.clone(), Operator::Plus, operand(o)?))
    }
    fn __radd__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(operand(o)?, Operator::Plus, self.expr.clone()))
    }
    fn __sub__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(self.expr.clone(), Operator::Minus, operand(o)?))
    }
    fn __rsub__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(operand(o)?, Operator::Minus, self.expr.clone()))
    }
    fn __mul__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(self.expr.clone(), Operator::Multiply, operand(o)?))
    }
    fn __rmul__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(operand(o)?, Operator::Multiply, self.expr.clone()))
    }
    fn __truediv__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(self.expr.clone(), Operator::Divide, operand(o)?))
    }
    fn __mod__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(self.expr.clone(), Operator::Modulo, operand(o)?))
    }
    fn __and__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(self.expr.clone(), Operator::And, operand(o)?))
    }
    fn __or__(&self, o: &Bound<'_, PyAny>) -> PyResult<PyExpr> {
        Ok(binary(self.expr.clone(), Operator::Or, operand(o)?))
    }
    fn __invert__(&self) -> PyExpr {
        PyExpr::of(!self.expr.clone())
    }
    fn __neg__(&self) -> PyExpr {
        PyExpr::of(-self.expr.clone())
    }

    /// True where the value is null.
    fn is_null(&self) -> PyExpr {
        PyExpr::of(self.expr.clone().is_null())
    }

    /// True where the value is not null.
    fn is_not_null(&self) -> PyExpr {
        PyExpr::of(self.expr.clone().is_not_null())
    }

    /// SQL `LIKE` (`%` any text, `_` one character).
    fn like(&self, pattern: &str) -> PyExpr {
        PyExpr::of(self.expr.clone().like(lit(pattern)))
    }

    /// The same expression, its column named `name`.
    fn alias(&self, name: &str) -> PyExpr {
        PyExpr::of(self.expr.clone().alias(name))
    }

    /// Sorted ascending in `order_by` (the default).
    fn asc(&self) -> PyExpr {
        Self {
            ascending: true,
            ..self.clone()
        }
    }

    /// Sorted descending in `order_by`.
    fn desc(&self) -> PyExpr {
        Self {
            ascending: false,
            ..self.clone()
        }
    }

    fn __bool__(&self) -> PyResult<bool> {
        Err(PyTypeError::new_err(
            "an expression has no truth value: combine conditions with &, | and ~ (not and/or/not)",
        ))
    }

    fn __repr__(&self) -> String {
        format!("Expr({})", self.expr)
    }
}
