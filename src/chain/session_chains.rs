//! The chains and the catalog of a [`Session`]: here rather than in
//! `session/`, which sits below the builder and the catalog and does not
//! import them (`session/` holds every constructor of a `Session` itself).

use std::sync::Arc;

use super::Chain;
use crate::dataset::Catalog;
use crate::error::Result;
use crate::session::Session;

impl Session {
    /// A chain over the latest version of dataset `name` (under this session's root).
    pub fn from_dataset(self: &Arc<Self>, name: &str) -> Chain {
        Chain::from_dataset(name).in_session(Arc::clone(self))
    }

    /// The dataset catalog under this session's root dir.
    pub async fn catalog(&self) -> Result<Catalog> {
        Catalog::open(self.settings().get_root()).await
    }

    /// A chain over the objects under `uri` (recursive).
    pub fn from_storage(self: &Arc<Self>, uri: &str) -> Chain {
        Chain::from_storage_in(Arc::clone(self), uri)
    }
}
