//! From a UDF in a logical plan to the operators that run it, in rooms:
//! `logical/` the UDF value and its logical node; `planner.rs` their physical
//! planning; `exec/` the UDF operators (one per kind) and what their calls
//! share; `prefetch/` the `PrefetchExec` that downloads the files of the next
//! rows while the UDF works; `memo/` a save's checkpoint and each UDF's
//! results in it; `report.rs` and `skip_list.rs` what a run did;
//! `row_slices.rs` the row slicing the operators share.

mod exec;
mod logical;
mod memo;
mod planner;
mod prefetch;
mod report;
mod row_slices;
mod skip_list;

pub use exec::Instance;
pub use exec::any_kind::as_udf_exec;
pub use logical::{Udf, UdfNode};
pub use memo::Checkpoint;
pub use planner::{UdfQueryPlanner, prefetch_options, udf_exec, udf_exec_parts};
pub use prefetch::{PrefetchExec, PrefetchOptions, WindowPins};
pub use report::{OperatorReport, RunReport};
