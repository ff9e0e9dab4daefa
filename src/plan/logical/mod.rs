//! What a chain, a SQL call or a cluster task hands the planner: a UDF of any
//! kind as one value ([`Udf`], and [`Udf::renamed`] for a call under another
//! name) and the logical plan node that carries it ([`UdfNode`]).

pub(super) mod node;
pub(super) mod renamed;
pub(super) mod udf;

pub use node::UdfNode;
pub use udf::Udf;
