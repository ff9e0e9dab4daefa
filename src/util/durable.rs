//! Durability: fsync of files and of the directories that name them, so that
//! what a commit makes visible is on disk before the commit.
//!
//! Guarantees: [`sync_tree`] fsyncs every regular file under a dir and every
//! dir under it (itself last), so the files' bytes and their names survive a
//! power loss once it returns; [`sync_dir`] fsyncs one dir's entries (after a
//! rename into it or a file created in it). On platforms where a dir cannot be
//! opened for fsync (not Unix), dir syncs are no-ops; file syncs always run.
//! Every error names the path.

use std::io;
use std::path::Path;

/// Fsyncs the file at `path` (its data and metadata).
pub fn sync_file(path: &Path) -> io::Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| named(path, e))?;
    record(path);
    Ok(())
}

/// Fsyncs the dir at `path`: the names of the entries created or renamed in it.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| named(path, e))?;
    record(path);
    Ok(())
}

/// Fsyncs every regular file and dir under `dir`, then `dir` itself.
pub fn sync_tree(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| named(dir, e))? {
        let entry = entry.map_err(|e| named(dir, e))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| named(&path, e))?;
        if kind.is_dir() {
            sync_tree(&path)?;
        } else if kind.is_file() {
            sync_file(&path)?;
        }
    }
    sync_dir(dir)
}

fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("fsync {}: {e}", path.display()))
}

#[cfg(test)]
thread_local! {
    static SYNCED: std::cell::RefCell<Vec<std::path::PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Unit tests see which paths this thread fsynced.
#[cfg(test)]
fn record(path: &Path) {
    SYNCED.with(|s| s.borrow_mut().push(path.to_path_buf()));
}

#[cfg(not(test))]
fn record(_: &Path) {}

/// The paths this thread fsynced since the last call (unit tests only).
#[cfg(test)]
pub(crate) fn take_synced() -> Vec<std::path::PathBuf> {
    SYNCED.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn sync_tree_syncs_every_file_and_dir_children_first() {
        let root = tempfile::tempdir().expect("dir");
        let dir = root.path().join("v1");
        std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
        std::fs::write(dir.join("a.parquet"), b"a").expect("a");
        std::fs::write(dir.join("sub").join("b.parquet"), b"b").expect("b");
        take_synced();
        sync_tree(&dir).expect("sync");
        let synced = take_synced();
        let pos = |p: PathBuf| synced.iter().position(|s| *s == p).expect("synced");
        let (a, sub_b, sub, top) = (
            pos(dir.join("a.parquet")),
            pos(dir.join("sub").join("b.parquet")),
            pos(dir.join("sub")),
            pos(dir.clone()),
        );
        assert_eq!(synced.len(), 4, "{synced:?}");
        assert!(sub_b < sub && sub < top && a < top, "{synced:?}");
    }

    #[test]
    fn errors_name_the_path() {
        let root = tempfile::tempdir().expect("dir");
        let missing = root.path().join("missing");
        let e = sync_file(&missing).expect_err("missing");
        assert!(e.to_string().contains("missing"), "{e}");
        let e = sync_tree(&missing).expect_err("missing");
        assert!(e.to_string().contains("fsync"), "{e}");
    }
}
