//! [`Signature`]: what a UDF reads and writes, checked when a chain is planned.

use datafusion::arrow::datatypes::{DataType, Field};

/// A UDF's name, input columns, declared input type and output column.
#[derive(Debug, Clone)]
pub struct Signature {
    /// Shown in EXPLAIN and in every error of the UDF.
    pub name: String,
    /// Input columns, in the order the UDF reads them.
    pub params: Vec<String>,
    /// The Arrow type the UDF's input value was traced to: for one param, that
    /// column's type; for several, a struct with one field per param. `None`
    /// accepts anything.
    pub input: Option<DataType>,
    /// The output column (its name is the column name in the result).
    pub output: Field,
}

/// Checks that a column of type `actual` can be converted to a value traced as
/// `expected`. Loose where serde converts (integer widths, string encodings,
/// timestamps to integers, missing optional struct fields), strict across kinds.
pub fn check_input_type(expected: &DataType, actual: &DataType) -> Result<(), String> {
    use DataType as D;
    let ok = match (expected, actual) {
        (D::Null, _) => true,
        (e, a) if e == a => true,
        (e, a) if is_int(e) && is_int(a) => true,
        (e, a) if is_float(e) && (is_float(a) || is_int(a)) => true,
        (e, a) if is_int(e) && matches!(a, D::Timestamp(..) | D::Date32 | D::Date64) => true,
        (e, a) if is_string(e) && (is_string(a) || matches!(a, D::Dictionary(..))) => true,
        (e, a) if is_binary(e) && is_binary(a) => true,
        (D::List(e), D::List(a) | D::LargeList(a) | D::FixedSizeList(a, _)) => {
            return check_input_type(e.data_type(), a.data_type());
        }
        (D::List(e), a) if is_binary(a) && matches!(e.data_type(), D::UInt8) => true,
        (D::Struct(want), D::Struct(have)) => {
            for w in want {
                match have.iter().find(|h| h.name() == w.name()) {
                    Some(h) => check_input_type(w.data_type(), h.data_type())
                        .map_err(|e| format!("field {}: {e}", w.name()))?,
                    None if w.is_nullable() => {}
                    None => return Err(format!("missing field {}", w.name())),
                }
            }
            true
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("expects {expected}, found {actual}"))
    }
}

fn is_int(d: &DataType) -> bool {
    d.is_integer()
}

fn is_float(d: &DataType) -> bool {
    d.is_floating()
}

fn is_string(d: &DataType) -> bool {
    matches!(d, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// Whether `d` holds bytes: binary of any offset width, a view or a fixed size.
pub fn is_binary(d: &DataType) -> bool {
    matches!(
        d,
        DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}
