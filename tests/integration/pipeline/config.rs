//! Pipeline configs: full and alternative forms accepted, unknown keys rejected with their line.

use udfchain::pipeline::PipelineConfig;

/// A config using every section docs/pipelines.md describes, with comments
/// in it as users write them.
const FULL_YAML: &str = r#"name: demo
data:
  uri: ./data                  # any udfchain URI
  glob: "*.csv"
  format: {csv: {label_column: 1, header: false}}   # columns counted from 0
    # or {single_sample: {label_file_ext: ".label"}}
    # or {binary: {record_size: 8, label_size: 4, byte_order: little}}
  timestamp: mtime             # or {column: 2} (seconds since the epoch)
  selector_batch_size: 128
trigger: {amount: {num_samples: 100}}   # or {time: {every: "1d"}} or {drift: {...}}
selection:
  strategy: new_data           # new_data | freshness | label_balanced | coreset
  maximum_keys_in_memory: 1000
  tail_triggers: 0             # omit for all data so far
  limit: 50                    # omit for no limit
  limit_reset: last            # last | uniform
  seed: 0
training:
  command: ["python3", "train.py"]   # optional; run at each trigger
"#;

#[test]
fn a_full_config_is_accepted_and_its_alternatives_too() {
    use udfchain::pipeline::{ByteOrder, Format, TimestampSource};
    let c = PipelineConfig::from_yaml(FULL_YAML, "demo.yaml").expect("the full config");
    assert_eq!(c.name, "demo");
    assert_eq!(c.data.uri, "./data");
    assert_eq!(c.data.glob.as_deref(), Some("*.csv"));
    assert!(matches!(&c.data.format, Format::Csv(f) if f.label_column == 1 && !f.header));
    assert_eq!(c.data.timestamp, TimestampSource::Mtime);
    assert_eq!(c.data.selector_batch_size, 128);
    assert_eq!(c.selection.maximum_keys_in_memory, 1000);
    assert_eq!(c.selection.tail_triggers, Some(0));
    assert_eq!(c.selection.limit, Some(50));
    assert_eq!(
        c.training.and_then(|t| t.command),
        Some(vec!["python3".to_string(), "train.py".to_string()])
    );
    let alt = FULL_YAML
        .replace(
            "format: {csv: {label_column: 1, header: false}}",
            "format: {binary: {record_size: 8, label_size: 4, byte_order: big}}",
        )
        .replace(
            "trigger: {amount: {num_samples: 100}}",
            "trigger: {time: {every: \"1d\"}}",
        );
    let c = PipelineConfig::from_yaml(&alt, "alt.yaml").expect("binary + time");
    assert!(matches!(&c.data.format, Format::Binary(b) if b.byte_order == ByteOrder::Big));
    let alt = FULL_YAML
        .replace(
            "format: {csv: {label_column: 1, header: false}}",
            "format: {single_sample: {label_file_ext: \".label\"}}",
        )
        .replace("timestamp: mtime ", "timestamp: {column: 2}");
    let err = PipelineConfig::from_yaml(&alt, "alt.yaml").expect_err("column needs csv");
    assert!(err.to_string().contains("needs the csv format"), "{err}");
}

#[test]
fn an_unknown_key_is_rejected_with_its_line() {
    let yaml = FULL_YAML.replace("  selector_batch_size: 128", "  selector_batch_sise: 128");
    let err = PipelineConfig::from_yaml(&yaml, "demo.yaml").expect_err("unknown key");
    let msg = err.to_string();
    assert!(
        msg.contains("demo.yaml: line 9") && msg.contains("selector_batch_sise"),
        "{msg}"
    );
    // Nested too: inside the selection and inside the format's enum.
    let yaml = FULL_YAML.replace("  seed: 0", "  sed: 0");
    let msg = PipelineConfig::from_yaml(&yaml, "demo.yaml")
        .expect_err("unknown key")
        .to_string();
    assert!(msg.contains("line 17") && msg.contains("sed"), "{msg}");
    let yaml = FULL_YAML.replace("header: false", "headers: false");
    let msg = PipelineConfig::from_yaml(&yaml, "demo.yaml")
        .expect_err("unknown key")
        .to_string();
    assert!(msg.contains("line 5") && msg.contains("headers"), "{msg}");
}
