//! The Python benchmark: udfchain from Python next to DataChain, Daft and
//! udfchain's Rust API, on the same files of one S3 server on 127.0.0.1 (the
//! test kit's s3s-fs server, 20 ms added per request), in one run:
//!
//! ```sh
//! cargo bench --bench python                 # A: 2,000 x 64 KiB, C: 200 files
//! cargo bench --bench python -- --quick      # A: 400, C: 40
//! cargo bench --bench python -- --workloads M          # M: 2,000 JPEGs
//! cargo bench --bench python -- --quick --workloads A,C,M   # M: 300
//! cargo bench --bench python -- --workloads I          # I: M's 2,000 JPEGs
//! UDFCHAIN_BENCH_PYTHON=~/venv/bin/python cargo bench --bench python
//! ```
//!
//! Workloads (`--workloads`, default A,C): A hashes every byte of 64 KiB
//! objects (the Python UDF with hashlib, the Rust one with sha2); C runs a
//! pure-Python CPU loop of about 20 ms per 4 KiB file (calibrated by the
//! driver); M is model inference: 640x480 JPEGs of about 100 KB, decoded and
//! resized to 224x224 with Pillow and classified in batches of 32 by a tiny
//! ONNX CNN (`examples/python/tiny_cnn.py`), the model loaded once per worker
//! (the driver writes the JPEGs into the server's directory, builds the
//! model and measures the bound, cores / (decode + inference CPU per file),
//! before the timed runs); I decodes M's JPEGs, converts them to RGB and
//! resizes them to 224x224, one number (the mean) per image: udfchain's
//! native functions in SQL and as chain expressions, its Pillow UDF, Daft's
//! native functions and DataChain's Pillow UDF, next to the native bound
//! (cores / the native CPU per image, measured here on one thread after the
//! runs) and the thumbnail path's speed-up on 4000x3000 JPEGs. This program
//! starts the server, writes the A and
//! C objects, runs the Rust API on A (defaults; prefetch 64),
//! then `benches/python/driver.py` with the venv's interpreter
//! (`$UDFCHAIN_BENCH_PYTHON`, else `~/.cache/udfchain-bench-venv/bin/python`)
//! for the Python peers, each run in a fresh interpreter. A peer that is not
//! installed or fails is a record with its error. Nothing is asserted: it
//! reports ratios measured in this run (udfchain-py / DataChain at defaults,
//! udfchain-py / Rust API, C against cores / t_udf, M against its bound and
//! between peers) on stdout and in `<target>/bench/python.json`.

use std::io::BufRead;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use udfchain::udfs::UdfError;
use udfchain::{File, Settings};

use udfchain_testkit::{ACCESS_KEY, BUCKET, Latency, S3Server, SECRET_KEY};

const LATENCY: Duration = Duration::from_millis(20);
const A_SIZE: usize = 64 * 1024;
const C_SIZE: usize = 4 * 1024;
const WORKLOADS: [&str; 4] = ["A", "C", "M", "I"];
/// Workload I's target side, as the driver's `I_SIZE`.
const I_SIZE: u32 = 224;

fn object_bytes(i: usize, size: usize) -> Vec<u8> {
    (0..size).map(|j| ((i * 131 + j * 7) % 251) as u8).collect()
}

fn write_objects(bucket_dir: &FsPath, prefix: &str, files: usize, size: usize) {
    let dir = bucket_dir.join(prefix);
    std::fs::create_dir_all(&dir).expect("mkdir");
    for i in 0..files {
        std::fs::write(dir.join(format!("f{i:05}.bin")), object_bytes(i, size)).expect("write");
    }
}

/// The Rust API on workload A under `settings`: one record.
async fn rust_a(server: &S3Server, config: &str, settings: Settings, files: usize) -> Value {
    let t0 = Instant::now();
    let chain = server
        .session()
        .from_storage(&format!("s3://{BUCKET}/a/"))
        .settings(settings)
        .map("out", |f: File| async move {
            let bytes = f.read().await?;
            Ok::<String, UdfError>(format!("{:x}", Sha256::digest(&bytes)))
        });
    match chain.collect().await {
        Ok(batches) => {
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            let seconds = t0.elapsed().as_secs_f64();
            json!({"peer": "udfchain-rust", "config": config, "workload": "A", "files": rows,
                   "seconds": seconds, "files_per_s": rows as f64 / seconds, "expected_files": files})
        }
        Err(e) => {
            json!({"peer": "udfchain-rust", "config": config, "workload": "A", "error": e.to_string()})
        }
    }
}

