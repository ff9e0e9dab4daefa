//! `explode`: a column of JSON texts as a struct column whose fields are
//! inferred from the first `schema_sample_size` rows (DataChain's
//! `explode`), decoded by arrow-json.
//!
//! Guarantees: a row that is not a JSON object, or whose values do not fit
//! the inferred types, fails the query naming the column, the row (its
//! position in its batch) and the start of its text; a null stays null;
//! fields the sample did not show are dropped.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StructArray, UInt32Array};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType, Fields, Schema};
use datafusion::arrow::json::ReaderBuilder;
use datafusion::arrow::json::reader::infer_json_schema_from_iterator;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// The struct fields the JSON objects `texts` hold together.
pub(super) fn infer_fields(column: &str, texts: &[String]) -> Result<Fields, String> {
    let mut values = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        values.push(object(column, i, t)?);
    }
    if values.is_empty() {
        return Err(format!(
            "explode({column}): no row to infer the schema from (the column is empty or null)"
        ));
    }
    infer_json_schema_from_iterator(values.into_iter().map(Ok))
        .map(|s: Schema| s.fields().clone())
        .map_err(|e| format!("explode({column}): {e}"))
}

/// The JSON object of row `row`'s text, or the error naming the row.
fn object(column: &str, row: usize, text: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err(bad_row(column, row, text, "not a JSON object")),
        Err(e) => Err(bad_row(column, row, text, &e.to_string())),
    }
}

fn bad_row(column: &str, row: usize, text: &str, why: &str) -> String {
    let start: String = text.chars().take(60).collect();
    format!("explode({column}): row {row} does not parse ({why}): {start:?}")
}

/// `json_to_struct(text)` with fixed output fields (one per explode step).
/// The cluster codecs carry it as its column name and fields.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct JsonToStruct {
    column: String,
    fields: Fields,
    signature: Signature,
}

impl JsonToStruct {
    /// The column it reads (for errors).
    pub(crate) fn column(&self) -> &str {
        &self.column
    }

    /// The struct fields it decodes to.
    pub(crate) fn fields(&self) -> &Fields {
        &self.fields
    }

    pub(crate) fn udf(column: &str, fields: Fields) -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            column: column.to_string(),
            fields,
            signature: Signature::any(1, Volatility::Immutable),
        })
    }

    fn decode_rows(&self, rows: &[&str]) -> DfResult<RecordBatch> {
        let schema = Arc::new(Schema::new(self.fields.clone()));
        let mut decoder = ReaderBuilder::new(Arc::clone(&schema))
            .with_batch_size(rows.len().max(1))
            .build_decoder()?;
        for r in rows {
            decoder.decode(r.as_bytes())?;
            decoder.decode(b"\n")?;
        }
        Ok(decoder
            .flush()?
            .unwrap_or_else(|| RecordBatch::new_empty(schema)))
    }

    /// The struct of each text (null for a null), or the error naming the first bad row.
    fn decode(&self, texts: &ArrayRef) -> DfResult<ArrayRef> {
        let texts = cast(texts, &DataType::Utf8)?;
        let texts = texts.as_string::<i32>();
        let mut index: Vec<Option<u32>> = Vec::with_capacity(texts.len());
        let mut present: Vec<(usize, &str)> = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            match t {
                None => index.push(None),
                Some(t) => {
                    object(&self.column, i, t).map_err(DataFusionError::Execution)?;
                    index.push(Some(present.len() as u32));
                    present.push((i, t));
                }
            }
        }
        let all: Vec<&str> = present.iter().map(|(_, t)| *t).collect();
        let decoded = match self.decode_rows(&all) {
            Ok(b) => b,
            Err(e) => {
                // A value of another type than the sample's: name its row.
                for (i, t) in &present {
                    if let Err(e) = self.decode_rows(&[t]) {
                        return Err(DataFusionError::Execution(bad_row(
                            &self.column,
                            *i,
                            t,
                            &e.to_string(),
                        )));
                    }
                }
                return Err(e);
            }
        };
        let structs: ArrayRef = Arc::new(StructArray::from(decoded));
        Ok(take(&structs, &UInt32Array::from(index), None)?)
    }
}

impl ScalarUDFImpl for JsonToStruct {
    fn name(&self) -> &str {
        "json_to_struct"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Struct(self.fields.clone()))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let [arg] = args.args.as_slice() else {
            return Err(DataFusionError::Plan(
                "json_to_struct takes one column".to_string(),
            ));
        };
        let texts = arg.to_array(args.number_rows)?;
        Ok(ColumnarValue::Array(self.decode(&texts)?))
    }
}
