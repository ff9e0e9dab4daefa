//! Per-client read-ahead: the partitions a Flight client will ask for next,
//! fetched before it asks.
//!
//! A *stream* is opened by each `get_flight_info` call (its id is in every
//! ticket it returns) and holds that client's epoch plan. When the stream is
//! opened, partitions `0..k` start; when the client asks for partition `i`,
//! partitions `i+1..=i+k` start (those not started yet), at most `p` of the
//! stream's fetches running at once (`k` = `prefetch_partitions`, `p` =
//! `parallel_requests`). A client iterating the endpoints in order therefore
//! finds its next partitions fetched or in flight.
//!
//! Guarantees:
//! - streams are independent: each has its own fetch tasks and limit, so a
//!   slow client only ever delays itself;
//! - every partition the server holds (fetched ahead or being sent) is counted
//!   in [`ReadAheadStats::buffered_bytes`] until it is dropped, and its memory
//!   stays charged to the session's memory pool (the loader's reservation);
//! - a stream is closed — its fetches aborted, its partitions dropped — when
//!   its last partition has been asked for, when a client drops a `do_get` mid
//!   partition (a disconnect or a kill), or when it has been idle (no `do_get`
//!   running or started) for the TTL; a ticket of a closed stream still works
//!   in the server process that issued it (stream ids are never reused there):
//!   the stream is opened again from the ticket (the plan is deterministic), the
//!   partition is fetched on demand and the read-ahead resumes from there;
//! - fetch tasks never outlive their stream: they abort when dropped;
//! - bounded ([`ServeLimits`]): the bytes held for all clients never exceed
//!   `memory_limit`. A partition fetched ahead is kept only while the held
//!   bytes stay within [`READ_AHEAD_SHARE`] of it (else it is dropped and
//!   fetched again when asked for, and no more read-ahead starts while the
//!   share is full), so read-ahead alone never leaves asked-for partitions
//!   without room; a partition asked for that does not fit is refused with
//!   RESOURCE_EXHAUSTED naming the limit. Open streams are capped per server
//!   and per client IP address (`max_streams`, `max_streams_per_client`); a
//!   stream over a cap is refused the same way. Every refusal says which
//!   limit and the `udfchain serve` flag that raises it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::loader::ahead::FetchAhead;
use crate::loader::{EpochPlan, Loader, PartitionData};
use crate::util::lock::lock;

/// Bytes of partitions held for all clients, unless the server says otherwise.
pub const DEFAULT_MEMORY_LIMIT: usize = 1 << 30;
/// Open streams per server, unless the server says otherwise.
pub const DEFAULT_MAX_STREAMS: usize = 256;
/// Open streams per client IP address, unless the server says otherwise.
pub const DEFAULT_MAX_STREAMS_PER_CLIENT: usize = 32;
/// The share of `memory_limit` partitions fetched ahead may hold (the rest is
/// kept for partitions asked for): three quarters.
pub const READ_AHEAD_SHARE: (usize, usize) = (3, 4);

/// What one server holds at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Bytes of partitions held (fetched ahead or being sent), all clients.
    pub memory_limit: usize,
    /// Open streams (one per `get_flight_info` still being read).
    pub max_streams: usize,
    /// Open streams of one client IP address.
    pub max_streams_per_client: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            memory_limit: DEFAULT_MEMORY_LIMIT,
            max_streams: DEFAULT_MAX_STREAMS,
            max_streams_per_client: DEFAULT_MAX_STREAMS_PER_CLIENT,
        }
    }
}

impl ServeLimits {
    /// The bytes partitions fetched ahead may hold.
    fn read_ahead_bytes(&self) -> usize {
        let (num, den) = READ_AHEAD_SHARE;
        self.memory_limit / den * num
    }
}

/// A refusal over a limit: RESOURCE_EXHAUSTED for the client.
fn exhausted(msg: String) -> Error {
    Error::DataFusion(Arc::new(
        datafusion::error::DataFusionError::ResourcesExhausted(msg),
    ))
}

/// A fetched partition the server holds; counted in the buffered bytes until
/// dropped (its memory pool reservation goes with it).
pub struct HeldPartition {
    pub data: PartitionData,
    // Declared after `data`: fields drop in order, so the partition's memory
    // and its pool reservation are freed before the stats stop counting it
    // (stats showing nothing held means the pool has it back).
    _counted: Counted,
}

