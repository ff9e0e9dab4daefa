//! The one integration test binary (every extra binary links DataFusion again).

mod support;

mod errors;
mod execution;
mod prefetch;
mod relational;
mod sources;
mod udf_kinds;
