//! The physical UDF operators: [`UdfExec`](udf_exec::UdfExec), one operator
//! generic over the UDF kind (`map.rs`, `generate.rs`, `batch_map.rs`,
//! `aggregate.rs` each say how their kind cuts its input into calls and its
//! results into rows; `any_kind.rs` sees any of them through what they
//! share), and what their calls share: how a call runs
//! ([`UdfCall`](udf_call::UdfCall)), the one meaning of `on_error`, how
//! results become the output stream (`output_stream.rs`; put back in input
//! order by `in_order.rs`), and a UDF's state in this process ([`Instance`]).

pub(super) mod aggregate;
pub(super) mod any_kind;
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
