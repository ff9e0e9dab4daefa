//! The Arrow Flight service: datasets listed, one endpoint per loader
//! partition, partitions streamed from the per-client read-ahead.
//!
//! - `list_flights`: one `FlightInfo` per dataset (its latest version: schema,
//!   rows, bytes, and a descriptor whose command is `{"dataset": .., "version": ..}`);
//!   the criteria's expression, if any, is a name prefix;
//! - `get_flight_info(cmd = JSON request)`: the epoch's partitions for the
//!   request's (rank, worker), one endpoint each, in the order to read them
//!   (`ordered = true`); opens a read-ahead stream (see `readahead.rs`);
//! - `get_schema(cmd)`: the schema the request's partitions have;
//! - `do_get(ticket)`: one partition, as Arrow IPC messages of at most the
//!   request's `max_message_bytes` (default [`default_message_bytes`]: 2 MiB,
//!   16 MiB for Arrow's C++ client; larger batches are split, no per-row work),
//!   their bodies the partition's own buffers (`encode.rs`, sent as they are by
//!   `routes.rs`), only for a ticket this server process issued, unchanged
//!   (`ticket.rs`);
//! - `do_action("stats")`: the read-ahead's [`super::ReadAheadStats`] as JSON.
//!
//! Errors reach the client as Flight statuses whose message says what to fix:
//! a bad request or an altered ticket is `InvalidArgument`, a ticket of another
//! server process `FailedPrecondition`, an unknown dataset or version
//! `NotFound`, a full memory pool, a partition over the server's
//! `--memory-limit` or a stream over a stream cap `ResourceExhausted` (naming
//! the limit and its flag), storage and other failures `Internal`
//! (credentials never appear: the messages are redacted).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use futures::stream::{BoxStream, Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::encode::{self, FlightMessage};
use super::readahead::{HeldPartition, ReadAhead, Serving};
use super::request::{FlightRequest, RequestError};
use super::ticket::{TicketError, TicketKey};
use crate::chain::Chain;
use crate::dataset::Catalog;
use crate::error::Error;
use crate::loader::{EpochPlan, Loader};
use crate::session::Session;
use crate::util::redact::redact;

/// The target size of one Flight message unless the request's
/// `max_message_bytes` says otherwise (Arrow's default: fits any gRPC client's
/// default 4 MiB receive limit).
pub const FLIGHT_DATA_SIZE: usize = 2 * 1024 * 1024;

/// The target size of one Flight message for a client known to accept any
/// size (see [`default_message_bytes`]): a partition of a few MB in one
/// message, which pyarrow's client reads about twice as fast as in 2 MiB
/// pieces (it copies every message that spans several HTTP/2 frames).
pub const FLIGHT_DATA_SIZE_UNLIMITED_CLIENT: usize = 16 * 1024 * 1024;

/// The message size for a request that sets no `max_message_bytes`, by the
/// client's gRPC `user-agent`: Arrow's C++ Flight client (pyarrow, R's
/// arrow; gRPC C++, `grpc-c++/...`) lifts gRPC's 4 MiB receive limit, so
/// it gets [`FLIGHT_DATA_SIZE_UNLIMITED_CLIENT`]; any other client (tonic,
/// grpc-go, grpc-java, unknown) [`FLIGHT_DATA_SIZE`], which every gRPC
/// library accepts by default.
pub fn default_message_bytes(user_agent: Option<&str>) -> usize {
    match user_agent {
        Some(ua) if ua.split_whitespace().any(|t| t.starts_with("grpc-c++/")) => {
            FLIGHT_DATA_SIZE_UNLIMITED_CLIENT
        }
        _ => FLIGHT_DATA_SIZE,
    }
}

/// The `stats` action's name.
pub const STATS_ACTION: &str = "stats";

/// The Flight service of `udfchain serve`.
pub struct LoaderFlightService {
    session: Arc<Session>,
    catalog: Catalog,
    tickets: TicketKey,
    readahead: Arc<ReadAhead>,
    prefetch_partitions: usize,
}

impl LoaderFlightService {
    pub(crate) fn new(
        session: Arc<Session>,
        catalog: Catalog,
        tickets: TicketKey,
        readahead: Arc<ReadAhead>,
        prefetch_partitions: usize,
    ) -> Self {
        Self {
            session,
            catalog,
            tickets,
            readahead,
            prefetch_partitions,
        }
    }

    /// The request's loader and plan, its version pinned (a ticket rebuilds
    /// the same plan even after a new version is saved).
    async fn plan(
        &self,
        mut req: FlightRequest,
    ) -> crate::Result<(FlightRequest, Loader, EpochPlan)> {
        let info = self.catalog.get(&req.dataset, req.version).await?;
        req.version = Some(info.version);
        let loader = req.loader().in_session(Arc::clone(&self.session));
        let plan = loader.plan(req.epoch).await?;
        Ok((req, loader, plan))
    }