fn python() -> PathBuf {
    std::env::var_os("UDFCHAIN_BENCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/udfchain-bench-venv/bin/python")
        })
}

/// The driver's JSON lines (each echoed to stderr as it arrives), or one
/// record saying why there are none.
fn python_peers(
    server: &S3Server,
    quick: bool,
    workloads: &[String],
    m_files: usize,
    scratch: &FsPath,
) -> Vec<Value> {
    let driver = FsPath::new(env!("CARGO_MANIFEST_DIR")).join("benches/python/driver.py");
    let py = python();
    let mut cmd = Command::new(&py);
    cmd.arg(&driver)
        .arg("all")
        .args(["--workloads", &workloads.join(",")]);
    if quick {
        cmd.arg("--quick");
    }
    cmd.env("UDFCHAIN_BENCH_ENDPOINT", &server.endpoint)
        .env("UDFCHAIN_BENCH_BUCKET", BUCKET)
        .env("UDFCHAIN_BENCH_C_SIZE", C_SIZE.to_string())
        // M: the driver writes the JPEGs into the server's directory itself.
        .env("UDFCHAIN_BENCH_M_DIR", server.bucket_dir().join("m"))
        .env("UDFCHAIN_BENCH_M_FILES", m_files.to_string())
        .env("UDFCHAIN_BENCH_MODEL", scratch.join("tiny_cnn.onnx"))
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("UDFCHAIN_ROOT", scratch.join("udfchain"))
        .env("DATACHAIN_ROOT_DIR", scratch.join("datachain"))
        .env("DO_NOT_TRACK", "1")
        .env("DAFT_ANALYTICS_ENABLED", "0")
        .current_dir(scratch)
        .stdout(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return vec![
                json!({"peer": "python", "error": format!("cannot run {}: {e} (set UDFCHAIN_BENCH_PYTHON to a venv with udfchain, datachain and daft)", py.display())}),
            ];
        }
    };
    let mut out = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("  {line}");
            match serde_json::from_str::<Value>(&line) {
                Ok(v) => out.push(v),
                Err(_) => out.push(json!({"peer": "python", "error": format!("not JSON: {line}")})),
            }
        }
    }
    match child.wait() {
        Ok(s) if s.success() => {}
        Ok(s) => out.push(json!({"peer": "python", "error": format!("driver exited with {s}")})),
        Err(e) => out.push(json!({"peer": "python", "error": e.to_string()})),
    }
    out
}

fn rate(records: &[Value], peer: &str, config: &str, workload: &str) -> Option<f64> {
    records
        .iter()
        .find(|r| r["peer"] == peer && r["config"] == config && r["workload"] == workload)
        .and_then(|r| r["files_per_s"].as_f64())
}

/// A C run's files/s over its own bound (cores / the t_udf it measured just
/// before it), else over the calibration's.
fn over_bound(records: &[Value], peer: &str, config: &str, calibrated: Option<f64>) -> Option<f64> {
    let run = records
        .iter()
        .find(|r| r["peer"] == peer && r["config"] == config && r["workload"] == "C")?;
    let bound = run["bound_files_per_s"].as_f64().or(calibrated)?;
    run["files_per_s"].as_f64().map(|f| f / bound)
}

/// An M run's files/s over its own bound (cores / the decode + inference
/// CPU per file it measured just before it), else over the driver's.
fn m_over_bound(records: &[Value], peer: &str, config: &str, measured: Option<f64>) -> Option<f64> {
    let run = records
        .iter()
        .find(|r| r["peer"] == peer && r["config"] == config && r["workload"] == "M")?;
    let bound = run["bound_files_per_s"].as_f64().or(measured)?;
    run["files_per_s"].as_f64().map(|f| f / bound)
}

