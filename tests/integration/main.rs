//! The one integration test binary (every extra binary links DataFusion again).

#[allow(dead_code)] // shared with the benchmarks, which use more of it
mod support;

mod caching;
mod cli;
mod cluster;
mod datasets;
mod delta;
mod errors;
mod execution;
mod export;
mod first_run;
mod fuzz;
mod images;
mod keys;
mod layers;
mod lifecycle;
mod lineage;
mod loader;
mod on_error;
mod pipeline;
mod prefetch;
mod progress;
mod redaction;
mod relational;
mod resume;
mod scripts;
mod selection;
mod serve;
mod shared_cache;
mod sources;
mod sql_udfs;
mod storage_faults;
mod tar_archives;
mod udf_kinds;
mod ui;
mod url_files;
mod verbs;
