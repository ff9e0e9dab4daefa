//! Tar archives from the outside world through SQL: shards written by Python
//! (the `webdataset` library's `TarWriter` when the Python has it, else
//! `tarfile` in PAX format, which is what that writer uses) give the members
//! and keys Python reads, names visible as `name` / `sample.names`; a hostile
//! size field ends in an error, not a spin.

use std::process::{Command, Stdio};

use udfchain::Output;
use udfchain::datafusion::arrow::array::RecordBatch;
use udfchain::udfs::decode_column;

use udfchain_testkit::runner;

/// Writes a shard at argv[1] and prints what Python reads from it as JSON:
/// `writer`, `members` (tarfile's regular members, in order) and `samples`
/// (`[key, [suffix, ...]]` as webdataset groups them).
const PY_SHARD: &str = r#"
import io, json, re, sys, tarfile, time
out = sys.argv[1]
samples = [
    {"__key__": "a/" + "deep/" * 30 + "0001", "jpg": b"\xff\xd8\xff", "cls": "3"},
    {"__key__": "données/ключ-✓-0002", "txt": "unicode ✓", "json": "{}"},
    {"__key__": "v1.2/" + "é" * 80 + "-0003", "seg.png": b"\x89PNG", "TXT": "upper"},
    {"__key__": "short", "txt": "plain"},
]
try:
    import webdataset
    writer = "webdataset " + webdataset.__version__
    with webdataset.TarWriter(out) as sink:
        for s in samples:
            sink.write(s)
except ImportError:
    writer = "tarfile PAX_FORMAT"
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
        for s in samples:
            for k in sorted(s):
                if k == "__key__":
                    continue
                v = s[k].encode() if isinstance(s[k], str) else s[k]
                ti = tarfile.TarInfo(s["__key__"] + "." + k)
                ti.size, ti.mtime, ti.mode = len(v), time.time(), 0o444
                ti.uname = ti.gname = "bigdata"
                tf.addfile(ti, io.BytesIO(v))
with tarfile.open(out) as tf:
    members = [m.name for m in tf if m.isreg()]
try:
    import webdataset
    got = [[s["__key__"], sorted(k for k in s if not k.startswith("__"))]
           for s in webdataset.WebDataset(out, shardshuffle=False)]
except ImportError:
    got = []
    for name in members:
        m = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
        if not m:
            continue
        if not got or got[-1][0] != m.group(1):
            got.append([m.group(1), []])
        got[-1][1].append(m.group(2).lower())
    for s in got:
        s[1].sort()
print(json.dumps({"writer": writer, "members": members, "samples": got}))
"#;

/// `UDFCHAIN_PYTHON` (the venv `.ci/run` makes, with `webdataset`), else `python3`.
fn python() -> Option<String> {
    std::env::var("UDFCHAIN_PYTHON")
        .ok()
        .into_iter()
        .chain(["python3".to_string()])
        .find(|py| {
            Command::new(py)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

fn table(outputs: Vec<Output>) -> Vec<RecordBatch> {
    match outputs.into_iter().last() {
        Some(Output::Table(b)) => b,
        other => panic!("not a table: {other:?}"),
    }
}

fn strings(batches: &[RecordBatch], col: usize) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| decode_column::<String>(b.column(col)).expect("strings"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_webdataset_shards_give_the_members_and_keys_python_reads() {
    let Some(python) = python() else {
        println!(
            "SKIPPED python_webdataset_shards_give_the_members_and_keys_python_reads: no python3 (nor UDFCHAIN_PYTHON) to write the shard"
        );
        return;
    };
    let data = tempfile::tempdir().expect("data");
    let root = tempfile::tempdir().expect("root");
    let shard = data.path().join("s-000.tar");
    let out = Command::new(&python)
        .args(["-c", PY_SHARD])
        .arg(&shard)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).expect("python's JSON");
    println!("shard written by {}", py["writer"]);
    let mut want_members: Vec<String> =
        serde_json::from_value(py["members"].clone()).expect("members");
    let mut want_samples: Vec<(String, Vec<String>)> =
        serde_json::from_value(py["samples"].clone()).expect("samples");
    assert_eq!(want_members.len(), 7, "{want_members:?}");
    assert!(want_members.iter().any(|m| m.len() > 150), "a long key");

    let r = runner(root.path());
    let dir = data.path().display();
    let members = table(
        r.run(&format!(
            "SELECT name, file_size(member) AS size FROM tar_members('{dir}')"
        ))
        .await
        .expect("tar_members"),
    );
    let mut got_members = strings(&members, 0);
    got_members.sort();
    want_members.sort();
    assert_eq!(got_members, want_members);
    let texts = strings(
        &table(
            r.run(&format!(
                "SELECT read_text(member) AS text FROM tar_members('{dir}') WHERE name LIKE '%.txt'"
            ))
            .await
            .expect("text members"),
        ),
        0,
    );
    assert!(texts.iter().any(|t| t == "unicode ✓"), "{texts:?}");

    let samples = table(
        r.run(&format!(
            "SELECT sample.key AS key, sample.names AS names FROM webdataset('{dir}')"
        ))
        .await
        .expect("webdataset"),
    );
    let keys = strings(&samples, 0);
    let names: Vec<Vec<String>> = samples
        .iter()
        .flat_map(|b| decode_column::<Vec<String>>(b.column(1)).expect("names"))
        .collect();
    let mut got_samples: Vec<(String, Vec<String>)> = keys
        .into_iter()
        .zip(names)
        .map(|(key, names)| {
            let mut suffixes: Vec<String> = names
                .iter()
                .map(|n| {
                    let rest = n.strip_prefix(&key).expect("a member of its key");
                    rest.trim_start_matches('.').to_lowercase()
                })
                .collect();
            suffixes.sort();
            (key, suffixes)
        })
        .collect();
    got_samples.sort();
    want_samples.sort();
    assert_eq!(got_samples, want_samples);
}

/// A 2 KiB tar whose GNU base-256 size field holds 2^64 - 512 makes
/// `count(*)` over `tar_members` fail, not spin forever on a wrapped
/// `data + size` (the parser's own test: `udfs/src/builtins/tar.rs`,
/// `gnu_base256_size_near_u64_max_is_an_error_not_a_hang`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_of_two_to_the_64_minus_512_is_an_error() {
    let data = tempfile::tempdir().expect("data");
    let root = tempfile::tempdir().expect("root");
    let mut h = tar::Header::new_gnu();
    h.set_path("big.bin").expect("path");
    h.set_mode(0o644);
    h.set_size(u64::MAX - 511);
    h.set_cksum();
    let mut bytes = h.as_bytes().to_vec();
    bytes.resize(2048, 0);
    std::fs::write(data.path().join("evil.tar"), bytes).expect("write");
    let r = runner(root.path());
    let err = r
        .run(&format!(
            "SELECT count(*) FROM tar_members('{}')",
            data.path().display()
        ))
        .await
        .expect_err("no member fits");
    let msg = err.to_string();
    assert!(
        msg.contains("evil.tar") && msg.contains("past the end"),
        "{msg}"
    );
}