/// M's ratios: every run over the bound, udfchain-py over the others, and
/// the model loads of each run next to the copies its settings ask for.
fn m_ratios(records: &[Value]) -> serde_json::Map<String, Value> {
    let div = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let mut out = serde_json::Map::new();
    let Some(bound) = records
        .iter()
        .find(|r| r["workload"] == "M" && r["bound"] == true)
    else {
        return out;
    };
    let measured = bound["bound_files_per_s"].as_f64();
    out.insert(
        "M_bound_files_per_s (cores / (decode + inference CPU per file))".into(),
        json!(measured),
    );
    for (k, field) in [
        ("M_decode_resize_cpu_ms_per_file", "decode_cpu_s_per_file"),
        (
            "M_inference_cpu_ms_per_file (batches of 32)",
            "infer_cpu_s_per_file",
        ),
    ] {
        out.insert(k.into(), json!(bound[field].as_f64().map(|s| s * 1e3)));
    }
    out.insert(
        "M_bare_loop_files_per_s (cores processes, no engine, no I/O)".into(),
        bound["bare_loop_processes_files_per_s"].clone(),
    );
    out.insert(
        "M_bare_loop_files_per_s (cores threads, one session)".into(),
        bound["bare_loop_threads_files_per_s"].clone(),
    );
    for peer in ["udfchain-py", "datachain", "daft"] {
        for config in ["defaults", "best"] {
            out.insert(
                format!("M_{}_{config}_over_bound", peer.replace('-', "_")),
                json!(m_over_bound(records, peer, config, measured)),
            );
        }
    }
    // Over what this machine gives the bare loop in `cores` processes (on a
    // VM two processes rarely get twice one), as C's machine_parallel.
    let bare = bound["bare_loop_processes_files_per_s"].as_f64();
    for peer in ["udfchain-py", "datachain", "daft"] {
        out.insert(
            format!("M_{}_best_over_bare_loop_processes", peer.replace('-', "_")),
            json!(div(rate(records, peer, "best", "M"), bare)),
        );
    }
    for other in ["datachain", "daft"] {
        for config in ["defaults", "best"] {
            out.insert(
                format!("M_udfchain_py_{config}_over_{other}_{config}"),
                json!(div(
                    rate(records, "udfchain-py", config, "M"),
                    rate(records, other, config, "M")
                )),
            );
        }
        // The target: udfchain at its defaults against the peer at its best.
        out.insert(
            format!("M_udfchain_py_defaults_over_{other}_best"),
            json!(div(
                rate(records, "udfchain-py", "defaults", "M"),
                rate(records, other, "best", "M")
            )),
        );
    }
    out
}

fn ratios(records: &[Value]) -> Value {
    let div = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let cal = records.iter().find(|r| r["calibration"] == true);
    let cores = cal.and_then(|c| c["cores"].as_f64());
    let t_udf = cal.and_then(|c| c["t_udf_seconds"].as_f64());
    let bound_c = cores.zip(t_udf).map(|(n, t)| n / t);
    let parallel = cal.and_then(|c| c["machine_parallel_files_per_s"].as_f64());
    let trivial = records
        .iter()
        .find(|r| r["workload"] == "T")
        .and_then(|r| r["us_per_row_over_rust"].as_f64());
    let mut all = json!({
        "A_udfchain_py_defaults_over_datachain_defaults":
            div(rate(records, "udfchain-py", "defaults", "A"), rate(records, "datachain", "defaults", "A")),
        "A_udfchain_py_best_over_datachain_best":
            div(rate(records, "udfchain-py", "best", "A"), rate(records, "datachain", "best", "A")),
        "A_udfchain_py_defaults_over_daft_defaults":
            div(rate(records, "udfchain-py", "defaults", "A"), rate(records, "daft", "defaults", "A")),
        "A_udfchain_py_defaults_over_rust_defaults":
            div(rate(records, "udfchain-py", "defaults", "A"), rate(records, "udfchain-rust", "defaults", "A")),
        "A_udfchain_py_best_over_rust_best":
            div(rate(records, "udfchain-py", "best", "A"), rate(records, "udfchain-rust", "best", "A")),
        "C_bound_files_per_s (cores / t_udf, calibration)": bound_c,
        "C_machine_parallel_files_per_s (bare loop, cores processes)": parallel,
        "C_udfchain_py_best_over_machine_parallel": div(rate(records, "udfchain-py", "best", "C"), parallel),
        "C_datachain_best_over_machine_parallel": div(rate(records, "datachain", "best", "C"), parallel),
        "C_udfchain_py_best_over_bound": over_bound(records, "udfchain-py", "best", bound_c),
        "C_udfchain_py_defaults_over_bound": over_bound(records, "udfchain-py", "defaults", bound_c),
        "C_datachain_best_over_bound": over_bound(records, "datachain", "best", bound_c),
        "C_daft_best_over_bound": over_bound(records, "daft", "best", bound_c),
        "trivial_map_us_per_row_over_rust": trivial,
    });
    if let Some(m) = all.as_object_mut() {
        m.extend(m_ratios(records));
        m.extend(i_ratios(records));
    }
    all
}