    fn read_ahead(&self, req: &FlightRequest) -> (usize, usize) {
        (
            req.prefetch_partitions.unwrap_or(self.prefetch_partitions),
            req.parallel_requests.unwrap_or(1),
        )
    }
}

/// The Flight status for an error of udfchain.
pub fn status(e: Error) -> Status {
    let mut msg = e.to_string();
    if let Error::Setting { value, .. } = &e
        && !value.is_empty()
        && !msg.contains(value.as_str())
    {
        msg.push_str(&format!(" (got {value:?})"));
    }
    let msg = redact(&msg).into_owned();
    match e {
        Error::Dataset(_) => Status::not_found(msg),
        Error::Setting { .. } | Error::Plan(_) | Error::InvalidUri { .. } | Error::Syntax(_) => {
            Status::invalid_argument(msg)
        }
        Error::DataFusion(ref df)
            if matches!(
                df.as_ref(),
                datafusion::error::DataFusionError::ResourcesExhausted(_)
            ) =>
        {
            Status::resource_exhausted(msg)
        }
        _ => Status::internal(msg),
    }
}

fn bad_request(e: RequestError) -> Status {
    Status::invalid_argument(format!("invalid request: {e}"))
}

fn bad_ticket(e: TicketError) -> Status {
    match e {
        TicketError::OtherServer { .. } => Status::failed_precondition(e.to_string()),
        _ => Status::invalid_argument(e.to_string()),
    }
}

fn command(desc: &FlightDescriptor) -> Result<FlightRequest, Status> {
    if desc.r#type() != DescriptorType::Cmd {
        return Err(Status::invalid_argument(
            "use a command descriptor holding a JSON request, e.g. \
             FlightDescriptor.for_command('{\"dataset\": \"name\"}')",
        ));
    }
    FlightRequest::parse(&desc.cmd).map_err(bad_request)
}

fn schema_error(e: datafusion::arrow::error::ArrowError) -> Status {
    Status::internal(format!("encoding the schema: {e}"))
}

/// One partition's Flight messages; holds the partition (counted, charged)
/// until the last message is sent or the client goes away.
pub(crate) struct PartitionStream {
    messages: std::vec::IntoIter<FlightMessage>,
    held: Option<HeldPartition>,
    serving: Serving,
}

impl Stream for PartitionStream {
    type Item = Result<FlightMessage, Status>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.messages.next();
        if next.is_none() && self.held.is_some() {
            self.held = None;
            self.serving.finish();
        }
        Poll::Ready(next.map(Ok))
    }
}

