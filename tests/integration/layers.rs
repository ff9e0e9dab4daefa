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
        // The crate root and the binary (src/bin/) sit above every layer.
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

/// The CLI is the binary's: it lives under `src/bin/udfchain/` (whose
/// `main.rs` declares `cli`), `lib.rs` does not declare it, and no library
/// file names clap (no clap type in the library's API).
#[test]
fn the_cli_is_the_binarys() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let read = |f: &str| std::fs::read_to_string(src.join(f)).expect("read source");
    let declares_cli = |text: &str| text.lines().any(|l| l.trim() == "mod cli;");
    assert!(
        declares_cli(&read("bin/udfchain/main.rs")),
        "src/bin/udfchain/main.rs declares mod cli"
    );
    assert!(
        !declares_cli(&read("lib.rs")),
        "lib.rs must not declare cli"
    );
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let uses_clap: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("bin")))
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

/// The module path (`["plan", "exec", "map"]`) of a file under `src/`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .map(|s| s.trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The module paths one line of the file at `own` (its module path) names
/// through `crate::` or `super::` (braces expanded one level).
fn named_paths(line: &str, own: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for prefix in ["crate::", "super::"] {
        let mut rest = line;
        while let Some(i) = rest.find(prefix) {
            let mut tail = &rest[i + prefix.len()..];
            let mut base: Vec<String> = Vec::new();
            if prefix == "super::" {
                // `super::super::x` climbs one module per `super`.
                let mut up = 1;
                while let Some(t) = tail.strip_prefix("super::") {
                    (tail, up) = (t, up + 1);
                }
                base = own[..own.len().saturating_sub(up)].to_vec();
            }
            rest = tail;
            let path_end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            let head: Vec<&str> = tail[..path_end]
                .split("::")
                .filter(|p| !p.is_empty())
                .collect();
            let mut paths = Vec::new();
            match tail[path_end..].strip_prefix('{') {
                Some(inner) => {
                    for part in inner.split('}').next().unwrap_or("").split(',') {
                        let mut p = head.clone();
                        p.extend(part.trim().split("::").next().map(str::trim));
                        paths.push(p);
                    }
                }
                None => paths.push(head),
            }
            for p in paths {
                let mut path = base.clone();
                path.extend(p.iter().filter(|s| !s.is_empty()).map(|s| s.to_string()));
                found.push(path);
            }
        }
    }
    found
}

/// What the `mod.rs` of `dir` re-exports: item name -> the entry of `dir`
/// that defines it (`pub use exec::Instance;` maps `Instance` to `exec`).
fn reexports(dir: &Path) -> std::collections::BTreeMap<String, String> {
    let mut items = std::collections::BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(dir.join("mod.rs")) else {
        return items;
    };
    for line in text.lines() {
        let Some(path) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let path = path.trim_end_matches(';');
        let entry = path.split("::").next().unwrap_or("").to_string();
        let names = match path.find('{') {
            Some(i) => path[i + 1..].trim_end_matches('}').to_string(),
            None => path.rsplit("::").next().unwrap_or("").to_string(),
        };
        for name in names.split(',') {
            items.insert(name.trim().to_string(), entry.clone());
        }
    }
    items
}

/// `plan/` is in rooms (`exec/`, `prefetch/`, ...): neither the rooms and the
/// files beside them, nor the files inside a room, import each other in a
/// cycle (tests aside). Each level is checked on its own: an edge joins the
/// entries of one folder (a file, or a room as a whole).
#[test]
fn the_files_of_plan_do_not_import_each_other_in_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let plan = src.join("plan");
    let mut files = Vec::new();
    rust_files(&plan, &mut files);
    let mut folders = vec![plan.clone()];
    for entry in std::fs::read_dir(&plan).expect("read plan").flatten() {
        if entry.path().is_dir() {
            folders.push(entry.path());
        }
    }
    let mut checked = Vec::new();
    for folder in &folders {
        let depth = module_path(folder.strip_prefix(&src).expect("under src")).len();
        let entries: std::collections::BTreeSet<String> = std::fs::read_dir(folder)
            .expect("read folder")
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .map(|n| n.trim_end_matches(".rs").to_string())
            })
            .filter(|n| n != "mod")
            .collect();
        let items = reexports(folder);
        let prefix = module_path(folder.strip_prefix(&src).expect("under src"));
        // The entry of this folder a module path falls in, if any.
        let entry_of = |path: &[String]| -> Option<String> {
            if path.len() <= depth || path[..depth] != prefix[..] {
                return None;
            }
            let name = &path[depth];
            let name = items.get(name).unwrap_or(name);
            entries.contains(name).then(|| name.clone())
        };
        let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            Default::default();
        for file in files.iter().filter(|f| f.starts_with(folder)) {
            let own = module_path(file.strip_prefix(&src).expect("under src"));
            let Some(from) = entry_of(&own) else {
                continue; // the folder's own mod.rs only declares and re-exports
            };
            let text = std::fs::read_to_string(file).expect("read source");
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for line in code.lines() {
                let line = line.split("//").next().unwrap_or("");
                for path in named_paths(line, &own) {
                    if let Some(to) = entry_of(&path).filter(|to| *to != from) {
                        edges.entry(from.clone()).or_default().insert(to);
                    }
                }
            }
        }
        if let Some(cycle) = find_cycle(&edges) {
            panic!(
                "files of {} import each other: {}",
                folder.display(),
                cycle.join(" -> ")
            );
        }
        checked.push((prefix.join("/"), edges));
    }
    // The scan sees what is there: the UDF operators use the prefetch (the
    // rooms), and each kind of operator the scaffolding they share (a room's
    // files).
    let edges_of = |folder: &str| {
        checked
            .iter()
            .find(|(f, _)| f == folder)
            .map(|(_, e)| e.clone())
            .unwrap_or_default()
    };
    assert!(
        edges_of("plan")
            .get("exec")
            .is_some_and(|e| e.contains("prefetch")),
        "the scan sees exec/ use the prefetch: {checked:?}"
    );
    assert!(
        edges_of("plan/exec")
            .get("map")
            .is_some_and(|e| e.contains("udf_exec")),
        "the scan sees map.rs use udf_exec.rs: {checked:?}"
    );
}

/// A cycle of `edges`, if there is one (depth-first search).
fn find_cycle(
    edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
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
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}
