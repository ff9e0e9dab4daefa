//! The layers of DESIGN.md hold: a top-level module of the `udfchain` crate
//! imports only modules of lower layers (or itself), so there are no import
//! cycles between folders. Read from the source files, so a new import that
//! points up fails here with the file and the line.

use std::path::{Path, PathBuf};

/// Top-level modules by layer, lowest first. A module may use any module of a
/// lower layer, never one of its own layer or above.
const LAYERS: &[&[&str]] = &[
    &["util"],
    &["error"],
    &["runtime"],
    &["settings"],
    &["storage"],
    &["cache"],
    &["plan"],
    &["progress"],
    &["session"],
    &["dataset"],
    &["chain"],
    &["script"],
    &["loader"],
    &["serve"],
    &["pipeline"],
    &["cluster"],
    // The dataset browser (`udfchain ui`).
    &["ui"],
    // Internals for the binary, tests, benches and Python (`#[doc(hidden)]`).
    &["testing"],
    // The binary's command line (declared by main.rs, never by lib.rs).
    &["cli"],
];

/// Names re-exported at the crate root, by the module that defines them.
const ROOT_ITEMS: &[(&str, &str)] = &[
    ("Error", "error"),
    ("Result", "error"),
    ("Settings", "settings"),
    ("OnError", "settings"),
    ("Prefetch", "settings"),
    ("Chain", "chain"),
    ("ChainBuilder", "chain"),
    ("col", "chain"),
    ("SharedCache", "cache"),
    ("CacheUsage", "cache"),
    ("Session", "session"),
    ("Catalog", "dataset"),
    ("DatasetInfo", "dataset"),
    ("ScriptRunner", "script"),
    ("Output", "script"),
    ("RunReport", "plan"),
    ("OperatorReport", "plan"),
    ("Progress", "progress"),
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules a line refers to through `crate::name` or `super::super::..`-free
/// paths: only `crate::` paths cross folders in this crate.
fn referenced(line: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let tail = &rest[i + "crate::".len()..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let module = ROOT_ITEMS
            .iter()
            .find(|(item, _)| *item == name)
            .map(|(_, m)| *m)
            .unwrap_or(name);
        found.push(module);
        rest = &tail[end..];
    }
    // `use crate::{a::X, b::Y}` names modules after the brace.
    if let Some(i) = line.find("crate::{") {
        for part in line[i + "crate::{".len()..].split(',') {
            let name = part
                .trim()
                .split("::")
                .next()
                .unwrap_or("")
                .trim_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            if layer(name).is_some() {
                found.push(name);
            }
        }
    }
    found
}

#[test]
fn imports_point_down_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs"))
            .unwrap_or("");
        // The crate root and main.rs sit above every layer.
        let Some(own) = layer(top) else { continue };
        let text = std::fs::read_to_string(file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for module in referenced(code) {
                match layer(module) {
                    Some(l) if module != top && l >= own => violations.push(format!(
                        "{}:{}: {top} (layer {own}) uses {module} (layer {l}): {}",
                        rel.display(),
                        n + 1,
                        line.trim()
                    )),
                    _ => {}
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports that point up or sideways:\n{}",
        violations.join("\n")
    );
}

#[test]
fn every_top_level_module_has_a_layer() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("lib.rs");
    for line in lib.lines() {
        if let Some(name) = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("pub(crate) mod "))
            .or_else(|| line.strip_prefix("mod "))
        {
            let name = name.trim_end_matches(';');
            assert!(
                layer(name).is_some(),
                "module {name} is in no layer of LAYERS"
            );
        }
    }
}

/// The CLI is the binary's: `main.rs` declares `cli`, `lib.rs` does not, and
/// no library file names clap (no clap type in the library's API).
#[test]
fn the_cli_is_the_binarys() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let read = |f: &str| std::fs::read_to_string(src.join(f)).expect("read source");
    let declares_cli = |text: &str| text.lines().any(|l| l.trim() == "mod cli;");
    assert!(declares_cli(&read("main.rs")), "main.rs declares mod cli");
    assert!(
        !declares_cli(&read("lib.rs")),
        "lib.rs must not declare cli"
    );
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let uses_clap: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("cli")) && !f.ends_with("main.rs"))
        .filter(|f| {
            std::fs::read_to_string(f)
                .expect("read source")
                .lines()
                .any(|l| l.split("//").next().unwrap_or("").contains("clap"))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        uses_clap.is_empty(),
        "library files using clap: {uses_clap:?}"
    );
}

/// Names `plan/mod.rs` re-exports, by the submodule that defines them.
const PLAN_ITEMS: &[(&str, &str)] = &[
    ("AggregateExec", "aggregate"),
    ("BatchMapExec", "batch_map"),
    ("GenerateExec", "generate"),
    ("MapExec", "map"),
    ("PrefetchExec", "prefetch"),
    ("PrefetchHandle", "prefetch"),
    ("Instance", "lifecycle"),
    ("Udf", "udf"),
    ("UdfNode", "node"),
    ("UdfPlanner", "planner"),
    ("UdfQueryPlanner", "planner"),
    ("OperatorReport", "report"),
    ("RunReport", "report"),
];

/// The submodules of `plan/` one line of a `plan/` file refers to.
fn plan_refs(line: &str, own: &str) -> Vec<String> {
    let mut found = Vec::new();
    for prefix in ["crate::plan::", "super::"] {
        let mut rest = line;
        while let Some(i) = rest.find(prefix) {
            let tail = &rest[i + prefix.len()..];
            let names: Vec<&str> = if let Some(inner) = tail.strip_prefix('{') {
                inner
                    .split('}')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .map(|p| p.trim().split("::").next().unwrap_or("").trim())
                    .collect()
            } else {
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                vec![&tail[..end]]
            };
            for name in names {
                let module = PLAN_ITEMS
                    .iter()
                    .find(|(item, _)| *item == name)
                    .map(|(_, m)| *m)
                    .unwrap_or(name);
                if !module.is_empty() && module != own && module != "*" {
                    found.push(module.to_string());
                }
            }
            rest = tail;
        }
    }
    found
}

#[test]
fn the_files_of_plan_do_not_import_each_other_in_a_cycle() {
    let plan = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plan");
    let mut files = Vec::new();
    rust_files(&plan, &mut files);
    let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for file in &files {
        let rel = file.strip_prefix(&plan).expect("under plan");
        let own = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs"))
            .unwrap_or("")
            .to_string();
        if own == "mod" {
            continue; // plan/mod.rs only declares and re-exports
        }
        // Inside prefetch/, `super::` names prefetch's own files.
        let inner = rel.components().count() > 1;
        let text = std::fs::read_to_string(file).expect("read source");
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or("")
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for line in code.lines() {
            let line = if inner {
                line.replace("super::", "self::")
            } else {
                line.to_string()
            };
            for m in plan_refs(&line, &own) {
                edges.entry(own.clone()).or_default().insert(m);
            }
        }
    }
    // Depth-first search for a cycle.
    fn visit(
        n: &str,
        edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if !done.insert(n.to_string()) {
            return None;
        }
        path.push(n.to_string());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = Default::default();
    for n in edges.keys() {
        if let Some(cycle) = visit(n, &edges, &mut Vec::new(), &mut done) {
            panic!("plan/ files import each other: {}", cycle.join(" -> "));
        }
    }
    assert!(
        edges
            .get("operator")
            .is_some_and(|e| e.contains("prefetch")),
        "the scan sees operator.rs use PrefetchExec: {edges:?}"
    );
}
