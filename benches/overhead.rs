//! The engine's own cost per row: rows/s through `map` over an in-memory store
//! (`memory://`, no latency), with prefetch off and on, next to the listing alone.
//!
//! ```sh
//! cargo bench --bench overhead
//! ```

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use udfchain::{Chain, File, Session, Settings};

const FILES: usize = 2000;
const SIZE: usize = 1024;

fn setup(rt: &tokio::runtime::Runtime) -> Arc<Session> {
    rt.block_on(async {
        let store = Arc::new(InMemory::new());
        for i in 0..FILES {
            let path = Path::from(format!("rows/{i:05}.bin"));
            store
                .put(&path, PutPayload::from(vec![(i % 251) as u8; SIZE]))
                .await
                .expect("put");
        }
        let session = Session::new();
        session
            .register_store("memory://overhead", store)
            .expect("register");
        session
    })
}

async fn rows(chain: &Chain) -> usize {
    chain
        .collect()
        .await
        .expect("run")
        .iter()
        .map(|b| b.num_rows())
        .sum()
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(udfchain::testing::cores())
        .enable_all()
        .build()
        .expect("runtime");
    let session = setup(&rt);
    let root = tempfile::TempDir::new().expect("root");
    let listing = session.from_storage("memory://overhead/rows/");
    let map = |settings: Settings| {
        listing
            .clone()
            .settings(settings.root(root.path()))
            .map("len", |f: File| async move {
                f.read().await.map(|b| b.len() as u64)
            })
    };
    let cases = [
        ("list_only", listing.clone()),
        ("map_prefetch_off", map(Settings::new().prefetch(0))),
        ("map_prefetch_8", map(Settings::new().prefetch(8))),
        ("map_prefetch_auto", map(Settings::new().prefetch_auto())),
    ];
    let mut group = c.benchmark_group("rows");
    group
        .throughput(Throughput::Elements(FILES as u64))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for (name, chain) in &cases {
        assert_eq!(rt.block_on(rows(chain)), FILES, "{name}");
        group.bench_function(*name, |b| b.to_async(&rt).iter(|| rows(chain)));
    }
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
