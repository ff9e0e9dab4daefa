//! The engine's parsers of untrusted bytes, fuzzed with proptest: pipeline
//! YAML, the Flight command and ticket JSON, the Parquet footers (and page
//! index) the loader reads, and scripts too deep for a recursive parser.
//! Each input, arbitrary or a mutation of a valid one, must end in a value or
//! a clear error — no panic, no hang, no unbounded allocation. Case counts
//! are bounded so the module stays well under a minute in a debug build.
//! (The tar, WebDataset, image and `parquet_rows` parsers are fuzzed next to
//! their code in the udfs crate; script splitting and settings in their own
//! modules.)

use proptest::prelude::*;
use udfchain::loader::Loader;
use udfchain::pipeline::PipelineConfig;
use udfchain::serve::FlightRequest;
use udfchain::testing::TicketKey;
use udfchain::{Catalog, Session, Settings};

use udfchain_testkit::runner;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const YAML: &str = r#"name: demo
data:
  uri: ./data
  glob: "*.csv"
  format: {csv: {label_column: 1, header: false}}
  timestamp: mtime
  selector_batch_size: 128
trigger: {amount: {num_samples: 100}}
selection:
  strategy: new_data
  maximum_keys_in_memory: 1000
  limit: 50
training:
  command: ["python3", "train.py"]
"#;

const REQUEST: &str = r#"{"dataset": "d", "version": 1, "partition_rows": 10, "shuffle": true,
 "seed": 7, "epoch": 0, "rank": 0, "world_size": 2, "worker": 0, "num_workers": 1,
 "columns": ["a"], "with_bytes": {"file": "data"}, "prefetch_partitions": 2,
 "parallel_requests": 1}"#;

/// `text` with each (position, byte) edit applied: replace, insert or delete.
fn mutate(text: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut out = text.to_vec();
    for &(at, op, byte) in edits {
        let at = if out.is_empty() { 0 } else { at % out.len() };
        match op % 3 {
            0 if !out.is_empty() => out[at] = byte,
            1 => out.insert(at, byte),
            _ if !out.is_empty() => {
                out.remove(at);
            }
            _ => {}
        }
    }
    out
}

fn edits() -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)
}

/// A YAML parse: `Ok` or an error naming the origin.
fn yaml(text: &str) {
    if let Err(e) = PipelineConfig::from_yaml(text, "fuzz.yaml") {
        assert!(e.to_string().contains("fuzz.yaml"), "{e}");
    }
}

