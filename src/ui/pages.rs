//! The pages: datasets, a version (rows page by page, sorted, filtered), a
//! row, two versions compared, the query box, and the counts the pages ask
//! for afterwards. Guarantees: a page of a version in stored order reads
//! only the row groups and pages holding its rows from the version's
//! Parquet file (`stored_rows`); any other page of rows runs one planned
//! query with `LIMIT`/`OFFSET` handed to DataFusion (its first page reads
//! its first rows, not the whole version; a version's count comes from the
//! catalog, a filtered or queried count from `/count`, fetched by the page
//! after it shows); rows are read with one partition per file so that
//! pages and row numbers follow the stored order; every page says how long
//! the server took (`Server-Timing: page;dur=MS`). Every SQL text comes
//! from `safety.rs`'s checks, and every text shown is escaped and redacted
//! (`render.rs`).

use std::collections::HashMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use futures::StreamExt;

use super::PAGE_ROWS;
use super::auth::Auth;
use super::files::{Files, Kind, kind, snippet, warm};
use super::render::{Cells, cell, esc, files_of, human_bytes, params, time_secs, url_encode};
use super::safety::{self, Refused, check_query, check_where, ident, literal};
use crate::dataset::{Catalog, DatasetInfo, LineageEntry};
use crate::script::ScriptRunner;
use crate::session::Session;

/// What every handler shares.
pub(super) struct AppState {
    pub session: Arc<Session>,
    /// Keeps udfchain's table functions registered in the session.
    pub _runner: ScriptRunner,
    pub catalog: Catalog,
    pub allowed: Vec<PathBuf>,
    pub timeout: Duration,
    pub files: Files,
    pub auth: Auth,
}

const STYLE: &str = include_str!("assets/style.css");
const SCRIPT: &str = include_str!("assets/app.js");

/// Headers every page carries: no framing, no foreign scripts or styles.
fn secure(mut resp: Response, started: Instant) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; media-src 'self'; style-src 'self'; \
             script-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if let Ok(v) = HeaderValue::from_str(&format!("page;dur={ms:.1}")) {
        h.insert("server-timing", v);
    }
    resp
}

fn page(status: StatusCode, title: &str, body: &str, started: Instant) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · udfchain</title><link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/static/style.css\">\
         <script src=\"/static/app.js\" defer></script></head><body>\
         <nav><a class=\"brand\" href=\"/\">udfchain</a> <a href=\"/\">Datasets</a> <a href=\"/query\">Query</a></nav>\
         <main>{body}</main></body></html>",
        esc(title)
    );
    secure(
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html,
        )
            .into_response(),
        started,
    )
}

fn error_page(
    status: StatusCode,
    title: &str,
    message: &str,
    extra: &str,
    started: Instant,
) -> Response {
    page(
        status,
        title,
        &format!(
            "<h1>{}</h1><p class=\"error\" id=\"error\">{}</p>{extra}",
            esc(title),
            esc(message)
        ),
        started,
    )
}

/// The versions of dataset `name` (none when the catalog cannot be listed).
async fn versions_of(catalog: &Catalog, name: &str) -> Vec<u32> {
    catalog
        .list()
        .await
        .map(|l| {
            l.into_iter()
                .filter(|i| i.name == name)
                .map(|i| i.version)
                .collect()
        })
        .unwrap_or_default()
}

/// `GET /static/style.css`.
pub(super) async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// `GET /static/app.js`.
pub(super) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

/// Anything else: 404.
pub(super) async fn not_found() -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        "Not found",
        "no such page",
        "",
        Instant::now(),
    )
}

