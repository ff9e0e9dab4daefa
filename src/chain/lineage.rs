//! What a chain reads, as a save records it (`dataset/lineage.rs` keeps it):
//! every table scan of its logical plan, through views, table functions
//! (`read_storage`, `read_dataset`, `read_parquet`, ... in SQL), joins,
//! unions and subqueries.
//!
//! Guarantees: a listing (`from_storage`, `read_storage`, a delta listing)
//! is its storage URI; a Parquet / CSV / JSON scan is its URI, unless it is
//! the data of a dataset version under the catalog's root, which is that
//! dataset's name and the version read (resolved when the chain was planned,
//! so "latest" is recorded as the number it meant). Entries keep plan order
//! and appear once. URIs are cleaned of credentials by
//! [`LineageEntry::storage`]. In-memory values (`from_values`, `VALUES`)
//! are no source.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::LogicalPlan;

use super::DeltaSource;
use crate::dataset::LineageEntry;
use crate::storage::StorageTable;

/// The sources `plan` reads, for a catalog rooted at `root`.
pub(crate) fn sources(plan: &LogicalPlan, root: &Path) -> Vec<LineageEntry> {
    let datasets = Datasets::new(root);
    let mut out = Vec::new();
    visit(plan, &datasets, &mut out);
    out
}

fn visit(plan: &LogicalPlan, datasets: &Datasets, out: &mut Vec<LineageEntry>) {
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Ok(provider) = source_as_provider(&scan.source)
        {
            provider_sources(&provider, datasets, out);
        }
        Ok(TreeNodeRecursion::Continue)
    });
}

fn provider_sources(
    provider: &Arc<dyn TableProvider>,
    datasets: &Datasets,
    out: &mut Vec<LineageEntry>,
) {
    let mut push = |e: LineageEntry| {
        if !out.contains(&e) {
            out.push(e);
        }
    };
    if let Some(t) = provider.downcast_ref::<StorageTable>() {
        push(LineageEntry::storage(&t.location().source));
    } else if let Some(d) = provider.downcast_ref::<DeltaSource>() {
        push(LineageEntry::storage(&d.table.location().source));
    } else if let Some(t) = provider.downcast_ref::<ListingTable>() {
        for url in t.table_paths() {
            match datasets.version_of(url.as_str()) {
                Some((name, version)) => push(LineageEntry::Dataset { name, version }),
                None => push(LineageEntry::storage(url.as_str())),
            }
        }
    } else if let Some(inner) = provider.get_logical_plan() {
        // A view (`ViewTable`, a `DataFrame` as a table): what it reads.
        visit(&inner, datasets, out);
    }
}

/// The `datasets/` dir of a catalog, to recognize version data by path.
struct Datasets {
    dir: PathBuf,
    canonical: Option<PathBuf>,
}

impl Datasets {
    fn new(root: &Path) -> Self {
        let dir = std::path::absolute(root)
            .unwrap_or_else(|_| root.to_path_buf())
            .join("datasets");
        let canonical = std::fs::canonicalize(&dir).ok();
        Self { dir, canonical }
    }

    /// `(name, version)` when `url` is a file under `datasets/<name>/v<N>/`.
    fn version_of(&self, url: &str) -> Option<(String, u32)> {
        let path = url::Url::parse(url)
            .ok()
            .filter(|u| u.scheme() == "file")?
            .to_file_path()
            .ok()?;
        let relative = path
            .strip_prefix(&self.dir)
            .ok()
            .map(Path::to_path_buf)
            .or_else(|| {
                let canonical = std::fs::canonicalize(&path).ok()?;
                Some(
                    canonical
                        .strip_prefix(self.canonical.as_ref()?)
                        .ok()?
                        .to_path_buf(),
                )
            })?;
        let mut parts = relative.components();
        let (Some(Component::Normal(name)), Some(Component::Normal(v))) =
            (parts.next(), parts.next())
        else {
            return None;
        };
        let name = name.to_str()?.to_string();
        let version = v.to_str()?.strip_prefix('v')?.parse::<u32>().ok()?;
        crate::dataset::check_name(&name).ok()?;
        Some((name, version))
    }
}
