//! A cluster gives a local run's rows, for every UDF kind and relational step.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use udfchain::{Chain, Session, Settings, col};

use super::{kinds, picky, registry, server_with_files, upto};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_udf_kind_with_prefetch_gives_the_local_rows_in_process() {
    let server = server_with_files(24);
    let local = kinds(&server.session()).await;
    assert_eq!(local["map"].len(), 24);
    assert_eq!(local["agg"].len(), 3);
    assert_eq!(local["agg_all"].len(), 1);
    assert!(local["gen"].len() > 10, "{:?}", local["gen"]);
    let cluster = Session::standalone(server.settings().workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let remote = tokio::time::timeout(Duration::from_secs(240), kinds(&cluster))
        .await
        .expect("the cluster runs finish");
    for kind in ["map", "gen", "batch_map", "agg", "agg_all"] {
        assert_eq!(remote[kind], local[kind], "{kind}: cluster rows differ");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_travels_with_the_udf() {
    let server = server_with_files(12);
    let cluster = Session::standalone(server.settings().workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let run = |session: &Arc<Session>, on_error: udfchain::OnError| {
        session
            .from_storage("s3://bucket/data/")
            .settings(Settings::new().on_error(on_error).prefetch(2))
            .map("n", picky)
            .select([col("file.path").alias("path"), col("n")])
            .order_by([col("path").sort(true, false)])
    };
    let text = |b: Vec<datafusion::arrow::array::RecordBatch>| {
        datafusion::arrow::util::pretty::pretty_format_batches(&b)
            .expect("format")
            .to_string()
    };
    for on_error in [udfchain::OnError::Skip, udfchain::OnError::Null] {
        let local = text(
            run(&server.session(), on_error)
                .collect()
                .await
                .expect("local"),
        );
        let remote = text(run(&cluster, on_error).collect().await.expect("cluster"));
        assert_eq!(remote, local, "{on_error:?}");
    }
    let err = run(&cluster, udfchain::OnError::Fail)
        .collect()
        .await
        .expect_err("fail");
    // The executor's one line reaches the client: the UDF, the file, the row
    // and the cause are all in it.
    let text = err.to_string();
    for part in ["picky", "s3://bucket/data/", "row", "odd length"] {
        assert!(text.contains(part), "{part}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_values_travel_to_the_cluster() {
    #[derive(Serialize, Deserialize)]
    struct N {
        n: u64,
    }
    let values = [N { n: 3 }, N { n: 0 }, N { n: 1000 }, N { n: 2 }];
    let cluster = Session::standalone(Settings::new().workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let run = |session: Arc<Session>| {
        Chain::from_values_in(session, &values)
            .settings(Settings::new().batch_size(64))
            .gen_on(&["n"], "i", upto)
            .group_by(
                [col("n")],
                [datafusion::functions_aggregate::expr_fn::sum(col("i"))],
            )
            .order_by([col("n").sort(true, false)])
    };
    let text = |b: Vec<datafusion::arrow::array::RecordBatch>| {
        datafusion::arrow::util::pretty::pretty_format_batches(&b)
            .expect("format")
            .to_string()
    };
    let remote = text(run(cluster).collect().await.expect("cluster"));
    let local = text(run(Session::new()).collect().await.expect("local"));
    assert_eq!(remote, local);
    assert!(local.contains("499500"), "{local}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffle_sample_chunk_and_explode_run_on_the_cluster_as_locally() {
    #[derive(Serialize, Deserialize)]
    struct Row {
        id: u64,
        json: String,
    }
    let rows: Vec<Row> = (0..40)
        .map(|id| Row {
            id,
            json: format!("{{\"a\": {id}, \"b\": \"x{id}\"}}"),
        })
        .collect();
    let cluster = Session::standalone(Settings::new().workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let text = |b: Vec<datafusion::arrow::array::RecordBatch>| {
        datafusion::arrow::util::pretty::pretty_format_batches(&b)
            .expect("format")
            .to_string()
    };
    type MakeChain<'a> = Box<dyn Fn(Arc<Session>) -> Chain + 'a>;
    let chains: Vec<(&str, MakeChain)> = vec![
        (
            "shuffle",
            Box::new(|s| Chain::from_values_in(s, &rows).shuffle(Some(7))),
        ),
        (
            "sample",
            Box::new(|s| Chain::from_values_in(s, &rows).sample(5, Some(3))),
        ),
        (
            "chunk",
            Box::new(|s| {
                Chain::from_values_in(s, &rows)
                    .chunk(1, 3)
                    .order_by([col("id").sort(true, false)])
            }),
        ),
        (
            "explode",
            Box::new(|s| {
                Chain::from_values_in(s, &rows)
                    .explode("json", Some("j"), 10)
                    .select([col("id"), col("j.a"), col("j.b")])
                    .order_by([col("id").sort(true, false)])
            }),
        ),
    ];
    for (name, chain) in &chains {
        let remote = text(
            chain(Arc::clone(&cluster))
                .collect()
                .await
                .unwrap_or_else(|e| panic!("{name} on the cluster: {e}")),
        );
        let local = text(chain(Session::new()).collect().await.expect("local"));
        assert_eq!(remote, local, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_decoders_travel_with_their_spec_and_give_the_local_rows() {
    use udfchain::udfs::builtins::image::{Format, Image, Mode, encode};
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    for i in 0..4u32 {
        let pixels = (0..40 * 30)
            .flat_map(|p| {
                [
                    (p * 3 + i * 50) as u8,
                    (p / 40 * 8) as u8,
                    (p % 40 * 6) as u8,
                ]
            })
            .collect();
        let img = Image::new(40, 30, Mode::Rgb, pixels).expect("image");
        let format = if i % 2 == 0 {
            Format::Png
        } else {
            Format::Jpeg
        };
        let bytes = encode(img.view(), format, Some(90)).expect("encode");
        std::fs::write(data.join(format!("img{i}")), bytes).expect("write");
    }
    // A thumbnail, a fused decode + convert + resize and a plain decode: three
    // specs, each rebuilt by the executors from the name the plan carries.
    let sql = format!(
        "SELECT file.path AS path,
                image_encode(image_thumbnail(file, 12), 'png') AS thumb,
                image_encode(image_resize(image_convert(image_decode(file), 'L'), 5, 4, 'bilinear'), 'png') AS small,
                image_decode(file)['width'] AS w
         FROM read_storage('{}') ORDER BY path",
        data.display()
    );
    let text = |b: Vec<udfchain::Output>| match b.into_iter().last() {
        Some(udfchain::Output::Table(b)) => {
            datafusion::arrow::util::pretty::pretty_format_batches(&b)
                .expect("format")
                .to_string()
        }
        _ => panic!("a table"),
    };
    let root = dir.path().join("root");
    let local = udfchain::ScriptRunner::new(Session::with_settings(Settings::new().root(&root)))
        .run(&sql)
        .await
        .expect("local");
    let cluster = Session::standalone(Settings::new().root(&root).workers(2), registry(), 2)
        .await
        .expect("standalone cluster");
    let remote = udfchain::ScriptRunner::new(cluster)
        .run(&sql)
        .await
        .expect("cluster");
    let local = text(local);
    assert_eq!(local.lines().count(), 8, "{local}");
    assert_eq!(text(remote), local);
}
