//! [`Instance`]: one UDF's state in this process, shared by every run of
//! that UDF value in flight at once (see `udfchain_udfs::Lifecycle`).
//!
//! Guarantees:
//! - one live `Instance` per UDF value (per `Arc` of it) in the process:
//!   runs planned while one lives share it (and so share one setup and one
//!   `concurrency` bound);
//! - `setup` runs once, lazily, on the UDF pool before the first call that
//!   needs it; the calls waiting for it get its outcome; a failure is the
//!   error of every call of the runs sharing the instance ([`setup_failed`]
//!   tells the operators it is not a row's failure);
//! - `teardown` runs exactly once per setup that succeeded, when the last
//!   run holding the instance drops it (its operators and streams are gone:
//!   success, error, cancel alike), on the thread that drops it;
//! - a later instance of the same UDF sets up only after the one before it
//!   has torn down (the two never overlap on the UDF's state).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{OnceCell, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};
use udfchain_udfs::{Lifecycle, UdfError};

use crate::error::{Error, Source};
use crate::plan::logical::udf::Udf;

/// One UDF's state in this process, while runs hold it.
pub struct Instance {
    id: u64,
    key: usize,
    udf: Udf,
    /// The setup's outcome, once it ran.
    ready: OnceCell<Result<(), Source>>,
    set_up: AtomicBool,
    /// Held from setup to teardown: the next instance of this UDF waits for it.
    turn: Turn,
    held: Mutex<Option<OwnedMutexGuard<()>>>,
    /// The UDF's `concurrency` bound, if it has one.
    permits: Option<Arc<Semaphore>>,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Instance({})", self.udf.signature().name)
    }
}

/// Whose turn it is to hold a UDF's state (see [`Instance`]'s `turn`).
type Turn = Arc<tokio::sync::Mutex<()>>;

/// The live instances by UDF address (with their ids), and each UDF's turn lock.
struct Live {
    by_udf: HashMap<usize, (u64, Weak<Instance>, Turn)>,
}

static LIVE: Mutex<Option<Live>> = Mutex::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl Instance {
    /// The live instance of `udf`, or a new one.
    pub fn of(udf: &Udf) -> Arc<Self> {
        let key = udf.address();
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        let live = live.get_or_insert_with(|| Live {
            by_udf: HashMap::new(),
        });
        if let Some((_, weak, _)) = live.by_udf.get(&key)
            && let Some(found) = weak.upgrade()
        {
            return found;
        }
        if live.by_udf.len() >= 1024 {
            // Forget UDFs with no instance and nobody in their turn.
            live.by_udf
                .retain(|_, (_, w, turn)| w.strong_count() > 0 || Arc::strong_count(turn) > 1);
        }
        let turn = live
            .by_udf
            .get(&key)
            .map(|(_, _, t)| Arc::clone(t))
            .unwrap_or_default();
        let instance = Arc::new(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            key,
            udf: udf.clone(),
            ready: OnceCell::new(),
            set_up: AtomicBool::new(false),
            turn: Arc::clone(&turn),
            held: Mutex::new(None),
            permits: udf
                .concurrency()
                .map(|n| Arc::new(Semaphore::new(n.max(1)))),
        });
        live.by_udf
            .insert(key, (instance.id, Arc::downgrade(&instance), turn));
        instance
    }

    /// What it is keyed by ([`Udf::address`]).
    pub fn key(&self) -> usize {
        self.key
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        self.udf.lifecycle()
    }

    /// Runs the setup once (later calls wait for it and get its outcome).
    /// `Err` is the setup's error, for every call.
    ///
    /// # Cancel safety
    /// Dropping the future before the setup ended lets the next call run it.
    pub async fn ready(&self) -> Result<(), Source> {
        if self.lifecycle().is_none() {
            return Ok(());
        }
        self.ready
            .get_or_init(|| async {
                let turn = Arc::clone(&self.turn).lock_owned().await;
                let Some(life) = self.lifecycle() else {
                    return Ok(());
                };
                match life.setup().await {
                    Ok(()) => {
                        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(turn);
                        self.set_up.store(true, Ordering::SeqCst);
                        Ok(())
                    }
                    Err(source) => Err(Arc::new(UdfError::Setup { source }) as Source),
                }
            })
            .await
            .clone()
    }

    /// A permit of the UDF's `concurrency` bound (none when it has none).
    pub async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        match &self.permits {
            Some(p) => Arc::clone(p).acquire_owned().await.ok(),
            None => None,
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.set_up.load(Ordering::SeqCst)
            && let Some(life) = self.lifecycle()
        {
            life.teardown();
        }
        // The next instance of this UDF may set up now.
        drop(self.held.lock().unwrap_or_else(|e| e.into_inner()).take());
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(live) = live.as_mut()
            && live.by_udf.get(&self.key).is_some_and(|(id, _, turn)| {
                *id == self.id && Arc::strong_count(turn) <= 2 // the map's and ours
            })
        {
            live.by_udf.remove(&self.key);
        }
    }
}

/// Whether `error` is a UDF's failed setup (which fails the run whatever
/// `on_error` says), not a row's failure.
pub fn setup_failed(error: &Error) -> bool {
    match error {
        Error::Udf { source, .. } => matches!(
            source.downcast_ref::<UdfError>(),
            Some(UdfError::Setup { .. })
        ),
        _ => false,
    }
}
