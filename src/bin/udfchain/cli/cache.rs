//! `udfchain cache du|prune|clear`: the shared cache under the root.

use clap::Subcommand;
use udfchain::SharedCache;
use udfchain::{Error, Settings};

use crate::cli::print;

#[derive(Subcommand)]
pub enum CacheCommand {
    /// Entries and bytes in the cache.
    #[command(after_help = "\
Examples:
  udfchain cache du
  udfchain --root /data/udfchain cache du")]
    Du,
    /// Evict least recently used entries down to SIZE bytes (k/m/g suffixes allowed).
    #[command(after_help = "\
Examples:
  udfchain cache prune --to 10g
  udfchain cache prune --to 0")]
    Prune {
        /// The size to prune down to, in bytes (e.g. 500m, 10g).
        #[arg(long)]
        to: String,
    },
    /// Remove every entry.
    #[command(after_help = "\
Examples:
  udfchain cache clear")]
    Clear,
}

/// Runs one `cache` command.
pub fn run(command: CacheCommand, settings: &Settings) -> udfchain::Result<()> {
    let cache = SharedCache::open(settings.cache_dir(), None)?;
    match command {
        CacheCommand::Du => {
            let u = cache.du()?;
            print::line(format_args!(
                "{} entries, {} bytes in {}",
                u.files,
                u.bytes,
                cache.dir().display()
            ))
        }
        CacheCommand::Prune { to } => {
            let limit = udfchain::testing::parse_size(&to).ok_or_else(|| Error::Setting {
                name: "--to".into(),
                value: to.clone(),
                reason: format!(
                    "must be a size in bytes (e.g. 1048576, 512k, 64m, 2g), got {to:?}"
                ),
            })?;
            let removed = cache.prune_to(limit)?;
            print::line(format_args!(
                "removed {} entries, {} bytes",
                removed.files, removed.bytes
            ))
        }
        CacheCommand::Clear => {
            cache.clear()?;
            print::line(format_args!("cleared {}", cache.dir().display()))
        }
    }
}
