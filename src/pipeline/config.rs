//! A pipeline's YAML config: where its data is and how to read it, its trigger,
//! its selection strategy and its training hook.
//!
//! Guarantees: every struct rejects unknown keys (`deny_unknown_fields`), and a
//! config that does not parse is an [`Error::Pipeline`] naming the file and the
//! line and column of the offending key or value (serde-saphyr, which reads
//! externally tagged enums written as one-key maps: `{csv: {...}}`,
//! `{amount: {num_samples: 100}}`). A parsed config is checked before anything
//! runs: a valid pipeline name (it names the state dir and the datasets), a
//! batch size > 0, label sizes of 1 to 8 bytes, a poll interval that parses.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::pipeline::selector::SelectionConfig;
use crate::pipeline::trigger::TriggerConfig;

/// A whole pipeline config (the YAML file's top level).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Names the state dir (`<root>/pipelines/<name>/`) and the datasets
    /// (`<name>-trigger-<id>`): letters, digits, `_`, `-`, `.`.
    pub name: String,
    /// Where samples come from and how they are read.
    pub data: DataConfig,
    /// When a trigger fires.
    pub trigger: TriggerConfig,
    /// How a trigger's training set is selected.
    pub selection: SelectionConfig,
    #[serde(default)]
    /// The training hook run after each trigger, if any.
    pub training: Option<TrainingConfig>,
}

/// Where the samples are and how they are read.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Any udfchain URI: a local dir, `s3://bucket/prefix/`, `memory://`, ...
    pub uri: String,
    /// Only files whose path below `uri` matches, e.g. `"*.csv"`, `"**/*.png"`.
    #[serde(default)]
    pub glob: Option<String>,
    /// How files hold samples.
    pub format: Format,
    #[serde(default)]
    /// Where a sample's timestamp comes from.
    pub timestamp: TimestampSource,
    /// Samples per batch informed to the trigger and the selector.
    #[serde(default = "default_batch_size")]
    pub selector_batch_size: usize,
    /// Live mode: how often storage is listed again, e.g. `"500ms"`, `"10s"`, `"1m"`.
    #[serde(default)]
    pub poll_interval: Option<String>,
}

fn default_batch_size() -> usize {
    128
}

/// The file format of the samples.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Format {
    /// One sample per file. Its label is an integer read from the sibling file
    /// with the same name and `label_file_ext` as extension (`a.png` ->
    /// `a.label`), or, without `label_file_ext`, the name of the file's parent
    /// dir (`7/a.png` -> 7). Files ending with `label_file_ext` are never samples.
    SingleSample(SingleSampleFormat),
    /// One sample per CSV row; the label is an integer column.
    Csv(CsvFormat),
    /// Fixed-size binary records: the label (an unsigned integer of
    /// `label_size` bytes in `byte_order`) first, then the sample's bytes, as
    /// Modyn's BinaryFileWrapper reads them.
    Binary(BinaryFormat),
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
/// The `single_sample` format: one file per sample.
pub struct SingleSampleFormat {
    #[serde(default)]
    /// The extension of a sibling file holding the label (else the parent dir's name).
    pub label_file_ext: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
/// The `csv` format: one sample per row.
pub struct CsvFormat {
    /// The label's column, counted from 0.
    pub label_column: usize,
    /// Whether the first row is a header (skipped).
    #[serde(default)]
    pub header: bool,
    /// The field separator (one byte, default `,`).
    #[serde(default)]
    pub separator: Option<char>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
/// The `binary` format: fixed-size records, the label first.
pub struct BinaryFormat {
    /// Bytes per record, label included.
    pub record_size: usize,
    /// Bytes of the label at the start of each record (1 to 8).
    pub label_size: usize,
    #[serde(default)]
    /// The label's byte order.
    pub byte_order: ByteOrder,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
/// The byte order of a binary label.
pub enum ByteOrder {
    #[default]
    /// Least significant byte first (the default).
    Little,
    /// Most significant byte first.
    Big,
}

/// Where a sample's timestamp (seconds since the epoch) comes from.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TimestampSource {
    /// The file's last-modified time (whole seconds).
    #[default]
    Mtime,
    /// An integer column of a CSV row (counted from 0).
    Column(usize),
}

/// What runs at each trigger whose set is not empty.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainingConfig {
    /// A command (program and arguments, no shell) run at each trigger with
    /// `UDFCHAIN_PIPELINE`, `UDFCHAIN_TRIGGER_ID`, `UDFCHAIN_DATASET`,
    /// `UDFCHAIN_ROOT` and, when set, `UDFCHAIN_FLIGHT_ADDR` in its environment.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// The address of a `udfchain serve` Flight server the hook reads from
    /// (exported as `UDFCHAIN_FLIGHT_ADDR`); `--flight-addr` overrides it.
    #[serde(default)]
    pub flight_addr: Option<String>,
}

impl PipelineConfig {
    /// Parses and checks a YAML config; `origin` names it in errors (a path).
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self> {
        let options = serde_saphyr::Options {
            with_snippet: false,
            ..serde_saphyr::Options::default()
        };
        let config: Self = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
            let msg = e.to_string();
            let at = e
                .location()
                .map(|at| (at.line(), at.column()))
                .or_else(|| unknown_name(&msg).and_then(|name| locate_key(text, name)));
            let reason = match at {
                Some((line, column)) => format!(
                    "{origin}: line {line}, column {column}: {}",
                    message_without_location(&msg)
                ),
                None => format!("{origin}: {msg}"),
            };
            Error::Pipeline {
                pipeline: "config".into(),
                reason,
                source: None,
            }
        })?;
        config.check().map_err(|e| match e {
            Error::Pipeline {
                pipeline,
                reason,
                source,
            } => Error::Pipeline {
                pipeline,
                reason: format!("{origin}: {reason}"),
                source,
            },
            other => other,
        })?;
        Ok(config)
    }

    /// Reads and parses a YAML config file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path.display(), e))?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Checks what serde cannot: names, sizes, durations.
    pub fn check(&self) -> Result<()> {
        let bad = |reason: String| Error::Pipeline {
            pipeline: self.name.clone(),
            reason,
            source: None,
        };
        if !valid_name(&self.name) {
            return Err(bad(format!(
                "invalid pipeline name {:?}: use letters, digits, '_', '-', '.' (not starting with '.')",
                self.name
            )));
        }
        if self.data.selector_batch_size == 0 {
            return Err(bad("data.selector_batch_size must be > 0".into()));
        }
        if let Format::Binary(b) = &self.data.format {
            if !(1..=8).contains(&b.label_size) {
                return Err(bad(format!(
                    "data.format.binary.label_size must be 1 to 8 bytes, got {}",
                    b.label_size
                )));
            }
            if b.record_size <= b.label_size {
                return Err(bad(format!(
                    "data.format.binary.record_size ({}) must be larger than label_size ({})",
                    b.record_size, b.label_size
                )));
            }
        }
        if let Format::Csv(c) = &self.data.format
            && c.separator.is_some_and(|s| !s.is_ascii())
        {
            return Err(bad(
                "data.format.csv.separator must be one ASCII character".into()
            ));
        }
        if matches!(self.data.timestamp, TimestampSource::Column(_))
            && !matches!(self.data.format, Format::Csv(_))
        {
            return Err(bad(
                "data.timestamp {column: N} needs the csv format (use mtime otherwise)".into(),
            ));
        }
        if let Some(p) = &self.data.poll_interval {
            parse_duration(p).map_err(|r| bad(format!("data.poll_interval: {r}")))?;
        }
        if let Some(t) = &self.training
            && t.command.as_ref().is_some_and(|c| c.is_empty())
        {
            return Err(bad("training.command must name a program".into()));
        }
        Ok(())
    }

    /// The live mode's poll interval (default 10 s).
    pub fn poll_interval(&self) -> Duration {
        self.data
            .poll_interval
            .as_deref()
            .and_then(|p| parse_duration(p).ok())
            .unwrap_or(Duration::from_secs(10))
    }
}

