//! The physical UDF operators (one per kind: `map.rs`, `generate.rs`,
//! `batch_map.rs`, `aggregate.rs`) and what they share: their scaffolding
//! (`udf_exec.rs`); how a call runs ([`UdfCall`](udf_call::UdfCall)), the one
//! meaning of `on_error`, how results become the output stream (in order or
//! as they finish), and a UDF's state in this process ([`Instance`]).

pub(super) mod aggregate;
pub(super) mod batch_map;
pub(super) mod generate;
pub(super) mod in_order;
pub(super) mod lifecycle;
pub(super) mod map;
pub(super) mod on_error;
pub(super) mod output_stream;
pub(super) mod udf_call;
pub(super) mod udf_exec;

pub use lifecycle::Instance;
