//! Small helpers shared by several layers (imports point down to here only):
//! fsync of files and dirs before a commit ([`durable`]), the `ExecutionPlan`
//! boilerplate of every operator ([`exec_boilerplate`]), owner locks that tell a sweeper whether a dir's owner process is still
//! running ([`owner`]), closest-name suggestions for "did you mean" ([`closest`]),
//! the masking of credentials in every output ([`redact`]), and
//! poison-tolerant locking ([`lock`]), and one fetch per key at a time
//! ([`single_flight`]).

pub mod durable;
pub(crate) mod exec_boilerplate;
pub(crate) mod lock;
pub mod owner;
pub mod redact;
pub(crate) mod single_flight;

mod names;
pub use names::closest;

/// The property tests' settings, one for every parser fuzzed in unit tests:
/// 512 cases a run; failures print their input (no regressions file at the
/// top level of the repository).
#[cfg(test)]
pub(crate) fn fuzz_cases() -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases: 512,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}
