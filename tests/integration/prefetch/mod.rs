//! PrefetchExec and the temporary cache: in-flight bounds, UDF wait, temp dir
//! lifecycle (success, error, panic, drop, SIGKILL), disk window, ordering,
//! retries and skips, range reads without prefetch.
//!
//! One file per behaviour (below); the helpers they share are here.

use std::sync::Arc;
use std::time::Duration;

use udfchain::{Chain, File, RunReport, Session, Settings, col};

mod copies;
mod faults;
mod in_place;
mod ordering;
mod window;

fn len_udf(chain: Chain, work: Duration) -> Chain {
    chain.map("len", move |f: File| async move {
        tokio::time::sleep(work).await;
        f.read().await.map(|b| b.len() as u64)
    })
}

/// `sum of bytes` of each file of `uri`, in output order, with its path.
async fn sums_of(
    session: &Arc<Session>,
    uri: &str,
    settings: Settings,
    calls: Arc<std::sync::atomic::AtomicUsize>,
) -> (Vec<(String, Option<u64>)>, RunReport) {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::UInt64Type;
    let chain = session
        .from_storage(uri)
        .settings(settings)
        .map("sum", move |f: File| {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if f.path.ends_with("7.bin") {
                    return Err(std::io::Error::other(format!("no sevens: {}", f.path)));
                }
                f.read()
                    .await
                    .map_err(std::io::Error::other)
                    .map(|b| b.iter().map(|&x| x as u64).sum::<u64>())
            }
        })
        .select([col("file.path").alias("path"), col("sum")]);
    let (batches, report) = chain.collect_with_report().await.expect("run");
    let mut rows = Vec::new();
    for b in &batches {
        let (paths, sums) = (
            b.column(0).as_string::<i32>(),
            b.column(1).as_primitive::<UInt64Type>(),
        );
        for i in 0..b.num_rows() {
            rows.push((
                paths.value(i).to_string(),
                sums.is_valid(i).then(|| sums.value(i)),
            ));
        }
    }
    (rows, report)
}
