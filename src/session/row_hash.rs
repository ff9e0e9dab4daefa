//! `row_hash(seed, a, b, ...)`: a 64-bit hash of each row's values, the same
//! on every machine and in every run for the same seed, types and values.
//!
//! The values are encoded with Arrow's row format (one byte string per row,
//! which covers nulls, structs and lists) and hashed with BLAKE3 keyed by the
//! seed, so the hash does not depend on the build (unlike ahash's, which
//! changes with CPU features) nor on how the rows are split into batches.
//! `Chain::shuffle`, `sample` and `chunk` order and split rows by it; SQL
//! has it as `row_hash` (e.g. `WHERE row_hash(0, file) % 4 = 1`).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, UInt64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{DataFusionError, Result as DfResult, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// `row_hash(seed, values...)` (see the module header).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RowHash {
    signature: Signature,
}

impl RowHash {
    /// The scalar function, for a session or an expression.
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::variadic_any(Volatility::Immutable),
        })
    }
}

/// The BLAKE3 key of a seed: its 8 little-endian bytes, repeated.
fn key_of(seed: u64) -> [u8; 32] {
    let mut key = [0u8; 32];
    for chunk in key.chunks_mut(8) {
        chunk.copy_from_slice(&seed.to_le_bytes());
    }
    key
}

fn seed_of(v: &ColumnarValue) -> DfResult<u64> {
    let ColumnarValue::Scalar(s) = v else {
        return Err(DataFusionError::Plan(
            "row_hash: the seed (first argument) is a constant".to_string(),
        ));
    };
    match s.cast_to(&DataType::UInt64) {
        Ok(ScalarValue::UInt64(Some(n))) => Ok(n),
        _ => match s.cast_to(&DataType::Int64) {
            Ok(ScalarValue::Int64(Some(n))) => Ok(n as u64),
            _ => Err(DataFusionError::Plan(format!(
                "row_hash: the seed is a whole number, got {s}"
            ))),
        },
    }
}

/// The hash of each row of `columns` under `seed`.
pub(crate) fn hash_rows(seed: u64, columns: &[ArrayRef], rows: usize) -> DfResult<UInt64Array> {
    let key = key_of(seed);
    if columns.is_empty() {
        let h = u64::from_le_bytes(first8(blake3::keyed_hash(&key, b"").as_bytes()));
        return Ok(UInt64Array::from(vec![h; rows]));
    }
    let fields = columns
        .iter()
        .map(|c| SortField::new(c.data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields)?;
    let encoded = converter.convert_columns(columns)?;
    Ok(encoded
        .iter()
        .map(|row| u64::from_le_bytes(first8(blake3::keyed_hash(&key, row.as_ref()).as_bytes())))
        .collect())
}

fn first8(b: &[u8; 32]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&b[..8]);
    out
}

impl ScalarUDFImpl for RowHash {
    fn name(&self) -> &str {
        "row_hash"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::UInt64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let Some((seed, values)) = args.args.split_first() else {
            return Err(DataFusionError::Plan(
                "row_hash takes a seed and the values to hash".to_string(),
            ));
        };
        let seed = seed_of(seed)?;
        let n = args.number_rows;
        let columns = values
            .iter()
            .map(|v| v.to_array(n))
            .collect::<DfResult<Vec<_>>>()?;
        let hashes = hash_rows(seed, &columns, n)?;
        let all_scalar = values.iter().all(|v| matches!(v, ColumnarValue::Scalar(_)));
        if all_scalar && hashes.len() == 1 {
            return Ok(ColumnarValue::Scalar(ScalarValue::UInt64(Some(
                hashes.value(0),
            ))));
        }
        Ok(ColumnarValue::Array(Arc::new(hashes) as ArrayRef))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};

    #[test]
    fn a_row_hashes_alike_whatever_its_batch() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(3)]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["x", "y", "z"]));
        let all = hash_rows(7, &[a.clone(), b.clone()], 3).expect("hash");
        let last = hash_rows(7, &[a.slice(2, 1), b.slice(2, 1)], 1).expect("hash");
        assert_eq!(all.value(2), last.value(0));
        let other_seed = hash_rows(8, &[a, b], 3).expect("hash");
        assert_ne!(all.value(0), other_seed.value(0));
        assert_ne!(all.value(0), all.value(1));
    }
}
