//! Pipelines (issue 13): a supervisor reads new samples from storage in
//! timestamp order, informs a trigger policy and a selection strategy of each
//! batch, and at each trigger asks the strategy for that trigger's training set.
//! All state lives in one SQLite file per pipeline, so a restart continues.

pub mod sample;
pub mod selector;
pub mod trigger;

pub use sample::Sample;
