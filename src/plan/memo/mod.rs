//! What a save keeps so that running it again continues where it stopped: the
//! save's [`Checkpoint`] dir, handed to the planner, and in it one [`Memo`] of
//! each UDF's results, keyed by its input row.

mod checkpoint;
mod udf_memo;

pub use checkpoint::Checkpoint;
pub use udf_memo::{Key, Memo};
