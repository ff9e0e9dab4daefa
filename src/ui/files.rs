//! Files on pages: signed references, thumbnails and bytes. Guarantees:
//! - `/thumb` and `/file` serve only a `File` the server signed on a page it
//!   rendered (a keyed BLAKE3 tag of the `File`'s JSON, the key random per
//!   process): a request naming any other file is refused (403), so no URL
//!   reaches a file no dataset or allowed query showed;
//! - a thumbnail is made natively (`udfchain_udfs::builtins::image`: decoded
//!   at reduced size where the format allows, with a pixel limit checked
//!   before any pixel buffer exists), at most one per file at a time
//!   (single flight) and [`cores`](crate::runtime::cores) at once, on the
//!   blocking pool; a page starts the thumbnails of its images all at once
//!   ([`warm`], [`WARM_READS`] reads at a time) as it renders, so the
//!   browser's requests find them made or join them; it is cached under `<root>/cache/ui-thumbs/` (written to
//!   a temp file, then renamed) and served with a strong `ETag` derived from
//!   the file's identity (source, path, size, version, etag, last modified),
//!   so `If-None-Match` gets a 304 without reading anything;
//! - a file that is not an image, truncated, corrupt, too large or a
//!   decompression bomb gets an error tile (a PNG, 200, `no-store`, the reason
//!   in `X-Udfchain-Thumb-Error`), never a crash;
//! - `/file` serves bytes with a type from a fixed list of inert types
//!   (images but SVG, audio, video, plain text); anything else is an
//!   `application/octet-stream` attachment, with `nosniff` and a sandboxing
//!   CSP, so no stored HTML or SVG runs as a page of this origin.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use udfchain_udfs::FileSource;
use udfchain_udfs::builtins::image::{
    DecodeOptions, Filter, Format, Image, Mode, encode, resize_to_fit,
};
use udfchain_udfs::{File, UdfError};

use super::pages::AppState;
use super::render::{b64url, b64url_decode, params};
use crate::cache::StoreSource;
use crate::error::{Error, Result};
use crate::runtime::blocking;
use crate::util::redact::redact;
use crate::util::single_flight::SingleFlight;

/// Images of more pixels get the error tile (a 64-megapixel photo passes).
const MAX_THUMB_PIXELS: u64 = 64 << 20;
/// Files larger than this are not read for a thumbnail.
const MAX_THUMB_SOURCE: u64 = 256 << 20;
/// Files read at once for thumbnails.
const WARM_READS: usize = 16;
/// Files larger than this are not served whole.
const MAX_SERVED: u64 = 1 << 30;

/// What a file is, by its name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Image,
    Text,
    Audio,
    Video,
    Other,
}

/// The kind and the inert content type of `file` (of its member's name for
/// a virtual file).
pub(super) fn kind(file: &File) -> (Kind, &'static str) {
    let name = file
        .member()
        .map(|m| m.name)
        .unwrap_or_else(|| file.path.clone());
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "jpg" | "jpeg" => (Kind::Image, "image/jpeg"),
        "png" => (Kind::Image, "image/png"),
        "gif" => (Kind::Image, "image/gif"),
        "webp" => (Kind::Image, "image/webp"),
        "bmp" => (Kind::Image, "image/bmp"),
        "tif" | "tiff" => (Kind::Image, "image/tiff"),
        "txt" | "md" | "csv" | "tsv" | "json" | "jsonl" | "log" | "yaml" | "yml" | "py" | "rs"
        | "toml" | "cls" | "caption" | "xml" | "html" | "htm" | "sql" => {
            (Kind::Text, "text/plain; charset=utf-8")
        }
        "wav" => (Kind::Audio, "audio/wav"),
        "mp3" => (Kind::Audio, "audio/mpeg"),
        "ogg" | "oga" => (Kind::Audio, "audio/ogg"),
        "flac" => (Kind::Audio, "audio/flac"),
        "m4a" => (Kind::Audio, "audio/mp4"),
        "mp4" | "m4v" => (Kind::Video, "video/mp4"),
        "webm" => (Kind::Video, "video/webm"),
        "mov" => (Kind::Video, "video/quicktime"),
        _ => (Kind::Other, "application/octet-stream"),
    }
}

