//! `udfchain ui`: a real browser server on 127.0.0.1 over real datasets of
//! real image files, asked over HTTP: pages, pagination, sorting, the WHERE
//! filter, rows, comparing versions, the query box and its refusals, tokens,
//! paths that try to leave the root, thumbnails (ETag / 304, error tiles for
//! hostile images), and the first and deepest pages of a 10-million-row
//! version.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use udfchain::udfs::builtins::image::{DecodeOptions, Format, Image, Mode, decode, encode};
use udfchain::ui::UiServer;
use udfchain::{Session, Settings};

use udfchain_testkit::runner;

/// Images of the fixture: 56 good ones, one truncated JPEG, one PNG whose
/// header claims 30000 x 30000 pixels (a decompression bomb).
const GOOD: usize = 56;

fn picture(i: usize) -> Vec<u8> {
    let (w, h) = (40u32, 30u32);
    let mut data = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            data.extend_from_slice(&[(x * 6) as u8, (y * 8) as u8, (i * 4) as u8]);
        }
    }
    let img = Image::new(w, h, Mode::Rgb, data).expect("image");
    let format = if i.is_multiple_of(2) {
        Format::Png
    } else {
        Format::Jpeg
    };
    encode(img.view(), format, Some(90)).expect("encode")
}

/// A PNG header of `w` x `h` with a tiny, wrong body.
fn png_bomb(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    out.extend_from_slice(&13u32.to_be_bytes());
    out.extend_from_slice(b"IHDR");
    out.extend_from_slice(&ihdr);
    let mut crc_input = b"IHDR".to_vec();
    crc_input.extend_from_slice(&ihdr);
    out.extend_from_slice(&crc32fast::hash(&crc_input).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 4, b'I', b'D', b'A', b'T', 1, 2, 3, 4, 0, 0, 0, 0]);
    out
}

