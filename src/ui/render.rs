//! Values as HTML. Guarantees: every text from data, the catalog or an error
//! is HTML-escaped ([`esc`]) and every link's query value percent-encoded
//! ([`url_encode`]) after credentials are redacted ([`crate::util::redact`]); a `File` column shows a thumbnail (images), the
//! first lines (text), a player (audio, video) or its size and path; an
//! image value (the engine's image struct) shows inline as a small JPEG
//! `data:` URI; a struct folds into `<details>`; a value longer than
//! [`CUT`] characters shows cut, with the whole behind a `<details>`.

use std::collections::HashMap;
use std::fmt::Write;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use udfchain_udfs::File;
use udfchain_udfs::builtins::image::{Filter, Format, Image, encode, resize_to_fit};

use super::files::{Files, Kind, kind};
use crate::util::redact::redact;

/// Characters of a value shown before it is cut.
pub(super) const CUT: usize = 160;

/// `text` redacted and escaped for HTML text and attribute values.
pub(super) fn esc(text: &str) -> String {
    let text = redact(text);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` redacted and percent-encoded for a query string value on a page
/// (a link holding a credential carries `***` instead: it shows no secret,
/// and reproduces nothing that needed one).
pub(super) fn url_encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(redact(text).as_bytes()).collect()
}

/// `text` percent-encoded as it is (the URL `udfchain ui` prints).
pub(super) fn url_encode_raw(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The decoded `name=value` pairs of a query string (later ones win).
pub(super) fn params(query: Option<&str>) -> HashMap<String, String> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64 (URL alphabet, no padding).
pub(super) fn b64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// Standard base64 with padding (for `data:` URIs).
fn b64_std(bytes: &[u8]) -> String {
    let mut s: String = b64url(bytes)
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !s.len().is_multiple_of(4) {
        s.push('=');
    }
    s
}

/// The bytes of [`b64url`] text; `None` for anything else.
pub(super) fn b64url_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = B64.iter().position(|&b| b == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// How a table renders its cells.
pub(super) struct Cells<'a> {
    pub files: &'a Files,
    /// First lines of text files, by `File::url()`.
    pub snippets: &'a HashMap<String, String>,
    /// A row page: full images, whole values, file metadata.
    pub full: bool,
}

/// The `File`s of every File column of `batch` (for snippets).
pub(super) fn files_of(batch: &RecordBatch) -> Vec<File> {
    let mut out = Vec::new();
    for col in batch.columns() {
        collect_files(col, &mut out);
    }
    out
}

fn collect_files(array: &ArrayRef, out: &mut Vec<File>) {
    if let DataType::Struct(_) = array.data_type() {
        if File::is_file_type(array.data_type()) {
            if let Ok(files) = File::decode_array(array) {
                out.extend(files.into_iter().flatten());
            }
        } else if let Some(s) = array
            .as_any()
            .downcast_ref::<datafusion::arrow::array::StructArray>()
        {
            for c in s.columns() {
                collect_files(c, out);
            }
        }
    }
}

/// One cell.
pub(super) fn cell(array: &ArrayRef, i: usize, c: &Cells<'_>) -> String {
    if array.is_null(i) {
        return "<span class=\"null\">null</span>".into();
    }
    let dt = array.data_type();
    if File::is_file_type(dt) {
        return match File::decode_array(&array.slice(i, 1)) {
            Ok(mut f) => match f.pop().flatten() {
                Some(file) => file_cell(&file, c),
                None => "<span class=\"null\">null</span>".into(),
            },
            Err(e) => format!("<span class=\"err\">{}</span>", esc(&e.to_string())),
        };
    }
    if Image::is_image_type(dt) {
        return image_cell(&array.slice(i, 1), c.full);
    }
    match dt {
        DataType::Struct(fields) => {
            let Some(s) = array
                .as_any()
                .downcast_ref::<datafusion::arrow::array::StructArray>()
            else {
                return String::new();
            };
            let mut out = format!(
                "<details{}><summary>{{{} fields}}</summary><dl>",
                if c.full { " open" } else { "" },
                fields.len()
            );
            for (f, col) in fields.iter().zip(s.columns()) {
                let _ = write!(
                    out,
                    "<dt>{}</dt><dd>{}</dd>",
                    esc(f.name()),
                    cell(col, i, c)
                );
            }
            out.push_str("</dl></details>");
            out
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            let len = datafusion::arrow::array::AsArray::as_binary_opt::<i32>(array.as_ref())
                .map(|b| b.value(i).len())
                .or_else(|| {
                    datafusion::arrow::array::AsArray::as_binary_opt::<i64>(array.as_ref())
                        .map(|b| b.value(i).len())
                })
                .or_else(|| {
                    datafusion::arrow::array::AsArray::as_binary_view_opt(array.as_ref())
                        .map(|b| b.value(i).len())
                });
            match len {
                Some(n) => format!("<span class=\"bin\">{n} bytes</span>"),
                None => "<span class=\"bin\">bytes</span>".into(),
            }
        }
        _ => {
            let opts = FormatOptions::default().with_null("null");
            let text = match ArrayFormatter::try_new(array.as_ref(), &opts) {
                Ok(f) => f.value(i).to_string(),
                Err(e) => return format!("<span class=\"err\">{}</span>", esc(&e.to_string())),
            };
            long_text(&text, c.full)
        }
    }
}

/// A text value, cut at [`CUT`] characters unless `full`.
pub(super) fn long_text(text: &str, full: bool) -> String {
    let n = text.chars().count();
    if full || n <= CUT {
        return format!("<span class=\"v\">{}</span>", esc(text));
    }
    let head: String = text.chars().take(CUT).collect();
    format!(
        "<span class=\"v cut\">{}…</span><details class=\"whole\"><summary>show all {n} characters</summary><pre>{}</pre></details>",
        esc(&head),
        esc(text)
    )
}

fn image_cell(array: &ArrayRef, full: bool) -> String {
    let side = if full { 1024 } else { super::THUMB_SIDE };
    let made = Image::views(array.as_ref())
        .ok()
        .and_then(|v| v.into_iter().next().flatten())
        .ok_or_else(|| "not an image".to_string())
        .and_then(|img| {
            let small = resize_to_fit(img, side, Filter::Bilinear).map_err(|e| e.to_string())?;
            let jpeg = encode(small.view(), Format::Jpeg, Some(80)).map_err(|e| e.to_string())?;
            Ok((img.width, img.height, jpeg))
        });
    match made {
        Ok((w, h, jpeg)) => format!(
            "<img class=\"thumb\" alt=\"image {w}x{h}\" src=\"data:image/jpeg;base64,{}\"><div class=\"meta\">{w}x{h}</div>",
            b64_std(&jpeg)
        ),
        Err(e) => format!("<span class=\"err\">{}</span>", esc(&e)),
    }
}

fn file_cell(file: &File, c: &Cells<'_>) -> String {
    let signed = c.files.sign(file);
    let name = match file.member() {
        Some(m) => format!("{}#{}", file.path, m.name),
        None => file.path.clone(),
    };
    let (k, _) = kind(file);
    let mut out = String::new();
    match k {
        Kind::Image if c.full => {
            let _ = write!(
                out,
                "<a href=\"/file?{signed}\"><img class=\"full\" alt=\"{}\" src=\"/file?{signed}\"></a>",
                esc(&name)
            );
        }
        Kind::Image => {
            let _ = write!(
                out,
                "<img class=\"thumb\" alt=\"{}\" src=\"/thumb?{signed}\">",
                esc(&name)
            );
        }
        Kind::Text => {
            let text = c
                .snippets
                .get(&file.url())
                .map(String::as_str)
                .unwrap_or("");
            let lines: Vec<&str> = text.lines().take(if c.full { 200 } else { 3 }).collect();
            let _ = write!(
                out,
                "<pre class=\"snippet\">{}</pre>",
                esc(&lines.join("\n"))
            );
        }
        Kind::Audio => {
            let _ = write!(
                out,
                "<audio controls preload=\"none\" src=\"/file?{signed}\"></audio>"
            );
        }
        Kind::Video => {
            let _ = write!(
                out,
                "<video controls preload=\"none\" class=\"{}\" src=\"/file?{signed}\"></video>",
                if c.full { "full" } else { "thumb" }
            );
        }
        Kind::Other => {}
    }
    let _ = write!(
        out,
        "<div class=\"path\" title=\"{}\">{} <span class=\"size\">{}</span></div>",
        esc(&file.url()),
        esc(&name),
        human_bytes(file.size)
    );
    if c.full {
        let _ = write!(
            out,
            "<table class=\"kv\"><tr><th>object</th><td><code>{}</code> (<a href=\"/file?{signed}\">open</a>)</td></tr>\
             <tr><th>source</th><td>{}</td></tr><tr><th>path</th><td>{}</td></tr>\
             <tr><th>size</th><td>{} bytes</td></tr><tr><th>version</th><td>{}</td></tr>\
             <tr><th>etag</th><td>{}</td></tr><tr><th>last modified</th><td>{}</td></tr>\
             <tr><th>location</th><td>{}</td></tr></table>",
            esc(&file.url()),
            esc(&file.source),
            esc(&file.path),
            file.size,
            esc(file.version.as_deref().unwrap_or("")),
            esc(file.etag.as_deref().unwrap_or("")),
            file.last_modified.map(time_ms).unwrap_or_default(),
            esc(file.location.as_deref().unwrap_or("")),
        );
    }
    out
}

/// `1.5 MB`, `312 B`.
pub(super) fn human_bytes(n: u64) -> String {
    const UNITS: &[&str] = &["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub(super) fn time_secs(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

fn time_ms(ms: i64) -> String {
    time_secs(ms.div_euclid(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for s in ["", "a", "ab", "abc", "abcd", "{\"path\":\"x/y.jpg\"}"] {
            assert_eq!(
                b64url_decode(&b64url(s.as_bytes())).as_deref(),
                Some(s.as_bytes())
            );
        }
        assert_eq!(b64_std(b"ab"), "YWI=");
        assert_eq!(esc("<a href='x'>&"), "&lt;a href=&#39;x&#39;&gt;&amp;");
    }
}