impl LoaderFlightService {
    /// `do_get`: the ticket's partition as Flight messages whose bodies are
    /// the partition's buffers (sent as they are by `routes.rs`).
    pub(crate) async fn partition_messages(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<PartitionStream>, Status> {
        let client = request.remote_addr().map(|a| a.ip());
        let user_agent = request
            .metadata()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let ticket = self
            .tickets
            .check(&request.get_ref().ticket)
            .map_err(bad_ticket)?;
        let reopen = || async {
            let (req, loader, plan) = self.plan(ticket.request.clone()).await?;
            let (k, p) = self.read_ahead(&req);
            Ok((loader, plan, k, p))
        };
        let (held, serving, plan) = self
            .readahead
            .take(ticket.stream, ticket.index, client, reopen)
            .await
            .map_err(status)?;
        let max_bytes = ticket
            .request
            .max_message_bytes
            .unwrap_or_else(|| default_message_bytes(user_agent.as_deref()));
        let messages = encode::messages(&plan.schema, &held.data.batches, max_bytes)?;
        Ok(Response::new(PartitionStream {
            messages: messages.into_iter(),
            held: Some(held),
            serving,
        }))
    }
}

#[tonic::async_trait]
impl FlightService for LoaderFlightService {
    type HandshakeStream = BoxStream<'static, Result<HandshakeResponse, Status>>;
    type ListFlightsStream = BoxStream<'static, Result<FlightInfo, Status>>;
    type DoGetStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoPutStream = BoxStream<'static, Result<PutResult, Status>>;
    type DoActionStream = BoxStream<'static, Result<arrow_flight::Result, Status>>;
    type ListActionsStream = BoxStream<'static, Result<ActionType, Status>>;
    type DoExchangeStream = BoxStream<'static, Result<FlightData, Status>>;

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented(
            "udfchain serve needs no handshake: call get_flight_info",
        ))
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let prefix = String::from_utf8_lossy(&request.get_ref().expression).into_owned();
        let mut latest = BTreeMap::new();
        for info in self.catalog.list().await.map_err(status)? {
            if info.name.starts_with(&prefix) {
                latest.insert(info.name.clone(), info); // listed by version: the last wins
            }
        }
        let mut infos = Vec::with_capacity(latest.len());
        for (name, info) in latest {
            let plan = Chain::from_dataset_version(&name, info.version)
                .in_session(Arc::clone(&self.session))
                .logical_plan()
                .await
                .map_err(status)?;
            let cmd = serde_json::json!({"dataset": name, "version": info.version}).to_string();
            let fi = FlightInfo::new()
                .try_with_schema(plan.schema().as_arrow())
                .map_err(schema_error)?
                .with_descriptor(FlightDescriptor::new_cmd(cmd))
                .with_total_records(i64::try_from(info.rows).unwrap_or(i64::MAX))
                .with_total_bytes(i64::try_from(info.bytes).unwrap_or(i64::MAX));
            infos.push(Ok(fi));
        }
        Ok(Response::new(futures::stream::iter(infos).boxed()))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let client = request.remote_addr().map(|a| a.ip());
        let desc = request.into_inner();
        let (req, loader, plan) = self.plan(command(&desc)?).await.map_err(status)?;
        let rows: usize = plan.partitions.iter().map(|p| p.rows).sum();
        let mut info = FlightInfo::new()
            .try_with_schema(&plan.schema)
            .map_err(schema_error)?
            .with_descriptor(desc)
            .with_total_records(i64::try_from(rows).unwrap_or(i64::MAX))
            .with_ordered(true);
        let n = plan.partitions.len();
        let (k, p) = self.read_ahead(&req);
        let stream = self
            .readahead
            .open(client, loader, plan, k, p)
            .map_err(status)?;
        for index in 0..n {
            let ticket = Ticket::new(self.tickets.issue(&req, stream, index));
            info = info.with_endpoint(FlightEndpoint::new().with_ticket(ticket));
        }
        Ok(Response::new(info))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented(
            "poll_flight_info is not offered: get_flight_info answers at once",
        ))
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let (_, _, plan) = self
            .plan(command(request.get_ref())?)
            .await
            .map_err(status)?;
        let options = IpcWriteOptions::default();
        let result = SchemaResult::try_from(SchemaAsIpc::new(&plan.schema, &options))
            .map_err(schema_error)?;
        Ok(Response::new(result))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        // Served over the network by routes.rs without this copy of each body.
        Ok(self
            .partition_messages(request)
            .await?
            .map(|s| s.map(|m| m.map(FlightMessage::into_flight_data)).boxed()))
    }

    async fn do_put(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        Err(Status::unimplemented(
            "udfchain serve is read-only: save datasets with `udfchain run`",
        ))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented(
            "udfchain serve offers no do_exchange",
        ))
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.into_inner();
        if action.r#type != STATS_ACTION {
            return Err(Status::invalid_argument(format!(
                "unknown action {:?}: the only action is {STATS_ACTION:?}",
                action.r#type
            )));
        }
        self.readahead.expire();
        let body = serde_json::to_vec(&self.readahead.stats())
            .map_err(|e| Status::internal(format!("stats: {e}")))?;
        let result = arrow_flight::Result { body: body.into() };
        Ok(Response::new(futures::stream::iter([Ok(result)]).boxed()))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let stats = ActionType {
            r#type: STATS_ACTION.into(),
            description: "JSON: bytes and partitions the read-ahead holds, open streams, \
                          partitions served, ready hits and misses"
                .into(),
        };
        Ok(Response::new(futures::stream::iter([Ok(stats)]).boxed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_arrow_s_cpp_client_gets_large_messages_by_default() {
        let large = FLIGHT_DATA_SIZE_UNLIMITED_CLIENT;
        for (ua, want) in [
            (Some("grpc-c++/1.81.1 grpc-c/54.0.0 (linux; chttp2)"), large),
            (
                Some("my-app/2 grpc-c++/1.62.0 grpc-c/39.0.0 (osx; chttp2)"),
                large,
            ),
            (Some("tonic/0.14.2"), FLIGHT_DATA_SIZE),
            (Some("grpc-go/1.64.0"), FLIGHT_DATA_SIZE),
            (Some("grpc-java-netty/1.63.0"), FLIGHT_DATA_SIZE),
            (
                Some("grpc-python/1.62.0 grpc-c/39.0.0 (linux; chttp2)"),
                FLIGHT_DATA_SIZE,
            ),
            (Some("not-grpc-c++/1"), FLIGHT_DATA_SIZE),
            (None, FLIGHT_DATA_SIZE),
        ] {
            assert_eq!(default_message_bytes(ua), want, "{ua:?}");
        }
    }
}