/// A root with datasets `imgs` (v1: every image, v2: without img000) and
/// `nums` (v1: ids 1..3, v2: 2, 3 changed, 4).
struct Fixture {
    root: tempfile::TempDir,
    images: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let root = tempfile::tempdir().expect("root");
    let images = tempfile::tempdir().expect("images");
    for i in 0..GOOD {
        let ext = if i.is_multiple_of(2) { "png" } else { "jpg" };
        std::fs::write(images.path().join(format!("img{i:03}.{ext}")), picture(i)).expect("write");
    }
    let good = picture(1);
    std::fs::write(
        images.path().join("zz_truncated.jpg"),
        &good[..good.len() / 3],
    )
    .expect("write");
    std::fs::write(images.path().join("zz_bomb.png"), png_bomb(30_000, 30_000)).expect("write");
    std::fs::write(
        images.path().join("notes.txt"),
        "first line\nsecond line\nthird\n",
    )
    .expect("write");
    let dir = images.path().display().to_string();
    let r = runner(root.path());
    r.run(&format!(
        "CREATE DATASET imgs AS SELECT file, file.path AS name, file.size AS size FROM read_storage('{dir}');
         CREATE DATASET imgs AS SELECT file, file.path AS name, file.size AS size FROM read_storage('{dir}') WHERE file.path <> 'img000.png';
         CREATE DATASET nums AS SELECT * FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c')) AS t(id, label);
         CREATE DATASET nums AS SELECT * FROM (VALUES (2, 'b'), (3, 'C'), (4, 'd')) AS t(id, label);"
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    Fixture { root, images }
}

/// A browser server on 127.0.0.1:0, serving until the handle is dropped.
struct Running {
    addr: SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn serve(root: &Path, token: Option<&str>) -> Running {
    let session = Session::with_settings(Settings::new().root(root));
    let bound = UiServer::new(session)
        .token(token.map(str::to_string))
        .query_timeout(Duration::from_secs(20))
        .bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(bound.run_until(async move {
        let _ = stopped.await;
    }));
    Running { addr, _stop: stop }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let resp = client()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

/// Rows of the rows table on a page.
fn row_count(html: &str) -> usize {
    html.matches("<tr class=\"row\">").count()
}

/// `src` values of `<img>`s on a page whose `alt` is `alt`.
fn img_src(html: &str, alt: &str) -> Option<String> {
    let at = html.find(&format!("alt=\"{alt}\""))?;
    let rest = &html[at..];
    let src = rest.find("src=\"")? + 5;
    let end = rest[src..].find('"')?;
    Some(rest[src..src + end].replace("&amp;", "&"))
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_pages_paginate_sort_and_filter() {
    let fx = fixture().await;
    let ui = serve(fx.root.path(), None).await;
    let (status, html) = get(ui.addr, "/").await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("href=\"/d/imgs/2\">imgs</a>"), "{html}");
    assert!(
        html.contains(">v1</a> <a class=\"version\" href=\"/d/imgs/2\">v2</a>"),
        "{html}"
    );
    assert!(
        html.contains("<td class=\"num\">58</td>"),
        "imgs v2 rows: {html}"
    );

    // v1: 59 rows (56 images, 2 hostile, 1 text): 50 then 9.
    let (status, first) = get(ui.addr, "/d/imgs/1").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(row_count(&first), 50);
    assert!(first.contains(">Next</a>") && !first.contains(">Previous</a>"));
    assert!(first.contains("page 1 of 2"), "{first}");
    assert!(first.contains("<span id=\"total\">59</span>"));
    assert!(
        first.contains("<pre class=\"snippet\">first line\nsecond line\nthird</pre>")
            || !first.contains("notes.txt")
    );
    let (_, second) = get(ui.addr, "/d/imgs/1?page=2").await;
    assert_eq!(row_count(&second), 9);
    assert!(second.contains(">Previous</a>") && !second.contains(">Next</a>"));
    assert!(
        second.contains("<pre class=\"snippet\">first line\nsecond line\nthird</pre>"),
        "text files show their first lines"
    );
    assert!(
        second.contains(">50</a>"),
        "rows are numbered on from the first page"
    );

    // Sorted by name, descending: the hostile files' names come first.
    let (_, sorted) = get(ui.addr, "/d/imgs/1?sort=name&desc=1").await;
    let first_name = sorted.find("zz_truncated.jpg").expect("sorted page");
    assert!(
        first_name < sorted.find("img055.jpg").expect("img055"),
        "descending"
    );
    assert!(!sorted.contains("img000.png"), "img000 sorts last: page 2");

    // A WHERE filter: the images whose name starts with img01.
    let filter = enc("name LIKE 'img01%' AND size > 0");
    let (status, filtered) = get(ui.addr, &format!("/d/imgs/1?where={filter}")).await;
    assert_eq!(status, 200, "{filtered}");
    assert_eq!(row_count(&filtered), 10);
    assert!(filtered.contains("data-count-url=\"/count?name=imgs&amp;version=1&amp;where="));
    let (status, n) = get(
        ui.addr,
        &format!("/count?name=imgs&version=1&where={filter}"),
    )
    .await;
    assert_eq!((status, n.as_str()), (200, "10"));
    // Pages of the filtered view keep the filter.
    assert!(filtered.contains(&format!("where={filter}")));

    // A filter that is not one expression is refused, and nothing runs.
    let (status, bad) = get(
        ui.addr,
        &format!("/d/imgs/1?where={}", enc("1=1) UNION (SELECT 1")),
    )
    .await;
    assert_eq!(status, 400, "{bad}");
    assert!(bad.contains("not one SQL expression"), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_rows_files_and_comparisons() {
    let fx = fixture().await;
    let ui = serve(fx.root.path(), None).await;
    // Where each version came from: the listing it read, on the datasets
    // page and on the version's page.
    let dir = fx.images.path().display().to_string();
    let (_, list) = get(ui.addr, "/").await;
    assert!(
        list.contains("<td class=\"lineage\"><code class=\"source\">") && list.contains(&dir),
        "the datasets page names what imgs read: {list}"
    );
    let (_, version) = get(ui.addr, "/d/imgs/2").await;
    assert!(
        version.contains("<p class=\"lineage\" id=\"lineage\">read from <code class=\"source\">")
            && version.contains(&dir),
        "{version}"
    );
    let (status, row) = get(ui.addr, "/d/imgs/1/row/1").await;
    assert_eq!(status, 200, "{row}");
    assert!(row.contains(">Previous row</a>") && row.contains(">Next row</a>"));
    let object = format!("file://{}/img001.jpg", fx.images.path().display());
    assert!(
        row.contains(&format!("<code>{object}</code>")),
        "the object's URI: {row}"
    );
    let src = img_src(&row, "img001.jpg").expect("full image");
    assert!(src.starts_with("/file?"), "{src}");
    let bytes = client()
        .get(format!("http://{}{src}", ui.addr))
        .send()
        .await
        .expect("file");
    assert_eq!(bytes.headers()["content-type"], "image/jpeg");
    let bytes = bytes.bytes().await.expect("bytes");
    assert_eq!(&bytes[..], &picture(1)[..], "the file's own bytes");

    // Compare nums v1 -> v2 by id: 4 added, 1 removed, 3 changed.
    let (status, cmp) = get(ui.addr, "/compare?name=nums&a=1&b=2&key=id").await;
    assert_eq!(status, 200, "{cmp}");
    for (id, n) in [("added", 1), ("removed", 1), ("changed", 1)] {
        assert!(
            cmp.contains(&format!("<span id=\"{id}\">{n}</span>")),
            "{id}: {cmp}"
        );
    }
    assert!(
        cmp.contains("<span class=\"v\">label</span>"),
        "the changed column is named: {cmp}"
    );
    assert!(
        cmp.contains("<span class=\"v\">C</span>") && cmp.contains("<span class=\"v\">d</span>")
    );
    // Images compared by file: img000 removed in v2.
    let (_, cmp) = get(ui.addr, "/compare?name=imgs&a=1&b=2&key=name").await;
    assert!(
        cmp.contains("<span id=\"removed\">1</span>")
            && cmp.contains("<span id=\"added\">0</span>"),
        "{cmp}"
    );
    assert!(cmp.contains("img000.png"));
    assert!(cmp.contains("<span id=\"changed\">0</span>"), "{cmp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_thumbnails_have_etags_and_hostile_images_get_an_error_tile() {
    let fx = fixture().await;
    let ui = serve(fx.root.path(), None).await;
    let (_, html) = get(ui.addr, "/d/imgs/1?sort=name&desc=1").await;
    // The page started its thumbnails itself, all at once: the 47 good
    // images on it (not the text file, not the hostile ones) get cached
    // before any <img> is requested.
    let thumbs_dir = fx.root.path().join("cache/ui-thumbs");
    let cached = || {
        std::fs::read_dir(&thumbs_dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".jpg"))
                    .count()
            })
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cached() < 47 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        cached(),
        47,
        "thumbnails made ahead of the browser's requests"
    );
    let c = client();
    let url = |src: &str| format!("http://{}{src}", ui.addr);

    let good = img_src(&html, "img021.jpg").expect("thumb of img021");
    assert!(good.starts_with("/thumb?"), "{good}");
    let resp = c.get(url(&good)).send().await.expect("thumb");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "image/jpeg");
    assert!(resp.headers().get("x-udfchain-thumb-error").is_none());
    let etag = resp.headers()["etag"].to_str().expect("etag").to_string();
    let jpeg = resp.bytes().await.expect("bytes");
    let thumb = decode(&jpeg, &DecodeOptions::default()).expect("a JPEG");
    assert_eq!(
        (thumb.width, thumb.height),
        (40, 30),
        "small images keep their size"
    );
    let cached: Vec<_> = std::fs::read_dir(fx.root.path().join("cache/ui-thumbs"))
        .expect("thumb cache")
        .flatten()
        .collect();
    assert!(!cached.is_empty(), "thumbnails are cached under the root");
    let again = c
        .get(url(&good))
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("revalidate");
    assert_eq!(again.status().as_u16(), 304);
    assert!(again.bytes().await.expect("body").is_empty());

    for hostile in ["zz_truncated.jpg", "zz_bomb.png"] {
        let src = img_src(&html, hostile).expect("thumb of a hostile file");
        let resp = c.get(url(&src)).send().await.expect("thumb");
        assert_eq!(resp.status().as_u16(), 200, "{hostile}");
        assert_eq!(resp.headers()["content-type"], "image/png");
        let why = resp.headers()["x-udfchain-thumb-error"]
            .to_str()
            .expect("reason")
            .to_string();
        let tile = decode(
            &resp.bytes().await.expect("bytes"),
            &DecodeOptions::default(),
        )
        .expect("the error tile is an image");
        assert_eq!((tile.width, tile.height), (64, 64), "{hostile}: {why}");
        if hostile == "zz_bomb.png" {
            assert!(why.contains("30000x30000"), "{why}");
        }
    }
    // A forged reference is refused; the server still answers afterwards.
    let forged = good.replace("&s=", "&s=0");
    assert_eq!(
        c.get(url(&forged))
            .send()
            .await
            .expect("forged")
            .status()
            .as_u16(),
        403
    );
    assert_eq!(get(ui.addr, "/").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_query_box_runs_one_select_only() {
    let fx = fixture().await;
    let ui = serve(fx.root.path(), None).await;
    let q = "SELECT name, file FROM read_dataset('imgs', '1') WHERE name LIKE 'img00%' ORDER BY name DESC";
    let (status, html) = get(ui.addr, &format!("/query?q={}", enc(q))).await;
    assert_eq!(status, 200, "{html}");
    assert_eq!(row_count(&html), 10);
    assert!(html.find("img009.jpg").expect("9") < html.find("img001.jpg").expect("1"));
    assert!(html.contains(&format!("id=\"permalink\" href=\"/query?q={}\"", enc(q))));
    assert!(
        html.contains("src=\"/thumb?"),
        "query results show thumbnails"
    );
    let (_, n) = get(ui.addr, &format!("/count?q={}", enc(q))).await;
    assert_eq!(n, "10");

    let out = fx.root.path().join("copied.csv");
    for bad in [
        "CREATE TABLE t AS SELECT 1".to_string(),
        "SET datafusion.execution.batch_size = 1".into(),
        format!("COPY (SELECT 1) TO '{}'", out.display()),
        "SELECT 1; SELECT 2".into(),
        "EXPLAIN ANALYZE SELECT 1".into(),
        "SELECT 1 AS a INTO t2".into(),
        "INSERT INTO t VALUES (1)".into(),
        "CREATE DATASET x AS SELECT 1".into(),
        "SELECT file_from_url('file:///etc/passwd')".into(),
    ] {
        let (status, html) = get(ui.addr, &format!("/query?q={}", enc(&bad))).await;
        assert_eq!(status, 400, "{bad} ran: {html}");
        assert!(html.contains("id=\"error\""), "{bad}: {html}");
        assert_eq!(row_count(&html), 0, "{bad}");
    }
    assert!(!out.exists(), "COPY wrote nothing");
    assert!(catalog_names(fx.root.path()).await.iter().all(|n| n != "x"));
}

async fn catalog_names(root: &Path) -> Vec<String> {
    udfchain::Catalog::open(root)
        .await
        .expect("catalog")
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|i| i.name)
        .collect()
}

/// A raw HTTP/1.1 GET (no client normalising the path), its status line.
fn raw_get(addr: SocketAddr, path: &str, host: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().next().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_paths_never_leave_the_root() {
    let fx = fixture().await;
    let ui = serve(fx.root.path(), None).await;
    let host = ui.addr.to_string();
    let addr = ui.addr;
    let lines = tokio::task::spawn_blocking(move || {
        [
            "/static/../../../../etc/passwd",
            "/static/..%2f..%2f..%2fetc%2fpasswd",
            "/d/..%2f..%2fetc/1",
        ]
        .map(|p| raw_get(addr, p, &host))
    })
    .await
    .expect("raw");
    for line in &lines {
        assert!(!line.contains(" 200 "), "{line}");
    }
    let outside = fx.root.path().join("..");
    for q in [
        format!("SELECT * FROM read_storage('{}')", outside.display()),
        "SELECT * FROM read_csv('/etc/passwd')".into(),
        "SELECT * FROM read_storage('file:///etc/')".into(),
        format!(
            "SELECT * FROM read_storage('{}')",
            fx.images.path().display()
        ),
    ] {
        let (status, html) = get(ui.addr, &format!("/query?q={}", enc(&q))).await;
        assert_eq!(status, 400, "{q}: {html}");
        assert!(
            html.contains("local paths must lie under the root"),
            "{q}: {html}"
        );
    }
    // Under the root, storage reads are allowed.
    std::fs::create_dir_all(fx.root.path().join("inbox")).expect("dir");
    std::fs::write(fx.root.path().join("inbox/a.txt"), "hello").expect("write");
    let q = format!(
        "SELECT file FROM read_storage('{}')",
        fx.root.path().join("inbox").display()
    );
    let (status, html) = get(ui.addr, &format!("/query?q={}", enc(&q))).await;
    assert_eq!(status, 200, "{html}");
    assert_eq!(row_count(&html), 1);
    // A file reference the server did not sign is refused.
    let forged = udfchain::File {
        source: "file:///etc".into(),
        path: "passwd".into(),
        size: 10,
        ..Default::default()
    };
    let f: String = {
        let json = serde_json::to_string(&forged).expect("json");
        let b = json.as_bytes();
        // Any value: the signature cannot match.
        b.iter().map(|x| format!("{x:02x}")).collect()
    };
    for route in ["file", "thumb"] {
        let (status, _) = get(
            ui.addr,
            &format!("/{route}?f={f}&s=00000000000000000000000000000000"),
        )
        .await;
        assert_eq!(status, 403, "{route}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_tokens_are_checked_on_every_request() {
    let fx = fixture().await;
    let ui = serve(fx.root.path(), Some("s3cret-token-42")).await;
    let c = client();
    let base = format!("http://{}", ui.addr);
    assert_eq!(
        c.get(format!("{base}/"))
            .send()
            .await
            .expect("get")
            .status()
            .as_u16(),
        401
    );
    let wrong = c
        .get(format!("{base}/?token=guess"))
        .send()
        .await
        .expect("get");
    assert_eq!(wrong.status().as_u16(), 401);
    assert_eq!(
        c.get(format!("{base}/static/style.css?token=s3cret-token-43"))
            .send()
            .await
            .expect("get")
            .status()
            .as_u16(),
        401
    );
    let ok = c
        .get(format!("{base}/?token=s3cret-token-42"))
        .send()
        .await
        .expect("get");
    assert_eq!(ok.status().as_u16(), 200);
    let cookie = ok.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let pair = cookie.split(';').next().expect("pair").to_string();
    let page = c
        .get(format!("{base}/d/imgs/1"))
        .header("cookie", &pair)
        .send()
        .await
        .expect("get");
    assert_eq!(page.status().as_u16(), 200, "the cookie carries the token");
    let body = page.text().await.expect("body");
    assert!(
        !body.contains("s3cret-token-42"),
        "the token is not on the page"
    );
    let bad = c
        .get(format!("{base}/d/imgs/1"))
        .header("cookie", "udfchain_ui_token=nope")
        .send()
        .await
        .expect("get");
    assert_eq!(bad.status().as_u16(), 401);

    // Without a token, only loopback Host names are answered (DNS rebinding).
    let open = serve(fx.root.path(), None).await;
    let addr = open.addr;
    let (evil, local) = tokio::task::spawn_blocking(move || {
        (
            raw_get(addr, "/", &format!("evil.example:{}", addr.port())),
            raw_get(addr, "/", &format!("localhost:{}", addr.port())),
        )
    })
    .await
    .expect("raw");
    assert!(evil.contains(" 403 "), "{evil}");
    assert!(local.contains(" 200 "), "{local}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_cli_off_loopback_prints_a_random_token() {
    let fx = fixture().await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_udfchain"))
        .args(["ui", "--bind", "0.0.0.0:0", "--root"])
        .arg(fx.root.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn udfchain ui");
    let mut stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while stdout.read(&mut byte).map(|n| n == 1).unwrap_or(false) && byte[0] != b'\n' {
            buf.push(byte[0]);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
    .await
    .expect("line");
    let url = line.strip_prefix("udfchain ui: open ").unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{line:?}")
    });
    let (addr, token) = url
        .strip_prefix("http://")
        .and_then(|u| u.split_once("/?token="))
        .expect("a URL with a token");
    assert_eq!(token.len(), 32, "{token}");
    assert!(token.chars().all(|c| c.is_ascii_hexdigit()));
    let port = addr.rsplit(':').next().expect("port");
    let base = format!("http://127.0.0.1:{port}");
    let c = client();
    let denied = c
        .get(format!("{base}/"))
        .send()
        .await
        .expect("get")
        .status()
        .as_u16();
    let allowed = c
        .get(format!("{base}/?token={token}"))
        .send()
        .await
        .expect("get");
    let allowed_status = allowed.status().as_u16();
    let body = allowed.text().await.unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(denied, 401);
    assert_eq!(allowed_status, 200);
    assert!(body.contains("imgs"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_first_page_of_ten_million_rows_is_quick() {
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    let started = std::time::Instant::now();
    r.run(
        "CREATE DATASET big AS SELECT value AS id, value % 1000 AS bucket, concat('row-', value) AS label \
         FROM generate_series(1, 10000000)",
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let saved = started.elapsed();
    let ui = serve(root.path(), None).await;
    let c = client();
    let mut times = Vec::new();
    for path in ["/d/big/1", "/d/big/1?page=2", "/d/big/1"] {
        let t = std::time::Instant::now();
        let resp = c
            .get(format!("http://{}{path}", ui.addr))
            .send()
            .await
            .expect("page");
        let timing = resp.headers()["server-timing"]
            .to_str()
            .expect("timing")
            .to_string();
        let html = resp.text().await.expect("body");
        assert_eq!(row_count(&html), 50, "{html}");
        assert!(html.contains("<span id=\"total\">10000000</span>"));
        let ms: f64 = timing.trim_start_matches("page;dur=").parse().expect("ms");
        times.push((path, ms, t.elapsed()));
    }
    eprintln!("10M rows saved in {saved:?}; first pages (server ms, client): {times:?}");
    let first = times[0].1;
    assert!(first < 1000.0, "first page took {first} ms of server time");
    // Deep pages read only the row groups and pages holding their rows.
    let mut deep = Vec::new();
    for page in [100_000, 200_000] {
        let resp = c
            .get(format!("http://{}/d/big/1?page={page}", ui.addr))
            .send()
            .await
            .expect("page");
        let timing = resp.headers()["server-timing"]
            .to_str()
            .expect("timing")
            .to_string();
        let html = resp.text().await.expect("body");
        assert_eq!(row_count(&html), 50);
        let last = page * 50;
        assert!(
            html.contains(&format!("row-{}<", last - 49)) && html.contains(&format!("row-{last}<")),
            "page {page} holds rows {}..={last}",
            last - 49
        );
        let ms: f64 = timing.trim_start_matches("page;dur=").parse().expect("ms");
        deep.push((page, ms));
    }
    let resp = c
        .get(format!("http://{}/d/big/1/row/9999998", ui.addr))
        .send()
        .await
        .expect("row");
    let timing = resp.headers()["server-timing"]
        .to_str()
        .expect("timing")
        .to_string();
    let row = resp.text().await.expect("body");
    assert!(
        row.contains("row-9999999<") && row.contains(">Next row</a>"),
        "{row}"
    );
    let ms: f64 = timing.trim_start_matches("page;dur=").parse().expect("ms");
    deep.push((9_999_998 / 50 + 1, ms));
    eprintln!("deep pages and the next-to-last row (server ms): {deep:?}");
    for (page, ms) in deep {
        assert!(ms < 1000.0, "page {page} took {ms} ms of server time");
    }
    let (_, page2) = get(ui.addr, "/d/big/1?page=2").await;
    assert!(
        page2.contains("row-51<") && page2.contains("row-100<"),
        "stored order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_pages_never_show_a_credential() {
    let root = tempfile::tempdir().expect("root");
    let secret = "ui-test-secret-8f3a91c2";
    let settings = Settings::new()
        .root(root.path())
        .set("storage.secret_access_key", secret)
        .expect("setting");
    let r = udfchain::ScriptRunner::new(Session::with_settings(settings.clone()));
    r.run(&format!(
        "CREATE DATASET leak AS SELECT 'key={secret}' AS v, 's3://user:{secret}@host/x' AS url"
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let bound = UiServer::new(Session::with_settings(settings))
        .bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(bound.run_until(async move {
        let _ = stopped.await;
    }));
    for path in [
        "/".to_string(),
        "/d/leak/1".into(),
        "/d/leak/1/row/0".into(),
        format!(
            "/query?q={}",
            enc(&format!(
                "SELECT v, url, '{secret}' AS s FROM read_dataset('leak')"
            ))
        ),
        format!(
            "/query?q={}",
            enc(&format!("SELECT * FROM read_dataset('{secret}')"))
        ),
    ] {
        let (_, html) = get(addr, &path).await;
        assert!(!html.contains(secret), "{path}: {html}");
        assert!(path == "/" || html.contains("***"), "{path}: {html}");
    }
    drop(stop);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_files_show_by_kind_and_are_served_inert() {
    let root = tempfile::tempdir().expect("root");
    let files = tempfile::tempdir().expect("files");
    let put =
        |name: &str, bytes: &[u8]| std::fs::write(files.path().join(name), bytes).expect("write");
    put("a.wav", b"RIFF....WAVEfmt ");
    put("b.mp4", b"\0\0\0\x18ftypmp42");
    put("c.txt", b"line one\nline two\nline three\nline four\n");
    put("d.bin", &[7u8; 1234]);
    put("e.html", b"<script>alert(1)</script>");
    put(
        "f.svg",
        b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>",
    );
    let long = "x".repeat(500);
    let r = runner(root.path());
    r.run(&format!(
        "CREATE DATASET kinds AS SELECT file, named_struct('a', 1, 'b', named_struct('c', 'deep')) AS nested, \
         '{long}' AS long FROM read_storage('{}')",
        files.path().display()
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let ui = serve(root.path(), None).await;
    let (status, html) = get(ui.addr, "/d/kinds/1").await;
    assert_eq!(status, 200, "{html}");
    assert_eq!(html.matches("<audio controls").count(), 1, "{html}");
    assert_eq!(html.matches("<video controls").count(), 1);
    assert!(
        html.contains("<pre class=\"snippet\">line one\nline two\nline three</pre>"),
        "first lines"
    );
    assert!(
        html.contains("d.bin <span class=\"size\">1.2 kB</span>"),
        "others: path and size"
    );
    assert!(
        html.contains("<details><summary>{2 fields}</summary>"),
        "structs fold"
    );
    assert!(html.contains("<dt>c</dt><dd><span class=\"v\">deep</span></dd>"));
    assert!(html.contains("show all 500 characters"), "long values cut");
    assert!(
        !html.contains(&long[..200]) || html.contains("<pre>xxxx"),
        "cut, whole behind details"
    );
    assert!(!html.contains("<script>alert"), "escaped");
    // Stored HTML and SVG are downloads, never pages of this origin.
    let (_, row) = get(ui.addr, "/d/kinds/1/row/4").await;
    assert!(row.contains("e.html"), "{row}");
    let href = row
        .split("href=\"")
        .find(|h| h.starts_with("/file?"))
        .and_then(|h| h.split('"').next())
        .expect("file link")
        .replace("&amp;", "&");
    let resp = client()
        .get(format!("http://{}{href}", ui.addr))
        .send()
        .await
        .expect("file");
    assert_eq!(resp.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
    let (_, row) = get(ui.addr, "/d/kinds/1/row/5").await;
    let href = row
        .split("href=\"")
        .find(|h| h.starts_with("/file?"))
        .and_then(|h| h.split('"').next())
        .expect("file link")
        .replace("&amp;", "&");
    let resp = client()
        .get(format!("http://{}{href}", ui.addr))
        .send()
        .await
        .expect("file");
    assert_eq!(resp.headers()["content-type"], "application/octet-stream");
    assert_eq!(resp.headers()["content-disposition"], "attachment");
}