/// One held partition in the counters, until dropped.
struct Counted {
    counters: Arc<Counters>,
    bytes: usize,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.counters
            .buffered_bytes
            .fetch_sub(self.bytes, Ordering::SeqCst);
        self.counters
            .buffered_partitions
            .fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Counters {
    buffered_bytes: AtomicUsize,
    buffered_partitions: AtomicUsize,
    partitions_served: AtomicU64,
    ready_hits: AtomicU64,
    misses: AtomicU64,
    streams_closed_on_disconnect: AtomicU64,
    streams_expired: AtomicU64,
    over_memory_limit: AtomicU64,
    refused_streams: AtomicU64,
}

impl Counters {
    /// Counts `bytes` as held if the held bytes stay within `limit`.
    fn charge(&self, bytes: usize, limit: usize) -> bool {
        self.buffered_bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(bytes).filter(|&n| n <= limit)
            })
            .is_ok()
    }
}

/// What the read-ahead holds now (the `stats` action's body).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReadAheadStats {
    /// Bytes of the partitions held: fetched ahead, or being sent.
    pub buffered_bytes: usize,
    /// Partitions held.
    pub buffered_partitions: usize,
    /// Open streams (one per `get_flight_info` still being read).
    pub streams: usize,
    /// Partitions fetched or being fetched ahead of their `do_get`.
    pub pending_partitions: usize,
    /// `do_get` calls answered.
    pub partitions_served: u64,
    /// `do_get` calls whose partition was already fetched when asked for.
    pub ready_hits: u64,
    /// `do_get` calls whose partition had not been started ahead.
    pub misses: u64,
    /// Streams closed because a client dropped a `do_get` mid-partition.
    pub streams_closed_on_disconnect: u64,
    /// Streams closed after the idle TTL.
    pub streams_expired: u64,
    /// The server's `memory_limit`: `buffered_bytes` never exceeds it.
    pub memory_limit: usize,
    /// Partitions fetched ahead and dropped, or asked for and refused,
    /// because they did not fit in the memory limit.
    pub over_memory_limit: u64,
    /// `get_flight_info` calls refused by a stream cap.
    pub refused_streams: u64,
}

struct ClientStream {
    client: Option<IpAddr>,
    loader: Loader,
    plan: Arc<EpochPlan>,
    k: usize,
    state: Mutex<StreamState>,
}

struct StreamState {
    /// The partitions fetched ahead: `None` when one did not fit in the
    /// read-ahead's share of the memory limit.
    ahead: FetchAhead<Option<HeldPartition>>,
    /// `do_get` calls of this stream running now.
    active: usize,
    last_used: Instant,
}

/// Every client stream of one server.
pub struct ReadAhead {
    streams: Mutex<HashMap<u64, Arc<ClientStream>>>,
    next_id: AtomicU64,
    counters: Arc<Counters>,
    ttl: Duration,
    limits: ServeLimits,
}

/// Marks one running `do_get`; when dropped before [`Serving::finish`], the
/// client went away mid-partition and its stream is closed.
pub struct Serving {
    readahead: Arc<ReadAhead>,
    id: u64,
    finished: bool,
}

impl Serving {
    /// The partition was sent whole (or its error was).
    pub fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let stream = lock(&self.readahead.streams).get(&self.id).cloned();
        if let Some(s) = stream {
            let mut st = lock(&s.state);
            st.active = st.active.saturating_sub(1);
            st.last_used = Instant::now();
        }
        if !self.finished {
            let counters = &self.readahead.counters;
            self.readahead
                .close_counted(self.id, Some(&counters.streams_closed_on_disconnect));
        }
    }
}

impl ReadAhead {
    /// Streams idle for `ttl` are closed by [`ReadAhead::expire`]; what is
    /// held stays within `limits`.
    pub fn new(ttl: Duration, limits: ServeLimits) -> Arc<Self> {
        Arc::new(Self {
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            counters: Arc::new(Counters::default()),
            ttl,
            limits,
        })
    }