/// `GET /`: every dataset with its versions.
pub(super) async fn datasets(State(state): State<Arc<AppState>>) -> Response {
    let started = Instant::now();
    let list = match state.catalog.list().await {
        Ok(l) => l,
        Err(e) => {
            return error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Datasets",
                &e.to_string(),
                "",
                started,
            );
        }
    };
    let mut by_name: Vec<(String, Vec<DatasetInfo>)> = Vec::new();
    for info in list {
        match by_name.last_mut() {
            Some((n, v)) if *n == info.name => v.push(info),
            _ => by_name.push((info.name.clone(), vec![info])),
        }
    }
    let mut body = String::from("<h1>Datasets</h1>");
    if by_name.is_empty() {
        body.push_str("<p id=\"empty\">No datasets under this root yet.</p>");
    }
    body.push_str(
        "<table class=\"list\" id=\"datasets\"><thead><tr><th>name</th><th>versions</th>\
         <th>rows</th><th>bytes</th><th>created</th><th>read from</th><th></th></tr></thead><tbody>",
    );
    for (name, versions) in &by_name {
        let Some(latest) = versions.last() else {
            continue;
        };
        let links: Vec<String> = versions
            .iter()
            .map(|v| {
                format!(
                    "<a class=\"version\" href=\"/d/{}/{}\">v{}</a>",
                    url_encode(name),
                    v.version,
                    v.version
                )
            })
            .collect();
        let compare = if versions.len() >= 2 {
            let prev = &versions[versions.len() - 2];
            format!(
                "<a class=\"compare\" href=\"/compare?name={}&amp;a={}&amp;b={}\">compare v{} and v{}</a>",
                url_encode(name),
                prev.version,
                latest.version,
                prev.version,
                latest.version
            )
        } else {
            String::new()
        };
        let sources = lineage_html(&state.catalog, name, latest.version).await;
        let _ = write!(
            body,
            "<tr class=\"dataset\"><td><a class=\"name\" href=\"/d/{}/{}\">{}</a></td><td>{}</td>\
             <td class=\"num\">{}</td><td class=\"num\" title=\"{} bytes\">{}</td><td>{}</td>\
             <td class=\"lineage\">{sources}</td><td>{compare}</td></tr>",
            url_encode(name),
            latest.version,
            esc(name),
            links.join(" "),
            latest.rows,
            latest.bytes,
            human_bytes(latest.bytes),
            time_secs(latest.created),
        );
    }
    body.push_str("</tbody></table>");
    page(StatusCode::OK, "Datasets", &body, started)
}

/// How a version's rows are viewed: filter and sort.
#[derive(Debug, Default, Clone)]
struct View {
    filter: Option<String>,
    sort: Option<String>,
    desc: bool,
}

impl View {
    fn from(p: &HashMap<String, String>) -> Self {
        let nonempty = |k: &str| {
            p.get(k)
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        Self {
            filter: nonempty("where"),
            sort: nonempty("sort"),
            desc: p.get("desc").is_some_and(|v| v == "1"),
        }
    }

    /// `&where=..&sort=..&desc=1` (HTML-escaped for an attribute).
    fn query(&self) -> String {
        let mut q = String::new();
        if let Some(w) = &self.filter {
            q.push_str(&format!("&amp;where={}", url_encode(w)));
        }
        if let Some(s) = &self.sort {
            q.push_str(&format!("&amp;sort={}", url_encode(s)));
        }
        if self.desc {
            q.push_str("&amp;desc=1");
        }
        q
    }

    fn sql(&self, name: &str, version: u32, columns: &[String]) -> Result<String, Refused> {
        let mut sql = format!(
            "SELECT * FROM read_dataset({}, {})",
            literal(name),
            literal(&version.to_string())
        );
        if let Some(w) = &self.filter {
            check_where(w)?;
            let _ = write!(sql, " WHERE ({w})");
        }
        if let Some(s) = &self.sort {
            if !columns.contains(s) {
                return Err(Refused(format!("no column {s:?} to sort by")));
            }
            let _ = write!(
                sql,
                " ORDER BY {} {}",
                ident(s),
                if self.desc { "DESC" } else { "ASC" }
            );
        }
        Ok(sql)
    }
}

/// `page` (from 1) of the query string.
fn page_number(p: &HashMap<String, String>) -> usize {
    p.get("page")
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, usize::MAX / PAGE_ROWS / 2)
}

/// Plans a checked query.
async fn planned(state: &AppState, sql: &str) -> Result<datafusion::dataframe::DataFrame, Refused> {
    check_query(sql, &state.allowed)?;
    let plan = safety::plan(&state.session, sql);
    match tokio::time::timeout(state.timeout, plan).await {
        Ok(r) => r,
        Err(_) => Err(Refused("planning the query ran over its timeout".into())),
    }
}