/// A Flight parse: `Ok` (then a checked request) or an error message.
fn flight(bytes: &[u8]) {
    match FlightRequest::parse(bytes) {
        Ok(req) => assert!(req.check().is_ok()),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    let key = TicketKey::random().expect("the OS's random source");
    if let Err(e) = key.check(bytes) {
        assert!(!e.to_string().is_empty());
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn pipeline_yaml_arbitrary(text in "\\PC{0,200}|[-:{}\\[\\]&*!|>#'\" \na-z0-9]{0,120}") {
        yaml(&text);
    }

    #[test]
    fn pipeline_yaml_mutated(edits in edits()) {
        let bytes = mutate(YAML.as_bytes(), &edits);
        yaml(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn flight_json_arbitrary(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        flight(&bytes);
    }

    #[test]
    fn flight_json_mutated(edits in edits()) {
        flight(&mutate(REQUEST.as_bytes(), &edits));
    }
}

#[test]
fn the_valid_inputs_parse() {
    PipelineConfig::from_yaml(YAML, "ok.yaml").expect("valid YAML");
    FlightRequest::parse(REQUEST.as_bytes()).expect("valid request");
}

/// A billion-laughs alias bomb and deep nesting end in errors, not in
/// exhausted memory or stack.
#[test]
fn yaml_and_json_bombs_are_refused() {
    let mut bomb = String::from("a: &a [\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]\n");
    for i in 0..9 {
        let (prev, next) = ((b'a' + i) as char, (b'a' + i + 1) as char);
        bomb.push_str(&format!("{next}: &{next} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"));
    }
    let err = PipelineConfig::from_yaml(&bomb, "bomb.yaml").expect_err("a bomb");
    assert!(err.to_string().contains("bomb.yaml"), "{err}");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    PipelineConfig::from_yaml(&deep, "deep.yaml").expect_err("too deep for a config");
    let deep_json = format!(
        "{{\"dataset\": {}1{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    FlightRequest::parse(deep_json.as_bytes()).expect_err("too deep for a request");
}

/// Scripts nested far deeper than any real query end in a located error (the
/// SQL parser's recursion limit), not in a stack overflow that kills the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_scripts_are_errors() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    for script in [
        format!("SELECT {}1{};", "(".repeat(20_000), ")".repeat(20_000)),
        format!("SELECT {}true;", "NOT ".repeat(20_000)),
        format!(
            "SELECT * FROM {}(SELECT 1){};",
            "(SELECT * FROM ".repeat(5_000),
            ")".repeat(5_000)
        ),
    ] {
        // The parser's recursion limit, however it words it, at a place in the script.
        let err = r.run(&script).await.expect_err("too deep");
        assert!(err.to_string().starts_with("line 1, column"), "{err}");
    }
}

/// Saves dataset `d` (400 rows in several row groups and pages, a page
/// index) and returns its Parquet file's path and bytes.
async fn saved_dataset(root: &std::path::Path) -> (std::path::PathBuf, Vec<u8>) {
    let r = runner(root);
    r.run(
        "SET batch_size = 50;
         CREATE DATASET d AS SELECT value AS id, concat('row-', CAST(value AS VARCHAR)) AS tag
         FROM generate_series(1, 400);",
    )
    .await
    .expect("save");
    let info = Catalog::open(root.to_path_buf())
        .await
        .expect("catalog")
        .get("d", None)
        .await
        .expect("d");
    let path = std::fs::read_dir(&info.path)
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .expect("a parquet file");
    let bytes = std::fs::read(&path).expect("read");
    (path, bytes)
}

/// Every partition of `d`, read by a fresh loader: the rows or an error.
async fn load_all(root: &std::path::Path) -> Result<usize, udfchain::Error> {
    let session = Session::with_settings(Settings::new().root(root));
    let loader = Loader::from_dataset("d")
        .in_session(session)
        .partition_rows(64);
    let plan = loader.plan(0).await?;
    let mut rows = 0;
    for i in 0..plan.partitions.len() {
        let part = loader.fetch(&plan, i).await?;
        rows += part.batches.iter().map(|b| b.num_rows()).sum::<usize>();
    }
    Ok(rows)
}

/// Mutated and truncated Parquet files under a dataset: the loader reads
/// the footer and page index of each and ends in rows or an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loader_reads_mutated_parquet_footers_to_a_result_or_an_error() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let root = tempfile::tempdir().expect("root");
    let (path, valid) = saved_dataset(root.path()).await;
    assert_eq!(load_all(root.path()).await.expect("valid"), 400);
    let len = valid.len();
    // Edits land mostly in the footer (the last 2 KiB), some anywhere.
    let strategy = (
        proptest::collection::vec(
            (
                prop_oneof![3 => len.saturating_sub(2048)..len, 1 => 0..len],
                any::<u8>(),
            ),
            1..6,
        ),
        prop_oneof![3 => Just(None), 1 => (0..len).prop_map(Some)],
    );
    let mut runner = TestRunner::new(config(48));
    let (mut ok, mut err) = (0, 0);
    for _ in 0..48 {
        let (edits, cut) = strategy.new_tree(&mut runner).expect("case").current();
        let mut bytes = valid.clone();
        for (at, value) in edits {
            bytes[at] = value;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut);
        }
        std::fs::write(&path, &bytes).expect("write");
        match load_all(root.path()).await {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                err += 1;
            }
        }
    }
    println!("mutated parquet: {ok} read, {err} refused");
    assert!(err > 0, "some mutation must be refused");
}
