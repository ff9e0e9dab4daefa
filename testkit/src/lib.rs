//! udfchain's test kit, shared by the integration tests (`tests/integration/`)
//! and the benches (`benches/`), never by the engine: a dev-dependency only.
//!
//! - `s3_server.rs`: a real S3 server in-process ([`S3Server`]), what it
//!   served, and its added latency ([`Latency`]) and bandwidth cap.
//! - `stores.rs`: `object_store` wrappers that count GETs ([`CountingStore`])
//!   or inject delays and failures ([`FaultyStore`]).
//! - `generated_store.rs`: a read-only store of millions of generated objects,
//!   listed lazily page by page ([`GeneratedStore`]).
//! - `child.rs`: one ignored test run as a child process, and its peak
//!   resident memory ([`run_child_test`], [`child_peak_rss`]).
//! - `fixtures.rs`: deterministic file contents and small helpers for scripts,
//!   tables, CLI output and temp dirs.
//!
//! What it guarantees: servers bind 127.0.0.1 only (port 0, so tests run in
//! parallel) and need nothing installed; a server's objects live in a temp dir
//! removed when it drops; file contents and the latency model are
//! deterministic (one seed, one sequence of delays).

#![warn(missing_docs)]

mod child;
mod fixtures;
mod generated_store;
mod s3_server;
mod stores;

pub use child::{child_peak_rss, peak_rss, report_peak_rss, run_child_test};
pub use fixtures::{
    content, disk_bytes, golden, last_table, no_prefetch_dirs_soon, prefetch_dirs, put_files,
    remote_view, runner, stdout_ok, write_files,
};
pub use generated_store::{GeneratedStore, PAGE};
pub use s3_server::{ACCESS_KEY, BUCKET, Latency, S3Server, SECRET_KEY};
pub use stores::{CountingStore, Fault, FaultyStore};