/// The rows `skip..skip+fetch` of a checked query, as one batch.
async fn fetch(
    state: &AppState,
    sql: &str,
    skip: usize,
    fetch: usize,
) -> Result<(SchemaRef, RecordBatch), Refused> {
    let df = planned(state, sql).await?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = safety::rows(df, skip, fetch, state.timeout).await?;
    let schema = batches.first().map(|b| b.schema()).unwrap_or(schema);
    let batch = concat_batches(&schema, &batches).map_err(|e| Refused(e.to_string()))?;
    Ok((schema, batch))
}

/// Rows `skip..skip + fetch` of a version in stored order, read straight from
/// its Parquet file: only the row groups holding them are read, and within
/// them only the pages the row selection needs (with the page index), so a
/// deep page costs about what the first does.
fn stored_rows(
    path: &std::path::Path,
    skip: usize,
    fetch: usize,
) -> crate::error::Result<RecordBatch> {
    use datafusion::parquet::arrow::arrow_reader::{
        ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
    };
    use datafusion::parquet::file::metadata::PageIndexPolicy;
    let fail = |e: &dyn std::fmt::Display| {
        crate::error::Error::Dataset(format!("{}: {e}", path.display()))
    };
    let file = std::fs::File::open(path).map_err(|e| crate::error::Error::io(path.display(), e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new_with_options(
        file,
        ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional),
    )
    .map_err(|e| fail(&e))?;
    let schema = builder.schema().clone();
    let (mut groups, mut start, mut first, mut held) = (Vec::new(), 0usize, None, 0usize);
    for (i, rg) in builder.metadata().row_groups().iter().enumerate() {
        let n = usize::try_from(rg.num_rows()).unwrap_or(0);
        if start + n > skip && start < skip.saturating_add(fetch) {
            groups.push(i);
            first.get_or_insert(start);
            held += n;
        }
        start += n;
    }
    let Some(first) = first else {
        return Ok(RecordBatch::new_empty(schema));
    };
    let lead = skip - first;
    let take = fetch.min(held - lead);
    let selection = RowSelection::from(vec![RowSelector::skip(lead), RowSelector::select(take)]);
    let reader = builder
        .with_row_groups(groups)
        .with_row_selection(selection)
        .with_batch_size(take.max(1))
        .build()
        .map_err(|e| fail(&e))?;
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(&e))?;
    concat_batches(&schema, &batches).map_err(|e| fail(&e))
}

/// First lines of the text files of `batch`, read in parallel.
async fn snippets(state: &Arc<AppState>, batch: &RecordBatch, max: u64) -> HashMap<String, String> {
    let files = files_of(batch);
    warm(state, files.clone());
    let texts: Vec<_> = files
        .into_iter()
        .filter(|f| kind(f).0 == Kind::Text)
        .collect();
    let state: &AppState = state;
    futures::stream::iter(texts)
        .map(|f| async move {
            let s = snippet(state, &f, max).await;
            (f.url(), s)
        })
        .buffer_unordered(16)
        .collect()
        .await
}