/// Workload I's ratios: udfchain's native rows against its Pillow UDF,
/// Daft's native functions and DataChain; against the native bound; the
/// thumbnail path against a full decode.
fn i_ratios(records: &[Value]) -> serde_json::Map<String, Value> {
    let div = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let r = |peer: &str, config: &str| rate(records, peer, config, "I");
    let bound = records
        .iter()
        .find(|r| r["workload"] == "I" && r["bound"] == true);
    let mut out = serde_json::Map::new();
    for native in ["native-sql", "native-expr"] {
        let n = native.replace('-', "_");
        for (other, peer, config) in [
            ("pillow", "udfchain-py", "pillow"),
            ("daft_native", "daft", "defaults"),
            ("datachain_defaults", "datachain", "defaults"),
            ("datachain_best", "datachain", "best"),
        ] {
            out.insert(
                format!("I_udfchain_{n}_over_{other}"),
                json!(div(r("udfchain-py", native), r(peer, config))),
            );
        }
        out.insert(
            format!("I_udfchain_{n}_over_bound"),
            json!(div(
                r("udfchain-py", native),
                bound.and_then(|b| b["bound_files_per_s"].as_f64())
            )),
        );
    }
    out.insert(
        "I_udfchain_loader_over_pillow_dataset_2_workers".into(),
        json!(div(
            r("udfchain-py", "loader"),
            r("pillow-dataset", "2-workers")
        )),
    );
    out.insert(
        "I_udfchain_pillow_over_datachain_best".into(),
        json!(div(r("udfchain-py", "pillow"), r("datachain", "best"))),
    );
    out.insert(
        "I_bound_files_per_s (cores / native decode + RGB + resize CPU)".into(),
        json!(bound.and_then(|b| b["bound_files_per_s"].as_f64())),
    );
    out.insert(
        "I_thumbnail_over_full_decode (224 px of 4000x3000 JPEGs, CPU)".into(),
        json!(bound.and_then(|b| b["thumbnail_speedup"].as_f64())),
    );
    out
}

