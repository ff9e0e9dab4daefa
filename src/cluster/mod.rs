//! Distributed runs on Apache Ballista: the same chains and scripts, planned
//! by a scheduler and run by executors built with udfchain's planner,
//! operators, object stores and codecs.
//!
//! - `codec`: plan codecs for every udfchain plan part, falling back to
//!   Ballista's; UDFs travel by name.
//! - `registry`: the UDFs an executor runs, by name.
//! - `spread`: `workers` partitions per UDF on a cluster.
//! - `exactly_once`: every row once when Ballista reruns a stage after an
//!   executor was lost.
//! - `client`: `Session::connect(settings)`, `Session::remote(url, settings)`,
//!   `Session::standalone`, and writes (`save`) that run on the client.
//! - `job`: a job seen from the client: cancelled when its stream is
//!   dropped, its task errors readable.
//! - `job_watch`: on executors, udfchain operators stop when their job is
//!   cancelled or failed.
//! - `scheduler` / `executor`: the two processes (`udfchain cluster
//!   scheduler|executor`), and builders for Rust users with their own UDFs
//!   ([`Scheduler`], [`Executor`] with a [`UdfRegistry`]).
//!
//! Public here: the builders, [`UdfRegistry`], the codecs (for Ballista
//! setups of your own), [`CONNECT_TIMEOUT`], [`scheduler_url`] and
//! [`cancels_sent`]; the submodules are the crate's.

pub(crate) mod client;
pub(crate) mod codec;
pub(crate) mod exactly_once;
pub(crate) mod executor;
pub(crate) mod job;
pub(crate) mod job_watch;
pub(crate) mod registry;
pub(crate) mod scheduler;
pub(crate) mod spread;

pub use client::{CONNECT_TIMEOUT, scheduler_url};
pub use codec::{LogicalCodec, PhysicalCodec};
pub use exactly_once::OneFinalTask;
pub use executor::{Executor, ExecutorBuilder};
pub use job::cancels_sent;
pub use registry::{CodeLoader, UdfRegistry};
pub use scheduler::{Scheduler, SchedulerBuilder};
pub use spread::Spread;