/// A table of rows (text files by their first lines, the page's
/// thumbnails started); row `i` links to `row_href(first + i)`.
async fn rows_table(
    state: &Arc<AppState>,
    batch: &RecordBatch,
    first: usize,
    header: impl Fn(&str) -> String,
    row_href: impl Fn(usize) -> String,
) -> String {
    let snippets = snippets(state, batch, 1024).await;
    let cells = &Cells {
        files: &state.files,
        snippets: &snippets,
        full: false,
    };
    let schema = batch.schema();
    let mut out = String::from("<table class=\"rows\" id=\"rows\"><thead><tr><th>#</th>");
    for f in schema.fields() {
        let _ = write!(out, "<th>{}</th>", header(f.name()));
    }
    out.push_str("</tr></thead><tbody>");
    for r in 0..batch.num_rows() {
        let _ = write!(
            out,
            "<tr class=\"row\"><td class=\"num\"><a class=\"rowlink\" href=\"{}\">{}</a></td>",
            row_href(first + r),
            first + r
        );
        for col in batch.columns() {
            let _ = write!(out, "<td>{}</td>", cell(col, r, cells));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// Previous / Next links.
fn pager(
    page: usize,
    has_next: bool,
    href: impl Fn(usize) -> String,
    pages: Option<usize>,
) -> String {
    let mut out = String::from("<div class=\"pager\">");
    if page > 1 {
        let _ = write!(
            out,
            "<a class=\"prev\" rel=\"prev\" href=\"{}\">Previous</a>",
            href(page - 1)
        );
    }
    match pages {
        Some(n) => {
            let _ = write!(out, " <span class=\"pageno\">page {page} of {n}</span> ");
        }
        None => {
            let _ = write!(out, " <span class=\"pageno\">page {page}</span> ");
        }
    }
    if has_next {
        let _ = write!(
            out,
            "<a class=\"next\" rel=\"next\" href=\"{}\">Next</a>",
            href(page + 1)
        );
    }
    out.push_str("</div>");
    out
}

/// Column names of a version, from a plan of it (nothing is read).
async fn columns(state: &AppState, name: &str, version: u32) -> Result<Vec<String>, Refused> {
    let sql = View::default().sql(name, version, &[])?;
    let df = planned(state, &sql).await?;
    Ok(df
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect())
}

/// `GET /d/{name}/{version}?page=&sort=&desc=&where=`.
pub(super) async fn version(
    State(state): State<Arc<AppState>>,
    Path((name, version)): Path<(String, u32)>,
    RawQuery(query): RawQuery,
) -> Response {
    let started = Instant::now();
    let p = params(query.as_deref());
    let view = View::from(&p);
    let info = match state.catalog.get(&name, Some(version)).await {
        Ok(i) => i,
        Err(e) => {
            return error_page(StatusCode::NOT_FOUND, &name, &e.to_string(), "", started);
        }
    };
    let versions = versions_of(&state.catalog, &name).await;
    let title = format!("{name} v{version}");
    let columns: Vec<String> = info
        .schema
        .lines()
        .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_string()))
        .collect();
    let page_no = page_number(&p);
    let skip = (page_no - 1) * PAGE_ROWS;
    let base = format!("/d/{}/{version}", url_encode(&name));
    let mut body = format!("<h1>{}</h1>", esc(&title));
    let _ = write!(
        body,
        "<p class=\"facts\"><span id=\"total\">{}</span> rows · {} · created {} · versions {}</p>",
        info.rows,
        human_bytes(info.bytes),
        time_secs(info.created),
        versions
            .iter()
            .map(|v| format!("<a href=\"/d/{}/{v}\">v{v}</a>", url_encode(&name)))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let sources = lineage_html(&state.catalog, &name, version).await;
    if !sources.is_empty() {
        let _ = write!(
            body,
            "<p class=\"lineage\" id=\"lineage\">read from {sources}</p>"
        );
    }
    body.push_str(
        "<details class=\"schema\"><summary>Schema</summary><table class=\"kv\" id=\"schema\">",
    );
    for line in info.schema.lines() {
        let (n, t) = line.split_once(':').unwrap_or((line, ""));
        let _ = write!(
            body,
            "<tr><th>{}</th><td><code>{}</code></td></tr>",
            esc(n.trim()),
            esc(t.trim())
        );
    }
    let _ = write!(
        body,
        "</table></details><details class=\"query\"><summary>Query that made it</summary><pre>{}</pre></details>",
        esc(&info.query)
    );
    // The filter and sort form.
    let _ = write!(
        body,
        "<form class=\"filter\" method=\"get\" action=\"{base}\"><label>WHERE <input id=\"where\" name=\"where\" size=\"50\" value=\"{}\" placeholder=\"e.g. file.size > 1000\"></label> \
         <label>sort by <select name=\"sort\" id=\"sort\"><option value=\"\">(stored order)</option>{}</select></label> \
         <label><input type=\"checkbox\" name=\"desc\" value=\"1\"{}> descending</label> <button type=\"submit\" id=\"apply\">Filter</button></form>",
        esc(view.filter.as_deref().unwrap_or("")),
        columns
            .iter()
            .map(|c| format!(
                "<option{} value=\"{}\">{}</option>",
                if view.sort.as_deref() == Some(c) {
                    " selected"
                } else {
                    ""
                },
                esc(c),
                esc(c)
            ))
            .collect::<String>(),
        if view.desc { " checked" } else { "" }
    );
    if versions.len() >= 2 {
        let other = versions
            .iter()
            .rev()
            .find(|&&v| v != version)
            .copied()
            .unwrap_or(version);
        let _ = write!(
            body,
            "<p><a class=\"compare\" href=\"/compare?name={}&amp;a={other}&amp;b={version}\">Compare with another version</a></p>",
            url_encode(&name)
        );
    }
    let sql = match view.sql(&name, version, &columns) {
        Ok(s) => s,
        Err(e) => {
            return error_page(
                StatusCode::BAD_REQUEST,
                &title,
                &e.to_string(),
                &body,
                started,
            );
        }
    };
    // Unfiltered and unsorted: straight from the stored file; else planned.
    let read = if view.filter.is_none() && view.sort.is_none() {
        let data = info.path.join("data.parquet");
        crate::runtime::blocking(move || stored_rows(&data, skip, PAGE_ROWS + 1))
            .await
            .map_err(|e| Refused(e.to_string()))
    } else {
        fetch(&state, &sql, skip, PAGE_ROWS + 1)
            .await
            .map(|(_, b)| b)
    };
    let batch = match read {
        Ok(b) => b,
        Err(e) => {
            return error_page(
                StatusCode::BAD_REQUEST,
                &title,
                &e.to_string(),
                &body,
                started,
            );
        }
    };
    let has_next = batch.num_rows() > PAGE_ROWS;
    let batch = batch.slice(0, batch.num_rows().min(PAGE_ROWS));
    let vq = view.query();
    if view.filter.is_some() {
        let _ = write!(
            body,
            "<p class=\"facts\">matching rows: <span id=\"count\" data-count-url=\"/count?name={}&amp;version={version}{vq}\">counting…</span></p>",
            url_encode(&name)
        );
    }
    let pages = view
        .filter
        .is_none()
        .then(|| (info.rows as usize).div_ceil(PAGE_ROWS).max(1));
    let sort_header = |c: &str| {
        let desc = view.sort.as_deref() == Some(c) && !view.desc;
        let arrow = match (view.sort.as_deref() == Some(c), view.desc) {
            (true, false) => " ▲",
            (true, true) => " ▼",
            _ => "",
        };
        let mut v = view.clone();
        v.sort = Some(c.to_string());
        v.desc = desc;
        format!(
            "<a class=\"sort\" href=\"{base}?page=1{}\">{}{arrow}</a>",
            v.query(),
            esc(c)
        )
    };
    let row_href = |i: usize| format!("{base}/row/{i}?x=1{vq}");
    body.push_str(&pager(
        page_no,
        has_next,
        |n| format!("{base}?page={n}{vq}"),
        pages,
    ));
    body.push_str(&rows_table(&state, &batch, skip, sort_header, row_href).await);
    body.push_str(&pager(
        page_no,
        has_next,
        |n| format!("{base}?page={n}{vq}"),
        pages,
    ));
    page(StatusCode::OK, &title, &body, started)
}

/// The full page of one row: every column whole, file metadata, neighbours.
/// `rows` holds row `index` and, when there is one, the next.
async fn row_page(
    state: &Arc<AppState>,
    title: &str,
    rows: Result<RecordBatch, Refused>,
    index: usize,
    href: impl Fn(usize) -> String,
    back: &str,
    started: Instant,
) -> Response {
    let batch = match rows {
        Ok(r) => r,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, title, &e.to_string(), "", started),
    };
    if batch.num_rows() == 0 {
        return error_page(
            StatusCode::NOT_FOUND,
            title,
            &format!("no row {index}"),
            back,
            started,
        );
    }
    let has_next = batch.num_rows() > 1;
    let batch = batch.slice(0, 1);
    let snippets = snippets(state, &batch, 64 << 10).await;
    let cells = Cells {
        files: &state.files,
        snippets: &snippets,
        full: true,
    };
    let mut body = format!("<h1>{}</h1>{back}<div class=\"pager\">", esc(title));
    if index > 0 {
        let _ = write!(
            body,
            "<a class=\"prev\" rel=\"prev\" href=\"{}\">Previous row</a> ",
            href(index - 1)
        );
    }
    if has_next {
        let _ = write!(
            body,
            "<a class=\"next\" rel=\"next\" href=\"{}\">Next row</a>",
            href(index + 1)
        );
    }
    body.push_str("</div><table class=\"kv row-page\" id=\"row\">");
    let schema = batch.schema();
    for (f, col) in schema.fields().iter().zip(batch.columns()) {
        let _ = write!(
            body,
            "<tr><th>{}</th><td>{}</td></tr>",
            esc(f.name()),
            cell(col, 0, &cells)
        );
    }
    body.push_str("</table>");
    page(StatusCode::OK, title, &body, started)
}

/// `GET /d/{name}/{version}/row/{index}?where=&sort=&desc=`.
pub(super) async fn version_row(
    State(state): State<Arc<AppState>>,
    Path((name, version, index)): Path<(String, u32, usize)>,
    RawQuery(query): RawQuery,
) -> Response {
    let started = Instant::now();
    let p = params(query.as_deref());
    let view = View::from(&p);
    let title = format!("{name} v{version} · row {index}");
    let columns = match columns(&state, &name, version).await {
        Ok(c) => c,
        Err(e) => return error_page(StatusCode::NOT_FOUND, &title, &e.to_string(), "", started),
    };
    let sql = match view.sql(&name, version, &columns) {
        Ok(s) => s,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &title, &e.to_string(), "", started),
    };
    let base = format!("/d/{}/{version}", url_encode(&name));
    let vq = view.query();
    let back = format!(
        "<p><a class=\"back\" href=\"{base}?page={}{vq}\">back to the rows</a></p>",
        index / PAGE_ROWS + 1
    );
    // In stored order: straight from the stored file, as the version's pages.
    let rows = if view.filter.is_none() && view.sort.is_none() {
        match state.catalog.get(&name, Some(version)).await {
            Ok(info) => {
                let data = info.path.join("data.parquet");
                crate::runtime::blocking(move || stored_rows(&data, index, 2))
                    .await
                    .map_err(|e| Refused(e.to_string()))
            }
            Err(e) => Err(Refused(e.to_string())),
        }
    } else {
        fetch(&state, &sql, index, 2).await.map(|(_, b)| b)
    };
    row_page(
        &state,
        &title,
        rows,
        index,
        |i| format!("{base}/row/{i}?x=1{vq}"),
        &back,
        started,
    )
    .await
}