/// I's native bound and thumbnail ratio, measured here on one thread: CPU
/// per image of decode + RGB + resize to 224x224 over the first `sample`
/// JPEGs of `dir` (read before the clock, best of 3 passes); and a 224-pixel
/// thumbnail of 4000x3000 JPEGs (decoded at reduced size in the DCT, then
/// fitted) against a full decode + resize of the same files.
fn i_bound(dir: &FsPath, sample: usize) -> Value {
    use udfchain::udfs::builtins::image::{
        DecodeOptions, Filter, Format, Image, MAX_IMAGE_PIXELS, Mode, TensorShape, decode,
        decode_to_tensor, encode, resize, resize_to_fit,
    };
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    names.retain(|p| p.extension().is_some_and(|e| e == "jpg"));
    names.sort();
    names.truncate(sample);
    let datas: Vec<Vec<u8>> = names.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    if datas.is_empty() {
        return json!({"workload": "I", "bound": true, "error": format!("no JPEGs in {}", dir.display())});
    }
    let rgb = DecodeOptions {
        mode: Some(Mode::Rgb),
        ..DecodeOptions::default()
    };
    let best = |f: &dyn Fn(&[u8])| {
        (0..3)
            .map(|_| {
                let t0 = Instant::now();
                for d in &datas {
                    f(d);
                }
                t0.elapsed().as_secs_f64() / datas.len() as f64
            })
            .fold(f64::INFINITY, f64::min)
    };
    let per_image = best(&|d| {
        let img = decode(d, &rgb).expect("decode");
        std::hint::black_box(resize(img.view(), I_SIZE, I_SIZE, Filter::Bilinear).expect("resize"));
    });
    // The loader's `with_images` kernel (a size-hinted decode into a tensor
    // block), one image at a time.
    let shape = TensorShape::new(I_SIZE, I_SIZE, Mode::Rgb).expect("shape");
    let loader_per_image = best(&|d| {
        std::hint::black_box(
            decode_to_tensor(&[Some(d)], &shape, MAX_IMAGE_PIXELS).expect("tensor"),
        );
    });
    // 4000x3000 photo-like JPEGs: gradients and a texture.
    let big: Vec<Vec<u8>> = (0..3u32)
        .map(|k| {
            let (w, h) = (4000u32, 3000u32);
            let mut data = Vec::with_capacity((w * h * 3) as usize);
            for y in 0..h {
                for x in 0..w {
                    let t = ((x / 3 + y / 5 + k * 17) % 32) as u8;
                    data.extend_from_slice(&[
                        (x * 255 / w) as u8 ^ t,
                        (y * 255 / h) as u8,
                        ((x + y) % 256) as u8 / 2 + t,
                    ]);
                }
            }
            let img = Image::new(w, h, Mode::Rgb, data).expect("image");
            encode(img.view(), Format::Jpeg, Some(85)).expect("jpeg")
        })
        .collect();
    let time = |f: &dyn Fn(&[u8])| {
        (0..2)
            .map(|_| {
                let t0 = Instant::now();
                for d in &big {
                    f(d);
                }
                t0.elapsed().as_secs_f64() / big.len() as f64
            })
            .fold(f64::INFINITY, f64::min)
    };
    let full = time(&|d| {
        let img = decode(d, &rgb).expect("decode");
        std::hint::black_box(resize_to_fit(img.view(), I_SIZE, Filter::Bicubic).expect("fit"));
    });
    let hinted = DecodeOptions {
        mode: Some(Mode::Rgb),
        max_side: Some(I_SIZE),
        ..DecodeOptions::default()
    };
    let thumb = time(&|d| {
        let img = decode(d, &hinted).expect("decode");
        std::hint::black_box(resize_to_fit(img.view(), I_SIZE, Filter::Bicubic).expect("fit"));
    });
    let cores = udfchain::testing::cores() as f64;
    json!({
        "workload": "I", "bound": true, "sample_files": datas.len(),
        "native_cpu_s_per_image": per_image, "cores": cores,
        "loader_cpu_s_per_image": loader_per_image,
        "bound_files_per_s": cores / per_image,
        "thumbnail_source": "4000x3000 JPEG", "full_decode_s": full, "thumbnail_s": thumb,
        "thumbnail_speedup": full / thumb,
    })
}

fn table(records: &[Value]) -> String {
    let mut s = format!(
        "{:<14} {:<11} {:<3} {:>6} {:>9} {:>9}  {}\n",
        "peer", "config", "wl", "files", "seconds", "files/s", "settings / error"
    );
    for r in records
        .iter()
        .filter(|r| r["files_per_s"].is_number() || r["error"].is_string())
    {
        let f = |k: &str| r[k].as_f64().map_or("-".into(), |v| format!("{v:.2}"));
        let note = r["error"]
            .as_str()
            .map(|e| format!("error: {}", e.chars().take(120).collect::<String>()))
            .unwrap_or_else(|| {
                let mut note = r["settings"].to_string();
                if r["workload"] == "M" {
                    // Model loads next to the copies the settings ask for
                    // (null: the engine's choice), and the values' check.
                    note += &format!(
                        "; model loads {} (processes {}) for workers {}; {:.2} of bound; {} mismatches of {}, {} invalid",
                        r["model_loads"],
                        r["model_load_processes"],
                        r["workers"],
                        r["over_bound"].as_f64().unwrap_or(f64::NAN),
                        r["mismatches"],
                        r["checked"],
                        r["invalid_values"]
                    );
                }
                note
            });
        s += &format!(
            "{:<14} {:<11} {:<3} {:>6} {:>9} {:>9}  {}\n",
            r["peer"].as_str().unwrap_or("?"),
            r["config"].as_str().unwrap_or("-"),
            r["workload"].as_str().unwrap_or("-"),
            r["files"].as_u64().map_or("-".into(), |v| v.to_string()),
            f("seconds"),
            f("files_per_s"),
            note
        );
    }
    s
}