/// serde-saphyr's message ends with " at line L, column C", which the error
/// already says first.
fn message_without_location(msg: &str) -> &str {
    match msg.rfind(" at line ") {
        Some(i) => &msg[..i],
        None => msg,
    }
}

/// The name in serde's "unknown field `x`" / "unknown variant `x`" messages,
/// which serde-saphyr reports without a location.
fn unknown_name(msg: &str) -> Option<&str> {
    let rest = msg
        .split_once("unknown field `")
        .or_else(|| msg.split_once("unknown variant `"))?
        .1;
    rest.split_once('`').map(|(name, _)| name)
}

/// The 1-based line and column of the first place `name` is written as a
/// mapping key (`name:` at the start of a line or after `{`, `,` or `- `),
/// outside comments.
fn locate_key(text: &str, name: &str) -> Option<(u64, u64)> {
    for (i, line) in text.lines().enumerate() {
        let code = match line.find(" #") {
            Some(c) => &line[..c],
            None if line.trim_start().starts_with('#') => "",
            None => line,
        };
        let mut from = 0;
        while let Some(pos) = code[from..].find(name) {
            let (start, end) = (from + pos, from + pos + name.len());
            from = end;
            // A quoted key: the quote must close right after the name.
            let (before, after) = match code[..start].chars().last() {
                Some(q @ ('"' | '\'')) if code[end..].starts_with(q) => {
                    (&code[..start - 1], &code[end + 1..])
                }
                _ => (&code[..start], &code[end..]),
            };
            let before = before.trim_end();
            let starts_key = before.is_empty() || before.ends_with(['{', ',', '-']);
            if starts_key && after.trim_start().starts_with(':') {
                return Some((i as u64 + 1, start as u64 + 1));
            }
        }
    }
    None
}

/// Pipeline and dataset names: as dataset names are.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Durations are read as settings read them.
pub use crate::settings::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_located() {
        let text = "a: 1\nb: {c: 2, cc: 3} # cc: x\n# cc: 4\n  - cc: 5\n";
        assert_eq!(locate_key(text, "cc"), Some((2, 11)));
        assert_eq!(locate_key("x:\n  - cc: 5\n", "cc"), Some((2, 5)));
        assert_eq!(locate_key("acc: 1\n", "cc"), None);
        assert_eq!(
            unknown_name("unknown field `sed`, expected one of `seed`"),
            Some("sed")
        );
    }

    #[test]
    fn names() {
        assert!(valid_name("demo-1.a_b"));
        assert!(!valid_name(".x"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(""));
    }
}