/// Signs file references and makes thumbnails.
#[derive(Debug)]
pub(super) struct Files {
    key: [u8; 32],
    dir: PathBuf,
    flights: SingleFlight,
    decoding: tokio::sync::Semaphore,
    /// Reads of files for thumbnails at once.
    reading: tokio::sync::Semaphore,
    /// Thumbnails being made ahead of the browser's requests.
    warming: std::sync::Mutex<tokio::task::JoinSet<()>>,
}

impl Files {
    /// Thumbnails cached in `dir` (created).
    pub(super) fn new(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| Error::internal(format!("random key: {e}")))?;
        Ok(Self {
            key,
            dir: dir.to_path_buf(),
            flights: SingleFlight::default(),
            decoding: tokio::sync::Semaphore::new(crate::runtime::cores()),
            reading: tokio::sync::Semaphore::new(WARM_READS),
            warming: std::sync::Mutex::new(tokio::task::JoinSet::new()),
        })
    }

    fn tag(&self, payload: &str) -> String {
        let hash = blake3::keyed_hash(&self.key, payload.as_bytes());
        hash.to_hex()[..32].to_string()
    }

    /// `f=...&s=...`: the query naming `file` on `/thumb` and `/file`.
    pub(super) fn sign(&self, file: &File) -> String {
        let json = serde_json::to_string(file).unwrap_or_default();
        let f = b64url(json.as_bytes());
        let s = self.tag(&f);
        format!("f={f}&s={s}")
    }

    /// The file a signed query names; `None` when unsigned or forged.
    fn verify(&self, query: Option<&str>) -> Option<File> {
        let p = params(query);
        let (f, s) = (p.get("f")?, p.get("s")?);
        let want = self.tag(f);
        let ok = want.len() == s.len()
            && want
                .bytes()
                .zip(s.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !ok {
            return None;
        }
        serde_json::from_slice(&b64url_decode(f)?).ok()
    }
}

/// The cache key (and ETag) of `file`'s thumbnail.
fn thumb_key(file: &File) -> String {
    let json = serde_json::to_string(file).unwrap_or_default();
    let hash = blake3::hash(format!("{json}\n{}", super::THUMB_SIDE).as_bytes());
    hash.to_hex()[..32].to_string()
}

/// A reader of files with the session's stores and storage options.
pub(super) fn source(state: &AppState) -> StoreSource {
    StoreSource::new(
        state.session.context().runtime_env(),
        state.session.settings().get_storage_options().clone(),
        None,
    )
}

/// The error tile: a gray square with a red cross, PNG.
static ERROR_TILE: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let side = 64u32;
    let mut data = Vec::with_capacity((side * side * 3) as usize);
    for y in 0..side {
        for x in 0..side {
            let on_cross = x.abs_diff(y) < 4 || (x + y).abs_diff(side - 1) < 4;
            data.extend_from_slice(if on_cross {
                &[200, 40, 40]
            } else {
                &[225, 225, 225]
            });
        }
    }
    Image::new(side, side, Mode::Rgb, data)
        .and_then(|img| encode(img.view(), Format::Png, None))
        .unwrap_or_default()
});

fn error_tile(reason: &str) -> Response {
    let mut resp = (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "image/png"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        ERROR_TILE.clone(),
    )
        .into_response();
    let reason: String = redact(reason)
        .chars()
        .filter(|c| c.is_ascii() && !c.is_ascii_control())
        .take(300)
        .collect();
    if let Ok(v) = HeaderValue::from_str(&reason) {
        resp.headers_mut().insert("x-udfchain-thumb-error", v);
    }
    resp
}

fn forbidden() -> Response {
    (
        StatusCode::FORBIDDEN,
        "udfchain ui: this file reference was not signed by this server",
    )
        .into_response()
}

fn not_modified(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
}

/// `GET /thumb?f=..&s=..`: the file's thumbnail (JPEG) or the error tile.
pub(super) async fn thumb(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let Some(file) = state.files.verify(query.as_deref()) else {
        return forbidden();
    };
    let key = thumb_key(&file);
    let etag = format!("\"{key}\"");
    if not_modified(&headers, &etag) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    match make_thumb(&state, &file, &key).await {
        Ok(jpeg) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "image/jpeg".to_string()),
                (header::ETAG, etag),
                (header::CACHE_CONTROL, "private, no-cache".to_string()),
            ],
            jpeg,
        )
            .into_response(),
        Err(reason) => error_tile(&reason),
    }
}

