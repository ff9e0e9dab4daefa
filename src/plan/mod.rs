//! Logical UDF nodes, their physical planning, and the physical operators (one
//! per file): `MapExec`, `GenerateExec`, `BatchMapExec`, `AggregateExec`, and
//! `PrefetchExec` (a folder: the node, its stream, its downloads, its window);
//! a save's `Checkpoint` and the `Memo` of each UDF's results in it.

mod aggregate;
mod batch_map;
mod batches;
mod checkpoint;
mod generate;
mod in_order;
mod lifecycle;
mod map;
mod memo;
mod node;
mod on_error;
mod operator;
mod output;
mod planner;
mod prefetch;
mod renamed;
mod report;
mod skip_list;
mod udf;
mod udf_call;
mod unary_exec;

pub use aggregate::AggregateExec;
pub use batch_map::BatchMapExec;
pub use checkpoint::Checkpoint;
pub use generate::GenerateExec;
pub use lifecycle::Instance;
pub use map::MapExec;
pub use node::UdfNode;
pub use planner::{UdfQueryPlanner, prefetch_options, udf_exec, udf_exec_parts};
pub use prefetch::{PrefetchExec, PrefetchOptions, WindowPins};
pub use report::{OperatorReport, RunReport};
pub use udf::Udf;
