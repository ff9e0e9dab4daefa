//! The state database's transactions run off the async runtime.

use std::sync::Arc;

use udfchain::pipeline::Pipeline;

use super::{csv_config, csv_files, session};

/// A scoring function that notes the thread of each call: it runs inside the
/// transaction that computes a trigger's set.
struct ThreadNoter(Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>);

impl udfchain::pipeline::ScoreFn for ThreadNoter {
    fn score(&self, candidates: &[udfchain::pipeline::Sample]) -> udfchain::Result<Vec<f64>> {
        self.0
            .lock()
            .expect("threads")
            .push(std::thread::current().id());
        Ok(candidates.iter().map(|s| s.key as f64).collect())
    }
}

#[test]
fn the_state_db_transactions_run_off_the_async_runtime() {
    // A current-thread runtime: its only worker is this thread, so work done
    // on a worker runs here and work on the blocking pool elsewhere.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let root = tempfile::tempdir().expect("root");
    let data = tempfile::tempdir().expect("data");
    csv_files(data.path());
    let config = csv_config(
        "threads",
        data.path(),
        "{amount: {num_samples: 6}}",
        "{strategy: coreset, maximum_keys_in_memory: 4, k: 2, sampling: top_k}",
    );
    let threads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let done = rt
        .block_on(async {
            Pipeline::new(config)
                .session(session(root.path()))
                .score_fn(Arc::new(ThreadNoter(Arc::clone(&threads))))
                .replay(None, None)
                .await
        })
        .expect("replay");
    assert_eq!(done.len(), 2);
    let worker = std::thread::current().id();
    let threads = threads.lock().expect("threads");
    assert!(!threads.is_empty(), "the score fn ran");
    assert!(
        threads.iter().all(|t| *t != worker),
        "a trigger's transaction ran on the async worker: {threads:?}"
    );
}
