//! Logical UDF nodes, their physical planning, and the physical operators (one
//! per file): `MapExec`, `GenerateExec`, `BatchMapExec`, `AggregateExec`, and
//! `PrefetchExec` (a folder: the node, its stream, its downloads, its window).

mod aggregate;
mod batch_map;
mod batches;
mod common;
mod generate;
mod in_order;
mod map;
mod node;
mod planner;
mod prefetch;
mod report;
mod skip_list;

pub use aggregate::AggregateExec;
pub use batch_map::BatchMapExec;
pub use generate::GenerateExec;
pub use map::MapExec;
pub use node::{UdfKind, UdfNode};
pub use planner::{
    UdfExecParts, UdfPlanner, UdfQueryPlanner, prefetch_options, udf_exec, udf_exec_parts,
};
pub use prefetch::{PrefetchExec, PrefetchHandle, PrefetchOptions};
pub use report::{OperatorReport, RunReport};
