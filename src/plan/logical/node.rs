//! [`UdfNode`]: the logical plan node of every UDF kind.
//!
//! Built by the chain, it checks at planning time that every param column exists
//! and converts to the UDF's declared input type, and that the output column
//! name is free. Filters and projections are not pushed through it: a UDF may
//! depend on any input row.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use datafusion::arrow::datatypes::Field;
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNodeCore};
use udfchain_udfs::engine::check_input_type;

use crate::plan::logical::udf::Udf;

use crate::error::{Error, Result};
use crate::settings::Settings;

/// A UDF applied to its input plan, with the settings captured when it was added.
#[derive(Debug, Clone)]
pub struct UdfNode {
    id: u64,
    pub kind: Udf,
    pub settings: Settings,
    pub input: LogicalPlan,
    schema: DFSchemaRef,
}

impl UdfNode {
    /// Checks the UDF against `input`'s schema and builds the node.
    pub fn try_new(input: LogicalPlan, kind: Udf, settings: Settings) -> Result<Self> {
        let schema = output_schema(&input, &kind)?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Ok(Self {
            id: NEXT.fetch_add(1, AtomicOrdering::Relaxed),
            kind,
            settings,
            input,
            schema,
        })
    }

    pub fn into_plan(self) -> LogicalPlan {
        LogicalPlan::Extension(Extension {
            node: Arc::new(self),
        })
    }
}

fn output_schema(input: &LogicalPlan, kind: &Udf) -> Result<DFSchemaRef> {
    let sig = kind.signature();
    let in_schema = input.schema();
    let udf = &sig.name;
    let mut types = Vec::with_capacity(sig.params.len());
    for p in &sig.params {
        let idx = in_schema.index_of_column_by_name(None, p).ok_or_else(|| {
            let known: Vec<_> = in_schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            Error::plan(format!(
                "UDF {udf} reads column {p:?}, which does not exist (columns: {})",
                known.join(", ")
            ))
        })?;
        types.push(Field::new(
            p,
            in_schema.field(idx).data_type().clone(),
            true,
        ));
    }
    if let Some(expected) = &sig.input {
        let actual = match types.as_slice() {
            [one] => one.data_type().clone(),
            many => datafusion::arrow::datatypes::DataType::Struct(many.to_vec().into()),
        };
        check_input_type(expected, &actual).map_err(|reason| {
            Error::plan(format!(
                "UDF {udf}: input column(s) {} do not match its declared input: {reason}",
                sig.params.join(", ")
            ))
        })?;
    }
    let out_name = sig.output.name();
    let mut fields: Vec<(Option<datafusion::common::TableReference>, Arc<Field>)> = match kind {
        Udf::Agg { partition_by, .. } => {
            let mut keys = Vec::with_capacity(partition_by.len());
            for k in partition_by {
                let idx = in_schema.index_of_column_by_name(None, k).ok_or_else(|| {
                    Error::plan(format!(
                        "UDF {udf}: partition_by column {k:?} does not exist"
                    ))
                })?;
                let (q, f) = in_schema.qualified_field(idx);
                keys.push((q.cloned(), Arc::clone(f)));
            }
            keys
        }
        _ => in_schema
            .iter()
            .map(|(q, f)| (q.cloned(), Arc::clone(f)))
            .collect(),
    };
    if fields.iter().any(|(_, f)| f.name() == out_name) {
        return Err(Error::plan(format!(
            "UDF {udf}: output column {out_name:?} already exists; choose another name"
        )));
    }
    // Nullable whatever the UDF's type: `on_error = null` writes nulls, and a
    // non-nullable column would let the optimizer fold `IS NULL` filters away.
    fields.push((None, Arc::new(sig.output.clone().with_nullable(true))));
    let schema = DFSchema::new_with_metadata(fields, in_schema.metadata().clone())?;
    Ok(Arc::new(schema))
}

impl PartialEq for UdfNode {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.input == other.input
    }
}

impl Eq for UdfNode {}

impl Hash for UdfNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl PartialOrd for UdfNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.id.partial_cmp(&other.id)
    }
}

impl UserDefinedLogicalNodeCore for UdfNode {
    fn name(&self) -> &str {
        "Udf"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let sig = self.kind.signature();
        write!(
            f,
            "Udf: kind={}, name={}, params=[{}], output={}",
            self.kind.kind_name(),
            sig.name,
            sig.params.join(", "),
            sig.output.name()
        )?;
        if let Udf::Agg { partition_by, .. } = &self.kind {
            write!(f, ", partition_by=[{}]", partition_by.join(", "))?;
        }
        if let Some(version) = self.settings.get_udf_version() {
            write!(f, ", version={version}")?;
        }
        Ok(())
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> DfResult<Self> {
        let input = inputs.swap_remove(0);
        let schema = output_schema(&input, &self.kind).map_err(Error::into_df)?;
        Ok(Self {
            id: self.id,
            kind: self.kind.clone(),
            settings: self.settings.clone(),
            input,
            schema,
        })
    }
}
