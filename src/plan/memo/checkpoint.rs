//! [`Checkpoint`]: the dir in which the UDFs of one save keep their results
//! ([`Memo`]s), handed to the planner as an extension of the session config
//! of the save's plan. A plan planned without one keeps nothing.
//!
//! Guarantees: each map and batch_map UDF of the plan gets its own memo dir,
//! named by what determines its results besides its input row: its kind,
//! name, params, `version`, `on_error` and the logical plan of its input
//! (so a changed plan below it, or a new version, starts from nothing).
//! Generators and aggregates keep nothing (a generator's rows, an aggregate's
//! groups are not one value per input row); neither does a UDF whose param
//! types Arrow's row format cannot encode. The dir a save uses (and what else
//! names it) is the save's business (`chain/save.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::logical_expr::UserDefinedLogicalNodeCore;
use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::plan::logical::node::UdfNode;
use crate::plan::logical::udf::Udf;
use crate::plan::memo::Memo;
use crate::runtime::blocking;

/// The dir a save's UDFs keep their results in.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
}

impl Checkpoint {
    /// A checkpoint in `dir` (created as memos are opened).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The memo of `node`'s UDF over an input of `schema`, its kept results
    /// read; `None` for a UDF that keeps nothing (see the module header).
    pub async fn memo(&self, node: &UdfNode, schema: &SchemaRef) -> Result<Option<Arc<Memo>>> {
        if !matches!(node.kind, Udf::Map(_) | Udf::BatchMap(_)) {
            return Ok(None);
        }
        let sig = node.kind.signature();
        let Some(params) = sig
            .params
            .iter()
            .map(|p| schema.index_of(p).ok())
            .collect::<Option<Vec<usize>>>()
        else {
            return Ok(None);
        };
        let types = params
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect();
        let Ok(converter) = RowConverter::new(types) else {
            return Ok(None);
        };
        let dir = self.dir.join(node_dir(node));
        let (name, output): (String, Field) = (sig.name.clone(), sig.output.clone());
        let memo = blocking(move || Memo::open(&dir, &name, params, converter, &output)).await?;
        Ok(Some(Arc::new(memo)))
    }
}

/// `<kind>-<name>-<hash>`: the name kept readable (letters, digits, `_`, `-`),
/// the hash of everything that determines the UDF's results.
fn node_dir(node: &UdfNode) -> String {
    struct Explain<'a>(&'a UdfNode);
    impl std::fmt::Display for Explain<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            self.0.fmt_for_explain(f)
        }
    }
    let mut h = Sha256::new();
    h.update(Explain(node).to_string());
    h.update(format!("\non_error={:?}\n", node.settings.get_on_error()));
    h.update(node.input.display_indent().to_string());
    let hash: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name: String = node
        .kind
        .signature()
        .name
        .chars()
        .take(40)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{}-{name}-{hash}", node.kind.kind_name())
}