/// `--workloads A,C,M` (or `--workloads=...`), upper-cased; default A,C.
/// Other arguments (cargo's `--bench`) are ignored.
fn workloads(args: &[String]) -> Vec<String> {
    let mut list = "A,C".to_string();
    for (i, a) in args.iter().enumerate() {
        if let Some(v) = a.strip_prefix("--workloads=") {
            list = v.to_string();
        } else if a == "--workloads"
            && let Some(v) = args.get(i + 1)
        {
            list = v.clone();
        }
    }
    let mut out = Vec::new();
    for w in list
        .split(',')
        .map(|w| w.trim().to_uppercase())
        .filter(|w| !w.is_empty())
    {
        if !WORKLOADS.contains(&w.as_str()) {
            eprintln!("python bench: unknown workload {w:?} (A, C, M or I)");
            std::process::exit(2);
        }
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let workloads = workloads(&args);
    let has = |w: &str| workloads.iter().any(|x| x == w);
    let (a_files, c_files, m_files) = if quick {
        (400, 40, 300)
    } else {
        (2000, 200, 2000)
    };
    let server = S3Server::start_with_latency(Latency::Constant(LATENCY), None);
    if has("A") {
        write_objects(&server.bucket_dir(), "a", a_files, A_SIZE);
    }
    if has("C") {
        write_objects(&server.bucket_dir(), "c", c_files, C_SIZE);
    }
    let scratch = tempfile::tempdir().expect("scratch dir");
    eprintln!(
        "python bench ({}): workloads {}: A {a_files} x 64 KiB, C {c_files} x 4 KiB, M {m_files} JPEGs of 640x480, {} ms per request, server {}",
        if quick { "quick" } else { "full" },
        workloads.join(","),
        LATENCY.as_millis(),
        server.endpoint
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let root = scratch.path().join("rust");
    let mut records = if has("A") {
        rt.block_on(async {
            let defaults = Settings::new().root(&root);
            let best = Settings::new()
                .root(&root)
                .set("prefetch", "64")
                .expect("prefetch");
            vec![
                rust_a(&server, "defaults", defaults, a_files).await,
                rust_a(&server, "best", best, a_files).await,
            ]
        })
    } else {
        Vec::new()
    };
    for r in &records {
        eprintln!("  {r}");
    }
    records.extend(python_peers(
        &server,
        quick,
        &workloads,
        m_files,
        scratch.path(),
    ));
    if has("I") {
        let bound = i_bound(&server.bucket_dir().join("m"), 64);
        eprintln!("  {bound}");
        records.push(bound);
    }
    let ratios = ratios(&records);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| FsPath::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("bench");
    let record = json!({
        "bench": "python",
        "quick": quick,
        "workloads": workloads,
        "cores": udfchain::testing::cores(),
        "latency_ms": LATENCY.as_millis() as u64,
        "a_files": a_files, "a_size": A_SIZE, "c_files": c_files, "c_size": C_SIZE,
        "m_files": m_files,
        "gets": server.object_gets(),
        "runs": records,
        "ratios": ratios,
    });
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("python.json");
    match std::fs::write(
        &path,
        serde_json::to_string_pretty(&record).unwrap_or_default(),
    ) {
        Ok(()) => eprintln!("wrote {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
    print!("{}", table(&records));
    println!("ratios (measured in this run):");
    if let Some(m) = ratios.as_object() {
        for (k, v) in m {
            // Only the workloads of this run (the trivial map runs with A or C).
            let run = match k.get(..2) {
                Some("A_") => has("A"),
                Some("C_") => has("C"),
                Some("M_") => has("M"),
                Some("I_") => has("I"),
                _ => has("A") || has("C"),
            };
            if v.is_null() && !run {
                continue;
            }
            let v = v.as_f64().map_or("-".into(), |x| format!("{x:.3}"));
            println!("  {k:<55} {v}");
        }
    }
}