/// The cached thumbnail, made first when missing.
async fn make_thumb(
    state: &AppState,
    file: &File,
    key: &str,
) -> std::result::Result<Bytes, String> {
    let files = &state.files;
    let path = files.dir.join(format!("{key}.jpg"));
    files
        .flights
        .run(key, async || {
            if let Ok(b) = tokio::fs::read(&path).await {
                return Ok(Bytes::from(b));
            }
            if file.size > MAX_THUMB_SOURCE {
                return Err(format!("{} bytes: too large for a thumbnail", file.size));
            }
            let bytes = {
                let _reading = files.reading.acquire().await.map_err(|e| e.to_string())?;
                source(state)
                    .read(file)
                    .await
                    .map_err(|e: UdfError| e.to_string())?
            };
            let _turn = files.decoding.acquire().await.map_err(|e| e.to_string())?;
            let jpeg = blocking(move || {
                let options = DecodeOptions {
                    mode: Some(Mode::Rgb),
                    max_side: Some(super::THUMB_SIDE),
                    max_pixels: MAX_THUMB_PIXELS,
                };
                let img = udfchain_udfs::builtins::image::decode(&bytes, &options)
                    .map_err(|e| Error::plan(e.to_string()))?;
                let small = resize_to_fit(img.view(), super::THUMB_SIDE, Filter::Bilinear)
                    .map_err(|e| Error::plan(e.to_string()))?;
                encode(small.view(), Format::Jpeg, Some(80)).map_err(|e| Error::plan(e.to_string()))
            })
            .await
            .map_err(|e| match e {
                Error::Plan(m) => m,
                e => e.to_string(),
            })?;
            // Cached atomically; a failed write costs the cache, not the answer.
            let tmp = files.dir.join(format!(".{key}.{}.tmp", std::process::id()));
            if tokio::fs::write(&tmp, &jpeg).await.is_ok()
                && tokio::fs::rename(&tmp, &path).await.is_err()
            {
                let _ = tokio::fs::remove_file(&tmp).await;
            }
            Ok(Bytes::from(jpeg))
        })
        .await
}

/// Starts making the thumbnails of the image files among `files` that are
/// not cached yet, all at once (reads and decodes bounded as above), so
/// that they are ready or under way when the page's `<img>` requests come:
/// a request joins the one being made (single flight). The tasks are held
/// by the server's state (no detached task); each ends once its thumbnail
/// is made or has failed.
pub(super) fn warm(state: &Arc<AppState>, files: Vec<File>) {
    let mut set = crate::util::lock::lock(&state.files.warming);
    while set.try_join_next().is_some() {}
    for file in files {
        if kind(&file).0 != Kind::Image {
            continue;
        }
        let key = thumb_key(&file);
        if state.files.dir.join(format!("{key}.jpg")).exists() {
            continue;
        }
        let state = Arc::clone(state);
        set.spawn(async move {
            let _ = make_thumb(&state, &file, &key).await;
        });
    }
}

/// The first `max` bytes of a text file, as text (lossy), or why not.
pub(super) async fn snippet(state: &AppState, file: &File, max: u64) -> String {
    let end = file.size.min(max);
    if end == 0 {
        return String::new();
    }
    match source(state).read_range(file, 0..end).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => format!("(unreadable: {e})"),
    }
}

/// `GET /file?f=..&s=..`: the file's bytes, with an inert content type.
pub(super) async fn file(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let Some(file) = state.files.verify(query.as_deref()) else {
        return forbidden();
    };
    let etag = format!("\"{}\"", thumb_key(&file));
    if not_modified(&headers, &etag) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    if file.size > MAX_SERVED {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{} bytes: too large to serve whole", file.size),
        )
            .into_response();
    }
    let (kind, content_type) = kind(&file);
    match source(&state).read(&file).await {
        Ok(bytes) => {
            let disposition = if kind == Kind::Other {
                "attachment"
            } else {
                "inline"
            };
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, content_type.to_string()),
                    (header::CONTENT_DISPOSITION, disposition.to_string()),
                    (header::ETAG, etag),
                    (header::CACHE_CONTROL, "private, no-cache".to_string()),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
                    (header::CONTENT_SECURITY_POLICY, "sandbox".to_string()),
                ],
                bytes,
            )
                .into_response()
        }
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            format!("reading the file failed: {}", redact(&e.to_string())),
        )
            .into_response(),
    }
}