/// The query form, holding `sql`.
fn query_form(sql: &str) -> String {
    format!(
        "<form class=\"query\" method=\"get\" action=\"/query\"><textarea id=\"q\" name=\"q\" rows=\"5\" cols=\"90\" \
         placeholder=\"SELECT * FROM read_dataset('name') WHERE ...\">{}</textarea><br>\
         <button type=\"submit\" id=\"run\">Run</button> <span class=\"hint\">one SELECT; \
         read_dataset('name' [, 'version']), read_storage('s3://...'), ...</span></form>",
        esc(sql)
    )
}

/// `GET /query?q=&page=`.
pub(super) async fn query(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Response {
    let started = Instant::now();
    let p = params(query.as_deref());
    let sql = p.get("q").map(|s| s.trim().to_string()).unwrap_or_default();
    let mut body = String::from("<h1>Query</h1>");
    body.push_str(&query_form(&sql));
    if sql.is_empty() {
        return page(StatusCode::OK, "Query", &body, started);
    }
    let page_no = page_number(&p);
    let skip = (page_no - 1) * PAGE_ROWS;
    let (_, batch) = match fetch(&state, &sql, skip, PAGE_ROWS + 1).await {
        Ok(r) => r,
        Err(e) => {
            return error_page(
                StatusCode::BAD_REQUEST,
                "Query refused",
                &e.to_string(),
                &body,
                started,
            );
        }
    };
    let has_next = batch.num_rows() > PAGE_ROWS;
    let batch = batch.slice(0, batch.num_rows().min(PAGE_ROWS));
    let q = url_encode(&sql);
    let _ = write!(
        body,
        "<p class=\"facts\"><a id=\"permalink\" href=\"/query?q={q}\">Link to this query</a> · rows: \
         <span id=\"count\" data-count-url=\"/count?q={q}\">counting…</span></p>"
    );
    body.push_str(&pager(
        page_no,
        has_next,
        |n| format!("/query?q={q}&amp;page={n}"),
        None,
    ));
    body.push_str(
        &rows_table(&state, &batch, skip, esc, |i| {
            format!("/query/row?q={q}&amp;i={i}")
        })
        .await,
    );
    body.push_str(&pager(
        page_no,
        has_next,
        |n| format!("/query?q={q}&amp;page={n}"),
        None,
    ));
    page(StatusCode::OK, "Query", &body, started)
}

/// `GET /query/row?q=&i=`.
pub(super) async fn query_row(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Response {
    let started = Instant::now();
    let p = params(query.as_deref());
    let sql = p.get("q").cloned().unwrap_or_default();
    let index = p.get("i").and_then(|i| i.parse().ok()).unwrap_or(0usize);
    let q = url_encode(&sql);
    let back = format!(
        "<p><a class=\"back\" href=\"/query?q={q}&amp;page={}\">back to the result</a></p>",
        index / PAGE_ROWS + 1
    );
    let rows = fetch(&state, &sql, index, 2).await.map(|(_, b)| b);
    row_page(
        &state,
        &format!("Query result · row {index}"),
        rows,
        index,
        |i| format!("/query/row?q={q}&amp;i={i}"),
        &back,
        started,
    )
    .await
}

/// `GET /count?q=` or `/count?name=&version=&where=`: the number of rows, as text.
pub(super) async fn count(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Response {
    let p = params(query.as_deref());
    let sql = match (
        p.get("q"),
        p.get("name"),
        p.get("version").and_then(|v| v.parse().ok()),
    ) {
        (Some(q), _, _) => Ok(q.clone()),
        (None, Some(name), Some(version)) => View {
            sort: None,
            ..View::from(&p)
        }
        .sql(name, version, &[]),
        _ => Err(Refused("count needs q, or name and version".into())),
    };
    let counted = match sql {
        Ok(sql) => match planned(&state, &sql).await {
            Ok(df) => safety::count(df, state.timeout).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match counted {
        Ok(n) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain")],
            n.to_string(),
        )
            .into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        )
            .into_response(),
    }
}

/// `GET /compare?name=&a=&b=&key=`: rows of `b` added, removed and changed
/// since `a`, matched by the key column.
pub(super) async fn compare(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Response {
    let started = Instant::now();
    let p = params(query.as_deref());
    let name = p.get("name").cloned().unwrap_or_default();
    let version = |k: &str| {
        p.get(k)
            .and_then(|v| v.trim().trim_start_matches('v').parse::<u32>().ok())
    };
    let versions = versions_of(&state.catalog, &name).await;
    let title = format!("Compare {name}");
    let (Some(a), Some(b)) = (version("a"), version("b")) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            &title,
            "give two versions: ?name=..&a=..&b=..",
            "",
            started,
        );
    };
    let (cols_a, cols_b) = match (
        columns(&state, &name, a).await,
        columns(&state, &name, b).await,
    ) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => {
            return error_page(StatusCode::NOT_FOUND, &title, &e.to_string(), "", started);
        }
    };
    let common: Vec<String> = cols_b
        .iter()
        .filter(|c| cols_a.contains(c))
        .cloned()
        .collect();
    let key = p
        .get("key")
        .filter(|k| common.contains(k))
        .cloned()
        .or_else(|| {
            ["id", "key", "file"]
                .iter()
                .map(|s| s.to_string())
                .find(|k| common.contains(k))
        })
        .or_else(|| common.first().cloned());
    let opts = |selected: u32| {
        versions
            .iter()
            .map(|v| {
                format!(
                    "<option{} value=\"{v}\">v{v}</option>",
                    if *v == selected { " selected" } else { "" }
                )
            })
            .collect::<String>()
    };
    let mut body = format!("<h1>{}</h1>", esc(&title));
    let _ = write!(
        body,
        "<form class=\"compare\" method=\"get\" action=\"/compare\"><input type=\"hidden\" name=\"name\" value=\"{}\">\
         <label>from <select name=\"a\" id=\"a\">{}</select></label> <label>to <select name=\"b\" id=\"b\">{}</select></label> \
         <label>key <select name=\"key\" id=\"key\">{}</select></label> <button type=\"submit\" id=\"compare\">Compare</button></form>",
        esc(&name),
        opts(a),
        opts(b),
        common
            .iter()
            .map(|c| format!(
                "<option{} value=\"{}\">{}</option>",
                if key.as_deref() == Some(c.as_str()) {
                    " selected"
                } else {
                    ""
                },
                esc(c),
                esc(c)
            ))
            .collect::<String>()
    );
    let Some(key) = key else {
        return error_page(
            StatusCode::BAD_REQUEST,
            &title,
            "the versions share no column to match rows by",
            &body,
            started,
        );
    };
    let (ta, tb) = (
        format!(
            "read_dataset({}, {})",
            literal(&name),
            literal(&a.to_string())
        ),
        format!(
            "read_dataset({}, {})",
            literal(&name),
            literal(&b.to_string())
        ),
    );
    let k = ident(&key);
    let added = format!("SELECT n.* FROM {tb} AS n LEFT ANTI JOIN {ta} AS o ON o.{k} = n.{k}");
    let removed = format!("SELECT o.* FROM {ta} AS o LEFT ANTI JOIN {tb} AS n ON o.{k} = n.{k}");
    let others: Vec<&String> = common.iter().filter(|c| **c != key).collect();
    let changed = if others.is_empty() {
        None
    } else {
        let differs: Vec<String> = others
            .iter()
            .map(|c| format!("(o.{0} IS DISTINCT FROM n.{0})", ident(c)))
            .collect();
        let which: Vec<String> = others
            .iter()
            .map(|c| {
                format!(
                    "CASE WHEN o.{0} IS DISTINCT FROM n.{0} THEN {1} END",
                    ident(c),
                    literal(c)
                )
            })
            .collect();
        Some(format!(
            "SELECT concat_ws(', ', {}) AS changed_columns, n.* FROM {tb} AS n JOIN {ta} AS o ON o.{k} = n.{k} WHERE {}",
            which.join(", "),
            differs.join(" OR ")
        ))
    };
    let sections = [
        ("Added", "added", Some(added)),
        ("Removed", "removed", Some(removed)),
        ("Changed", "changed", changed),
    ];
    let runs = sections.iter().map(|(_, _, sql)| {
        let state = &state;
        async move {
            let sql = sql.as_ref()?;
            let rows = fetch(state, sql, 0, PAGE_ROWS).await;
            let n = match planned(state, sql).await {
                Ok(df) => safety::count(df, state.timeout).await,
                Err(e) => Err(e),
            };
            Some((sql.clone(), rows, n))
        }
    });
    let results = futures::future::join_all(runs).await;
    for ((label, id, _), result) in sections.iter().zip(results) {
        let Some((sql, rows, n)) = result else {
            let _ = write!(
                body,
                "<h2 id=\"{id}\">{label}: 0</h2><p>no columns besides the key</p>"
            );
            continue;
        };
        let n = match n {
            Ok(n) => n.to_string(),
            Err(e) => format!("? ({e})"),
        };
        let _ = write!(
            body,
            "<h2>{label}: <span id=\"{id}\">{}</span></h2><p><a href=\"/query?q={}\">as a query</a></p>",
            esc(&n),
            url_encode(&sql)
        );
        match rows {
            Ok((_, batch)) => {
                let q = url_encode(&sql);
                body.push_str(
                    &rows_table(&state, &batch, 0, esc, |i| {
                        format!("/query/row?q={q}&amp;i={i}")
                    })
                    .await,
                );
            }
            Err(e) => {
                let _ = write!(body, "<p class=\"error\">{}</p>", esc(&e.to_string()));
            }
        }
    }
    page(StatusCode::OK, &title, &body, started)
}

/// What version `version` of `name` read (its lineage, recorded at save
/// time): storage URIs as text, dataset versions as links; empty for a
/// version saved before lineage was recorded.
async fn lineage_html(catalog: &Catalog, name: &str, version: u32) -> String {
    let entries = catalog
        .lineage(name, Some(version))
        .await
        .unwrap_or_default();
    entries
        .iter()
        .map(|e| match e {
            LineageEntry::Storage { uri } => format!("<code class=\"source\">{}</code>", esc(uri)),
            LineageEntry::Dataset { name, version } => format!(
                "<a class=\"source\" href=\"/d/{}/{version}\">{} v{version}</a>",
                url_encode(name),
                esc(name)
            ),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