    /// Opens a stream for `plan` of `client` and starts its first `k`
    /// partitions; returns its id. Refused (RESOURCE_EXHAUSTED) over a stream cap.
    pub fn open(
        self: &Arc<Self>,
        client: Option<IpAddr>,
        loader: Loader,
        plan: EpochPlan,
        k: usize,
        p: usize,
    ) -> Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let stream = self.insert(id, client, loader, plan, k, p, 0)?;
        self.start(&stream, 0, k);
        Ok(id)
    }

    /// Refuses a new stream of `client` when the server or the client is at
    /// its cap.
    fn admit(
        &self,
        streams: &HashMap<u64, Arc<ClientStream>>,
        client: Option<IpAddr>,
    ) -> Result<()> {
        let l = &self.limits;
        let refuse = |msg: String| {
            self.counters
                .refused_streams
                .fetch_add(1, Ordering::Relaxed);
            Err(exhausted(msg))
        };
        if streams.len() >= l.max_streams {
            return refuse(format!(
                "the server has {} open streams, its limit (udfchain serve --max-streams {}): \
                 read streams to their end or drop them (idle ones close after \
                 --readahead-ttl), or raise --max-streams",
                streams.len(),
                l.max_streams
            ));
        }
        if let Some(ip) = client {
            let own = streams.values().filter(|s| s.client == Some(ip)).count();
            if own >= l.max_streams_per_client {
                return refuse(format!(
                    "client {ip} has {own} open streams, the per-client limit (udfchain serve \
                     --max-streams-per-client {}): read its streams to their end or drop \
                     them, or raise --max-streams-per-client",
                    l.max_streams_per_client
                ));
            }
        }
        Ok(())
    }

    /// Registers stream `id` of `client` (or returns the one a concurrent call
    /// registered); partitions below `read_from` count as read already.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &self,
        id: u64,
        client: Option<IpAddr>,
        loader: Loader,
        plan: EpochPlan,
        k: usize,
        p: usize,
        read_from: usize,
    ) -> Result<Arc<ClientStream>> {
        let handle = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::internal(format!("a read-ahead stream needs a tokio runtime: {e}"))
        })?;
        let stream = Arc::new(ClientStream {
            client,
            loader,
            plan: Arc::new(plan),
            k,
            state: Mutex::new(StreamState {
                ahead: FetchAhead::new(handle, p, read_from),
                active: 0,
                last_used: Instant::now(),
            }),
        });
        let mut streams = lock(&self.streams);
        if let Some(s) = streams.get(&id) {
            return Ok(Arc::clone(s));
        }
        self.admit(&streams, client)?;
        streams.insert(id, Arc::clone(&stream));
        Ok(stream)
    }

    /// Starts partitions `from..from + n` of `stream` not started yet, while
    /// the read-ahead's share of the memory limit is not full (the rest start
    /// at a later `do_get`, or are fetched when asked for).
    fn start(&self, stream: &Arc<ClientStream>, from: usize, n: usize) {
        let total = stream.plan.partitions.len();
        let mut st = lock(&stream.state);
        for index in from..from.saturating_add(n).min(total) {
            if st.ahead.is_started(index) {
                continue;
            }
            if self.counters.buffered_bytes.load(Ordering::SeqCst) >= self.limits.read_ahead_bytes()
            {
                return;
            }
            st.ahead.start(index, self.fetch(stream, index, false));
        }
    }

    /// The fetch of partition `index` of `stream`: ahead of its `do_get` (kept
    /// only within the read-ahead's share of the memory limit) or asked for
    /// (kept within the limit, else refused).
    fn fetch(
        &self,
        stream: &Arc<ClientStream>,
        index: usize,
        asked: bool,
    ) -> impl Future<Output = Result<Option<HeldPartition>>> + Send + 'static {
        let (loader, plan) = (stream.loader.clone(), Arc::clone(&stream.plan));
        let counters = Arc::clone(&self.counters);
        let limits = self.limits;
        async move {
            let data = loader.fetch(&plan, index).await?;
            let room = if asked {
                limits.memory_limit
            } else {
                limits.read_ahead_bytes()
            };
            if !counters.charge(data.bytes, room) {
                counters.over_memory_limit.fetch_add(1, Ordering::Relaxed);
                if !asked {
                    return Ok(None);
                }
                return Err(exhausted(format!(
                    "partition {index} ({} bytes) does not fit in the server's memory limit \
                     (udfchain serve --memory-limit {} bytes; {} held for all clients now): \
                     retry later, ask for fewer partition_rows or prefetch_partitions, or \
                     raise --memory-limit",
                    data.bytes,
                    limits.memory_limit,
                    counters.buffered_bytes.load(Ordering::SeqCst)
                )));
            }
            counters.buffered_partitions.fetch_add(1, Ordering::Relaxed);
            let bytes = data.bytes;
            Ok(Some(HeldPartition {
                data,
                _counted: Counted { counters, bytes },
            }))
        }
    }

    /// Partition `index` of stream `id` for a `do_get`: taken from the
    /// read-ahead (or fetched now), with the next `k` partitions started.
    /// `reopen` rebuilds the stream when it was closed (its loader, plan, k, p),
    /// for `client`.
    ///
    /// # Cancel safety
    /// Dropping the future aborts this partition's fetch and closes the stream
    /// (the client went away).
    pub async fn take<F, Fut>(
        self: &Arc<Self>,
        id: u64,
        index: usize,
        client: Option<IpAddr>,
        reopen: F,
    ) -> Result<(HeldPartition, Serving, Arc<EpochPlan>)>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(Loader, EpochPlan, usize, usize)>>,
    {
        let existing = lock(&self.streams).get(&id).cloned();
        let stream = match existing {
            Some(s) => s,
            None => {
                // Resume the read-ahead at this index (lower ones are read).
                let (loader, plan, k, p) = reopen().await?;
                self.insert(id, client, loader, plan, k, p, index)?
            }
        };
        let total = stream.plan.partitions.len();
        if index >= total {
            return Err(Error::Setting {
                name: "ticket index".into(),
                value: index.to_string(),
                reason: format!("is beyond the plan's {total} partitions"),
            });
        }
        let mut serving = Serving {
            readahead: Arc::clone(self),
            id,
            finished: false,
        };
        let fetch = {
            let mut st = lock(&stream.state);
            st.active += 1;
            st.last_used = Instant::now();
            // Partitions far behind this one were skipped by the client.
            st.ahead.forget_below(index.saturating_sub(stream.k));
            match st.ahead.take(index) {
                Some(f) => {
                    let counter = if f.is_ready() {
                        &self.counters.ready_hits
                    } else {
                        &self.counters.misses
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    f
                }
                None => {
                    self.counters.misses.fetch_add(1, Ordering::Relaxed);
                    st.ahead
                        .fetch_asked(index, self.fetch(&stream, index, true))
                }
            }
        };
        self.start(&stream, index + 1, stream.k);
        if index + 1 == total {
            // The last partition: nothing more to read ahead for this client.
            self.close(id);
        }
        let held = match fetch.wait().await {
            // Fetched ahead but over the read-ahead's share: fetch it now.
            Ok(None) => {
                let again = lock(&stream.state)
                    .ahead
                    .fetch_asked(index, self.fetch(&stream, index, true));
                again.wait().await.and_then(|h| {
                    h.ok_or_else(|| Error::internal("an asked-for fetch came back empty"))
                })
            }
            Ok(Some(h)) => Ok(h),
            Err(e) => Err(e),
        };
        let held = match held {
            Ok(h) => h,
            Err(e) => {
                serving.finish();
                return Err(e);
            }
        };
        self.counters
            .partitions_served
            .fetch_add(1, Ordering::Relaxed);
        Ok((held, serving, Arc::clone(&stream.plan)))
    }

    /// Closes stream `id` (aborting its fetches, dropping its partitions);
    /// false if it was not open.
    pub fn close(&self, id: u64) -> bool {
        self.close_counted(id, None)
    }

    /// [`Self::close`], counting a closed stream in `counter` under the same
    /// lock [`Self::stats`] reads under, so a snapshot never shows the stream
    /// gone but not yet counted.
    fn close_counted(&self, id: u64, counter: Option<&AtomicU64>) -> bool {
        let removed = {
            let mut streams = lock(&self.streams);
            let removed = streams.remove(&id);
            if let (Some(_), Some(counter)) = (&removed, counter) {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            removed
        };
        match removed {
            Some(s) => {
                lock(&s.state).ahead.clear();
                true
            }
            None => false,
        }
    }

    /// Closes streams idle (no `do_get` running) for longer than the TTL.
    pub fn expire(&self) {
        let now = Instant::now();
        let idle: Vec<u64> = lock(&self.streams)
            .iter()
            .filter(|(_, s)| {
                let st = lock(&s.state);
                st.active == 0 && now.duration_since(st.last_used) > self.ttl
            })
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            self.close_counted(id, Some(&self.counters.streams_expired));
        }
    }

    /// Closes every stream (server shutdown).
    pub fn close_all(&self) {
        let all: Vec<_> = lock(&self.streams).drain().collect();
        for (_, s) in all {
            lock(&s.state).ahead.clear();
        }
    }

    /// A snapshot of what is held.
    pub fn stats(&self) -> ReadAheadStats {
        let streams = lock(&self.streams);
        let pending = streams
            .values()
            .map(|s| lock(&s.state).ahead.pending())
            .sum();
        let c = &self.counters;
        ReadAheadStats {
            buffered_bytes: c.buffered_bytes.load(Ordering::SeqCst),
            buffered_partitions: c.buffered_partitions.load(Ordering::SeqCst),
            streams: streams.len(),
            pending_partitions: pending,
            partitions_served: c.partitions_served.load(Ordering::Relaxed),
            ready_hits: c.ready_hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            streams_closed_on_disconnect: c.streams_closed_on_disconnect.load(Ordering::Relaxed),
            streams_expired: c.streams_expired.load(Ordering::Relaxed),
            memory_limit: self.limits.memory_limit,
            over_memory_limit: c.over_memory_limit.load(Ordering::Relaxed),
            refused_streams: c.refused_streams.load(Ordering::Relaxed),
        }
    }
}
