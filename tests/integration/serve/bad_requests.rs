//! Bad requests and tickets are refused with clear Flight statuses, never served.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::{Action, FlightDescriptor, Ticket};
use udfchain::serve::FlightServer;
use udfchain::{Chain, Session, Settings};

use super::{
    Row, client, ids, info, items, partition, read_epoch, spawn_cli, start, status_of, ticket,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_flight_statuses_with_clear_messages() {
    let (_root, session) = items(10, 4).await;
    let server = start(FlightServer::new(session)).await;
    let mut c = client(server.addr).await;
    let cases: &[(&str, tonic::Code, &str)] = &[
        (
            r#"{"dataset": "items", "shufle": true}"#,
            tonic::Code::InvalidArgument,
            "unknown field `shufle`",
        ),
        (
            r#"{"dataset": "items", "rank": 2, "world_size": 2}"#,
            tonic::Code::InvalidArgument,
            "rank must be < world_size (2), got 2",
        ),
        (
            r#"{"dataset": "items", "partition_rows": 0}"#,
            tonic::Code::InvalidArgument,
            "partition_rows must be in 1..=",
        ),
        (
            r#"{"dataset": "itens"}"#,
            tonic::Code::NotFound,
            "no dataset \"itens\" (did you mean \"items\"?)",
        ),
        (
            r#"{"dataset": "items", "version": 9}"#,
            tonic::Code::NotFound,
            "has no version 9",
        ),
        (
            r#"{"dataset": "items", "columns": ["nope"]}"#,
            tonic::Code::InvalidArgument,
            "\"nope\"",
        ),
        (
            "{dataset: items",
            tonic::Code::InvalidArgument,
            "JSON request",
        ),
        (
            r#"{"dataset": "items", "max_message_bytes": 100}"#,
            tonic::Code::InvalidArgument,
            "max_message_bytes must be in 1024..=67108864, got 100",
        ),
    ];
    for (json, code, needle) in cases {
        let s = status_of(info(&mut c, json).await.expect_err(json));
        assert_eq!(s.code(), *code, "{json}: {s:?}");
        assert!(s.message().contains(needle), "{json}: {:?}", s.message());
    }
    let s = status_of(
        c.get_flight_info(FlightDescriptor::new_path(vec!["items".into()]))
            .await
            .expect_err("path descriptor"),
    );
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(
        s.message().contains("command descriptor"),
        "{}",
        s.message()
    );
    let s = status_of(
        partition(&mut c, Ticket::new("garbage"))
            .await
            .expect_err("bad ticket"),
    );
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(
        s.message().contains("tickets come from get_flight_info"),
        "{}",
        s.message()
    );
    // DoGet reads its request itself (serve/routes.rs): a request over the
    // limit is refused once the limit is read, not buffered whole.
    let huge = Ticket::new(vec![b'x'; udfchain::testing::MAX_REQUEST_MESSAGE + 1]);
    let s = status_of(partition(&mut c, huge).await.expect_err("huge ticket"));
    assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
    assert!(
        s.message().contains("DoGet request over"),
        "{}",
        s.message()
    );
    // The connection still serves the next request.
    let info = info(&mut c, r#"{"dataset": "items"}"#).await.expect("info");
    assert!(
        !partition(&mut c, ticket(&info, 0))
            .await
            .expect("rows")
            .is_empty()
    );
    let s = status_of(
        c.do_action(Action::new("reboot", ""))
            .await
            .err()
            .expect("unknown action"),
    );
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(s.message().contains("\"stats\""), "{}", s.message());
    server.stop().await;
}

/// Saves dataset `name` of ids `from..from + n` in `session`'s root.
async fn save_ids(session: &Arc<Session>, name: &str, from: i64, n: i64) {
    let rows: Vec<Row> = (from..from + n)
        .map(|id| Row {
            id,
            text: name.to_string(),
        })
        .collect();
    Chain::from_values_in(Arc::clone(session), &rows)
        .save(name)
        .await
        .expect("save");
}

/// SIGTERMs a `udfchain serve` child and waits for its exit.
async fn sigterm(mut child: std::process::Child) {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("udfchain serve did not exit after SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_of_a_restarted_server_is_refused_not_served_another_streams_rows() {
    // Stream ids restart at 1 in every server process, so a ticket that did not
    // name its server would let client 1's old ticket for `da` partition 0 read
    // `db`'s rows from the restarted server's stream 1.
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));
    save_ids(&session, "da", 0, 100).await;
    save_ids(&session, "db", 1000, 100).await;
    let (first, addr) = spawn_cli(root.path());
    let mut c1 = client(addr).await;
    let da = info(&mut c1, r#"{"dataset": "da", "partition_rows": 50}"#)
        .await
        .expect("da");
    sigterm(first).await;

    let (second, addr) = spawn_cli(root.path());
    let mut c2 = client(addr).await;
    let db = info(&mut c2, r#"{"dataset": "db", "partition_rows": 50}"#)
        .await
        .expect("db");
    let mut c1 = client(addr).await;
    let s = status_of(
        partition(&mut c1, ticket(&da, 0))
            .await
            .expect_err("a ticket of the stopped server is refused"),
    );
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{}", s.message());
    assert!(
        s.message().contains("another udfchain serve process")
            && s.message().contains("call get_flight_info again"),
        "{}",
        s.message()
    );
    // Client 2 reads db whole; client 1 starts over and reads da.
    let got = ids(&partition(&mut c2, ticket(&db, 0)).await.expect("db 0"));
    assert_eq!(got, (1000..1050).collect::<Vec<i64>>());
    let again = read_epoch(&mut c1, r#"{"dataset": "da", "partition_rows": 50}"#).await;
    assert_eq!(again, (0..100).collect::<Vec<i64>>());
    sigterm(second).await;
}

/// `t`'s JSON with `edit` applied, as a ticket.
fn edited(t: &Ticket, edit: impl FnOnce(&mut serde_json::Value)) -> Ticket {
    let mut v: serde_json::Value = serde_json::from_slice(&t.ticket).expect("ticket json");
    edit(&mut v);
    Ticket::new(serde_json::to_vec(&v).expect("bytes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_or_stale_ticket_never_reads_another_requests_rows() {
    let root = tempfile::tempdir().expect("root");
    let session = Session::with_settings(Settings::new().root(root.path()));
    save_ids(&session, "da", 0, 100).await;
    save_ids(&session, "db", 1000, 100).await;
    let server = start(FlightServer::new(Arc::clone(&session))).await;
    let mut c = client(server.addr).await;
    let da = info(&mut c, r#"{"dataset": "da", "partition_rows": 50}"#)
        .await
        .expect("da");
    let db = info(&mut c, r#"{"dataset": "db", "partition_rows": 50}"#)
        .await
        .expect("db");
    let (ta, tb) = (ticket(&da, 0), ticket(&db, 0));
    let db_ticket: serde_json::Value = serde_json::from_slice(&tb.ticket).expect("db ticket json");
    let (db_stream, db_request) = (db_ticket["stream"].clone(), db_ticket["request"].clone());
    let forged = [
        // da's ticket pointed at db's open stream.
        edited(&ta, |v| v["stream"] = db_stream.clone()),
        // da's ticket rewritten into db's request and stream, da's tag kept.
        edited(&ta, |v| {
            v["stream"] = db_stream.clone();
            v["request"] = db_request.clone();
        }),
        // Another partition than listed, another version than pinned.
        edited(&ta, |v| v["index"] = 1.into()),
        edited(&ta, |v| v["request"]["version"] = 2.into()),
    ];
    for t in forged {
        let s = status_of(partition(&mut c, t).await.expect_err("forged"));
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{}", s.message());
        assert!(s.message().contains("altered or forged"), "{}", s.message());
    }
    // The real tickets read their own rows.
    let got = ids(&partition(&mut c, tb).await.expect("db 0"));
    assert_eq!(got, (1000..1050).collect::<Vec<i64>>());
    let got = ids(&partition(&mut c, ta.clone()).await.expect("da 0"));
    assert_eq!(got, (0..50).collect::<Vec<i64>>());
    let got = ids(&partition(&mut c, ticket(&da, 1)).await.expect("da 1"));
    assert_eq!(
        got,
        (50..100).collect::<Vec<i64>>(),
        "its stream is closed now"
    );

    // A ticket pins its version: once da v1 is removed and a new da saved, the
    // old ticket (its stream closed) is NotFound, not the new version's rows.
    let catalog = udfchain::Catalog::open(root.path()).await.expect("catalog");
    catalog.remove("da", Some(1)).await.expect("rm da 1");
    save_ids(&session, "da", 5000, 100).await;
    assert_eq!(catalog.get("da", None).await.expect("da").version, 2);
    let s = status_of(partition(&mut c, ta).await.expect_err("removed version"));
    assert_eq!(s.code(), tonic::Code::NotFound, "{}", s.message());
    assert!(s.message().contains("no version 1"), "{}", s.message());
    server.stop().await;
}
