//! The sample a pipeline hands to its trigger and its selection strategy: a
//! stable key (assigned by the pipeline's storage side), a timestamp, a label
//! and, only when the trigger asks for them (drift), features.

use std::sync::Arc;

/// One sample of a pipeline, as triggers and strategies see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Stable integer key (the pipeline's `pl_samples` maps it to path and index).
    pub key: u64,
    /// Seconds since the epoch.
    pub timestamp: i64,
    /// The sample's label.
    pub label: i64,
    /// Filled by the supervisor only when the trigger asks (drift); `None` otherwise.
    pub features: Option<Arc<[f32]>>,
}
