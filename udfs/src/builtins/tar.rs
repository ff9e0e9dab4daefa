//! `tar_members` / `tar_entries`: a generator expanding a tar archive into one
//! virtual `File` per regular member, reading only the 512-byte headers (by
//! range), so with prefetch the archive is read from its local copy and
//! without it only the headers cross the network. Members are then read by
//! range of the parent.
//!
//! Guarantees, for any bytes (the archive is untrusted):
//! - headers are decoded by the `tar` crate's [`tar::Header`] (ustar with its
//!   name prefix, GNU, old V7; octal and GNU base-256 numbers) and PAX records
//!   by [`tar::PaxExtensions`]; every header's checksum is verified;
//! - names and sizes follow Python's `tarfile` (what WebDataset reads): a PAX
//!   `path` / `size` / `linkpath` (from the member's own `x` header, else
//!   from the `g` global headers before it) overrides the header's field; a
//!   GNU `L` long name (and `K` long link) overrides the header's name, a local
//!   PAX `path` overrides both; regular members are types `0`, NUL and `7`
//!   (a NUL-type name ending in `/` is a directory); directories, links,
//!   devices and other types are skipped, and only regular and unknown types
//!   carry data blocks;
//! - all offset arithmetic is checked: a size past the end of the archive (a
//!   GNU base-256 size of 2^64 - 512, say) is an error naming the byte offset,
//!   never a wrap; each header advances the reader by at least 512 bytes, so a
//!   walk ends after at most `size / 512` header reads;
//! - an extension entry holds at most [`MAX_EXTENSION`] bytes (and all global
//!   PAX records together as much), so memory is bounded whatever the sizes say;
//! - GNU sparse members (`S`) and extension headers with no member after them
//!   are clear errors; the end is two zero blocks, or the end of the bytes.

use std::collections::BTreeMap;

use futures::Stream;
use serde::{Deserialize, Serialize};

use crate::error::UdfError;
use crate::file::File;

const BLOCK: u64 = 512;

/// The most bytes one GNU long name / long link or PAX header entry may hold,
/// and all global PAX records together.
pub const MAX_EXTENSION: u64 = 1 << 20;

/// One regular member of a tar archive: its name in the archive and the
/// virtual file of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TarEntry {
    /// The member's path inside the archive (PAX `path` or GNU long name when
    /// present), as Python's `tarfile` reports it.
    pub name: String,
    /// The member's bytes: a byte range of the archive.
    pub member: File,
}

/// Why the bytes of an archive are not a tar archive this reader accepts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TarError {
    /// A header's checksum does not match its bytes.
    #[error("not a tar archive: header checksum mismatch at byte {offset}")]
    Checksum {
        /// The header's byte offset in the archive.
        offset: u64,
    },
    /// A header field does not parse.
    #[error("not a tar archive: {message} at byte {offset}")]
    Field {
        /// The header's byte offset in the archive.
        offset: u64,
        /// Which field, and why.
        message: String,
    },
    /// An entry's data would end past the end of the archive.
    #[error(
        "corrupt tar archive: the entry at byte {offset} holds {size} bytes, past the end of the {archive}-byte archive"
    )]
    PastEnd {
        /// The entry's header offset.
        offset: u64,
        /// The size its header claims.
        size: u64,
        /// The archive's size.
        archive: u64,
    },
    /// An extension entry (long name, PAX) larger than the reader holds.
    #[error(
        "tar extension entry at byte {offset} holds {size} bytes (at most {MAX_EXTENSION} are read)"
    )]
    ExtensionTooLarge {
        /// The extension's header offset.
        offset: u64,
        /// The size it claims (or the global records held).
        size: u64,
    },
    /// A PAX record does not parse.
    #[error("bad PAX record at byte {offset}: {message}")]
    Pax {
        /// The PAX header's offset.
        offset: u64,
        /// Why.
        message: String,
    },
    /// Two extensions of one kind precede one member.
    #[error("two {what} entries describe the member at byte {offset}")]
    TwoExtensions {
        /// The kind ("GNU long name", "PAX header", ...).
        what: &'static str,
        /// The second extension's offset.
        offset: u64,
    },
    /// Extension headers with no member after them.
    #[error("extension headers at the end of the tar archive (byte {offset}) describe no member")]
    Dangling {
        /// Where the archive ended.
        offset: u64,
    },
    /// A GNU sparse member (not read: its data is not its bytes).
    #[error("GNU sparse member {name:?} at byte {offset} is not supported")]
    Sparse {
        /// The member's name.
        name: String,
        /// Its header's offset.
        offset: u64,
    },
    /// The store returned fewer bytes than asked for.
    #[error("short read of the tar archive at byte {offset}: {got} of {want} bytes")]
    ShortRead {
        /// Where the read started.
        offset: u64,
        /// Bytes returned.
        got: usize,
        /// Bytes asked for.
        want: u64,
    },
}

/// The regular members of the tar archive `file`, in archive order.
pub fn tar_members(file: File) -> impl Stream<Item = Result<File, UdfError>> + Send + 'static {
    use futures::TryStreamExt;
    tar_entries(file).map_ok(|e| e.member)
}

/// The regular members of the tar archive `file` with their names, in archive order.
pub fn tar_entries(file: File) -> impl Stream<Item = Result<TarEntry, UdfError>> + Send + 'static {
    futures::stream::try_unfold(Reader::new(file), |mut reader| async move {
        let next = reader.next_entry().await?;
        Ok(next.map(|e| (e, reader)))
    })
}

/// The extension records that describe the next member.
#[derive(Default)]
struct Pending {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<BTreeMap<String, Vec<u8>>>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.long_name.is_none() && self.long_link.is_none() && self.pax.is_none()
    }
}

struct Reader {
    file: File,
    offset: u64,
    global: BTreeMap<String, Vec<u8>>,
}

impl Reader {
    fn new(file: File) -> Self {
        Self {
            file,
            offset: 0,
            global: BTreeMap::new(),
        }
    }

    fn err(&self, e: TarError) -> UdfError {
        UdfError::Read {
            url: self.file.url(),
            source: Box::new(e),
        }
    }

    async fn read(&self, start: u64, end: u64) -> Result<bytes::Bytes, UdfError> {
        let bytes = self.file.read_range(start..end).await?;
        if bytes.len() as u64 != end - start {
            return Err(self.err(TarError::ShortRead {
                offset: start,
                got: bytes.len(),
                want: end - start,
            }));
        }
        Ok(bytes)
    }

    /// The PAX value of `key` for the next member: its own header's, else the globals'.
    fn pax<'a>(&'a self, pending: &'a Pending, key: &str) -> Option<&'a [u8]> {
        pending
            .pax
            .as_ref()
            .and_then(|p| p.get(key))
            .or_else(|| self.global.get(key))
            .map(Vec::as_slice)
            .filter(|v| !v.is_empty())
    }

    async fn next_entry(&mut self) -> Result<Option<TarEntry>, UdfError> {
        let mut pending = Pending::default();
        loop {
            let offset = self.offset;
            let dangling = |r: &Self, p: &Pending| {
                if p.is_empty() {
                    Ok(None)
                } else {
                    Err(r.err(TarError::Dangling { offset }))
                }
            };
            let Some(data) = offset
                .checked_add(BLOCK)
                .filter(|&end| end <= self.file.size)
            else {
                return dangling(self, &pending);
            };
            let block = self.read(offset, data).await?;
            if block.iter().all(|&b| b == 0) {
                return dangling(self, &pending);
            }
            let mut header = tar::Header::new_old();
            header.as_mut_bytes().copy_from_slice(&block);
            if !checksum_ok(&header) {
                return Err(self.err(TarError::Checksum { offset }));
            }
            let kind = header.as_bytes()[156];
            let extension = matches!(kind, b'L' | b'K' | b'x' | b'g');
            let mut size = header.entry_size().map_err(|e| {
                self.err(TarError::Field {
                    offset,
                    message: e.to_string(),
                })
            })?;
            if !extension && let Some(v) = self.pax(&pending, "size") {
                size = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| {
                        self.err(TarError::Pax {
                            offset,
                            message: format!("size {:?}", String::from_utf8_lossy(v)),
                        })
                    })?;
            }
            let own_name = header.path_bytes();
            // The member's name: a PAX `path`, a GNU long name, a global PAX
            // `path`, else the header's own (truncated when one of those exists).
            let non_empty = |v: &&Vec<u8>| !v.is_empty();
            let own_extension_name = pending
                .pax
                .as_ref()
                .and_then(|p| p.get("path"))
                .filter(non_empty)
                .map(Vec::as_slice)
                .or(pending.long_name.as_deref());
            let name_bytes = own_extension_name
                .or(self.global.get("path").filter(non_empty).map(Vec::as_slice))
                .unwrap_or(&own_name);
            // Old archives mark a directory by a NUL-type entry whose name ends
            // in `/`: the member's own name, whole (a long name's 100-byte copy
            // in the header may end in a `/` of a file's path).
            let v7_dir = kind == 0 && own_extension_name.unwrap_or(&own_name).ends_with(b"/");
            // Directories, links and devices carry no data blocks (as tarfile reads them).
            let has_data = !(v7_dir || matches!(kind, b'1'..=b'6'));
            let past_end = || {
                self.err(TarError::PastEnd {
                    offset,
                    size,
                    archive: self.file.size,
                })
            };
            let data_end = if has_data {
                data.checked_add(size)
                    .filter(|&end| end <= self.file.size)
                    .ok_or_else(past_end)?
            } else {
                data
            };
            // The data is padded to whole blocks; padding missing at the very end is the end.
            self.offset = if has_data {
                size.checked_next_multiple_of(BLOCK)
                    .and_then(|padded| data.checked_add(padded))
                    .ok_or_else(past_end)?
            } else {
                data
            };
            if extension {
                if size > MAX_EXTENSION {
                    return Err(self.err(TarError::ExtensionTooLarge { offset, size }));
                }
                let body = self.read(data, data_end).await?;
                let two = |what| self.err(TarError::TwoExtensions { what, offset });
                match kind {
                    b'L' if pending.long_name.is_some() => return Err(two("GNU long name")),
                    b'L' => pending.long_name = Some(until_nul(&body).to_vec()),
                    b'K' if pending.long_link.is_some() => return Err(two("GNU long link")),
                    b'K' => pending.long_link = Some(until_nul(&body).to_vec()),
                    b'x' if pending.pax.is_some() => return Err(two("PAX header")),
                    b'x' => pending.pax = Some(self.pax_records(offset, &body)?),
                    _ => {
                        for (k, v) in self.pax_records(offset, &body)? {
                            if v.is_empty() {
                                self.global.remove(&k);
                            } else {
                                self.global.insert(k, v);
                            }
                        }
                        let held: usize = self.global.iter().map(|(k, v)| k.len() + v.len()).sum();
                        if held as u64 > MAX_EXTENSION {
                            return Err(self.err(TarError::ExtensionTooLarge {
                                offset,
                                size: held as u64,
                            }));
                        }
                    }
                }
                continue;
            }
            let regular = matches!(kind, b'0' | b'7') || (kind == 0 && !v7_dir);
            if !regular && kind != b'S' {
                pending = Pending::default();
                continue;
            }
            let name = String::from_utf8_lossy(name_bytes).into_owned();
            if kind == b'S' {
                return Err(self.err(TarError::Sparse { name, offset }));
            }
            let member = File::member_of(&self.file, &name, data, size);
            return Ok(Some(TarEntry { name, member }));
        }
    }

    /// The records of a PAX header body (trailing NUL padding ignored).
    fn pax_records(&self, offset: u64, body: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, UdfError> {
        let end = body.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let mut records = BTreeMap::new();
        for record in tar::PaxExtensions::new(&body[..end]) {
            let bad = |message: String| self.err(TarError::Pax { offset, message });
            let record = record.map_err(|e| bad(e.to_string()))?;
            let key = record
                .key()
                .map_err(|_| bad("a key that is not UTF-8".into()))?;
            records.insert(key.to_string(), record.value_bytes().to_vec());
        }
        Ok(records)
    }
}

/// The bytes before the first NUL (GNU long names end in one).
fn until_nul(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

/// The checksum field matches the header's bytes, summed unsigned or signed
/// (old writers used signed chars), with the field itself counted as spaces.
fn checksum_ok(header: &tar::Header) -> bool {
    let Ok(want) = header.cksum() else {
        return false;
    };
    let bytes = header.as_bytes();
    let others = bytes[..148].iter().chain(&bytes[156..]);
    let unsigned: u32 = others.clone().map(|&b| u32::from(b)).sum::<u32>() + 8 * 32;
    let signed: i64 = others.map(|&b| i64::from(b as i8)).sum::<i64>() + 8 * 32;
    want == unsigned || i64::from(want) == signed
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use futures::TryStreamExt;
    use proptest::prelude::*;

    use super::*;
    use crate::test_source::MemorySource;

    /// Each member's name and data.
    type Members = Vec<(String, Vec<u8>)>;

    /// The entries of `bytes` with each member's data, and the reads it took.
    fn entries(bytes: &[u8]) -> (Result<Members, UdfError>, usize) {
        let source = MemorySource::new(bytes.to_vec());
        let file = source.file();
        let got = source.run(async move {
            let entries: Vec<TarEntry> = tar_entries(file).try_collect().await?;
            let mut out = Vec::new();
            for e in entries {
                assert_eq!(e.member.member().map(|m| m.name), Some(e.name.clone()));
                out.push((e.name, e.member.read().await?.to_vec()));
            }
            Ok(out)
        });
        (got, source.reads())
    }

    fn header(kind: u8, name: &str, size: u64) -> tar::Header {
        let mut h = tar::Header::new_ustar();
        // The type byte and the name written as is (NUL type, a trailing `/` kept).
        h.as_mut_bytes()[156] = kind;
        h.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        h
    }

    fn pax_body(records: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        b.append_pax_extensions(records.iter().map(|(k, v)| (*k, v.as_bytes())))
            .expect("pax");
        // The builder wrote a header block and the padded body: the body's records.
        let bytes = b.into_inner().expect("tar");
        let size = tar::Header::from_byte_slice(&bytes[..512])
            .entry_size()
            .expect("size") as usize;
        bytes[512..512 + size].to_vec()
    }

    /// `entries` as raw blocks: each (header, data) padded to 512.
    fn archive(entries: &[(tar::Header, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (h, data) in entries {
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(data);
            out.resize(out.len().next_multiple_of(512), 0);
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    /// A GNU base-256 size of 2^64 - 512 is an error: `data + size` must not
    /// wrap, which would make the walk loop on one header forever.
    #[test]
    fn gnu_base256_size_near_u64_max_is_an_error_not_a_hang() {
        let mut h = tar::Header::new_gnu();
        h.set_path("big.bin").expect("path");
        h.set_mode(0o644);
        h.set_size(u64::MAX - 511);
        h.set_cksum();
        assert_eq!(h.as_bytes()[124] & 0x80, 0x80, "base-256 size field");
        let mut bytes = h.as_bytes().to_vec();
        bytes.resize(2048, 0);
        let (got, reads) = entries(&bytes);
        let err = got.expect_err("no member can be that large").to_string();
        assert!(
            err.contains("past the end") && err.contains("at byte 0"),
            "{err}"
        );
        assert_eq!(reads, 1, "one header read, then the error");
    }

    #[test]
    fn pax_path_size_and_global_headers_are_honoured() {
        let long = format!("{}/é✓-sample.json", "deep/".repeat(30));
        let global = pax_body(&[("comment", "made by a test")]);
        // A local PAX `size` (7) overrides the header's (0).
        let local = pax_body(&[("path", &long), ("size", "7")]);
        let glob = pax_body(&[("path", "from/global.txt")]);
        let bytes = archive(&[
            (
                header(b'g', "pax_global_header", global.len() as u64),
                global,
            ),
            (header(b'x', "PaxHeaders/trunc", local.len() as u64), local),
            (header(b'0', "trunc.json", 0), b"{\"a\":1}".to_vec()),
            (header(b'0', "plain.txt", 2), b"hi".to_vec()),
            (header(b'g', "pax_global_header", glob.len() as u64), glob),
            (header(b'0', "ignored-name.txt", 3), b"abc".to_vec()),
            (header(b'5', "dir/", 0), Vec::new()),
            (header(b'2', "link", 0), Vec::new()),
            (header(0, "old-style-dir/", 0), Vec::new()),
        ]);
        let (got, _) = entries(&bytes);
        assert_eq!(
            got.expect("a valid archive"),
            vec![
                (long, b"{\"a\":1}".to_vec()),
                ("plain.txt".to_string(), b"hi".to_vec()),
                ("from/global.txt".to_string(), b"abc".to_vec()),
            ]
        );
    }

    #[test]
    fn gnu_long_names_and_ustar_prefixes() {
        let long = format!("{}/0001.jpg", "x".repeat(150));
        let prefixed = format!("{}/{}", "p".repeat(120), "name.txt");
        let mut b = tar::Builder::new(Vec::new());
        for (name, gnu) in [(&long, true), (&prefixed, false)] {
            let mut h = if gnu {
                tar::Header::new_gnu()
            } else {
                tar::Header::new_ustar()
            };
            h.set_size(4);
            h.set_mode(0o644);
            b.append_data(&mut h, name, &b"data"[..]).expect("append");
        }
        let bytes = b.into_inner().expect("tar");
        let (got, _) = entries(&bytes);
        assert_eq!(
            got.expect("valid"),
            vec![(long, b"data".to_vec()), (prefixed, b"data".to_vec())]
        );
    }

    #[test]
    fn corrupt_headers_are_clear_errors() {
        let mut bad_sum = header(b'0', "a.txt", 1);
        bad_sum.as_mut_bytes()[0] = b'b';
        let (got, _) = entries(&archive(&[(bad_sum, b"x".to_vec())]));
        assert!(got.expect_err("checksum").to_string().contains("checksum"));
        let x = header(b'x', "PaxHeaders/a", 4);
        let (got, _) = entries(&archive(&[(x, b"junk".to_vec())]));
        assert!(got.expect_err("pax").to_string().contains("bad PAX record"));
        let x = header(b'L', "././@LongLink", 2);
        let (got, _) = entries(&archive(&[(x, b"a\0".to_vec())]));
        assert!(
            got.expect_err("dangling")
                .to_string()
                .contains("describe no member")
        );
        let big = header(b'x', "PaxHeaders/a", MAX_EXTENSION + 1);
        let mut bytes = big.as_bytes().to_vec();
        bytes.resize(512 + MAX_EXTENSION as usize + 1024, 0);
        let (got, reads) = entries(&bytes);
        assert!(got.expect_err("too large").to_string().contains("at most"));
        assert_eq!(reads, 1, "the oversized body is never read");
    }

    /// Regular entries as the `tar` crate's own reader sees them.
    fn tar_crate_entries(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = tar::Archive::new(bytes);
        let mut out = Vec::new();
        for e in archive.entries().expect("entries") {
            let mut e = e.expect("entry");
            if e.header().entry_type().is_file() {
                let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
                let mut data = Vec::new();
                e.read_to_end(&mut data).expect("data");
                out.push((name, data));
            }
        }
        out
    }

    fn name_strategy() -> impl Strategy<Value = String> {
        let segment = proptest::string::string_regex("[a-zA-Z0-9_é✓ -]{1,40}").expect("regex");
        (proptest::collection::vec(segment, 1..5), "[a-z]{1,4}")
            .prop_map(|(segs, ext)| format!("{}.{ext}", segs.join("/")))
    }

    #[derive(Debug, Clone, Copy)]
    enum Format {
        Gnu,
        Ustar,
        Pax,
    }

    fn build(members: &[(String, Vec<u8>, Format)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data, format) in members {
            let mut h = match format {
                Format::Gnu => tar::Header::new_gnu(),
                _ => tar::Header::new_ustar(),
            };
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if let Format::Pax = format {
                b.append_pax_extensions([("path", name.as_bytes())])
                    .expect("pax");
                h.set_path("short").expect("path");
                h.set_cksum();
                b.append(&h, data.as_slice()).expect("append");
            } else {
                b.append_data(&mut h, name, data.as_slice())
                    .expect("append");
            }
        }
        b.into_inner().expect("tar")
    }

    fn members_strategy() -> impl Strategy<Value = Vec<(String, Vec<u8>, Format)>> {
        let format = prop_oneof![Just(Format::Gnu), Just(Format::Ustar), Just(Format::Pax)];
        proptest::collection::vec(
            (
                name_strategy(),
                proptest::collection::vec(any::<u8>(), 0..1200),
                format,
            ),
            0..6,
        )
    }

    /// A GNU member whose 136-byte name (non-ASCII, with spaces) needs a long
    /// name entry: found by `reads_what_the_tar_crate_writes`.
    #[test]
    fn a_long_non_ascii_gnu_name_reads_back() {
        let name = "✓A0éAAa0aa_A✓é éa0aa0aAAaéaaa_aaAa_ AA/-u ✓ -M_✓Eé ✓-✓é✓é5é_ 2 cé2p4vWVNk4 -/Mabé Qw✓hzPé12g9éf2fjnCe-L5.skc".to_string();
        let data: Vec<u8> = (0..543u32).map(|i| (i * 7 + 3) as u8).collect();
        let bytes = build(&[(name.clone(), data.clone(), Format::Gnu)]);
        let (got, _) = entries(&bytes);
        assert_eq!(got.expect("a valid archive"), vec![(name, data)]);
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 64,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Archives the `tar` crate writes (GNU long names, ustar prefixes,
        /// PAX paths) read back as the `tar` crate reads them.
        #[test]
        fn reads_what_the_tar_crate_writes(members in members_strategy()) {
            let bytes = build(&members);
            let (got, _) = entries(&bytes);
            let got = got.expect("a valid archive");
            prop_assert_eq!(&got, &tar_crate_entries(&bytes));
            let want: Vec<_> = members.iter().map(|(n, d, _)| (n.clone(), d.clone())).collect();
            prop_assert_eq!(got, want);
        }

        /// Any bytes: a result or an error, after at most two reads per block.
        #[test]
        fn arbitrary_bytes_end_in_bounded_reads(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let (_, reads) = entries(&bytes);
            prop_assert!(reads <= 2 * (bytes.len() / 512 + 1), "{} reads", reads);
        }

        /// A valid archive with bytes changed in its headers (checksums fixed
        /// or not): a result or an error; every member lies inside the archive.
        #[test]
        fn mutated_archives_end_in_bounded_reads(
            members in members_strategy(),
            edits in proptest::collection::vec((any::<usize>(), 0usize..512, any::<u8>(), any::<bool>()), 1..8),
        ) {
            let mut bytes = build(&members);
            let blocks = bytes.len() / 512;
            for (block, at, value, fix) in edits {
                let start = (block % blocks) * 512;
                bytes[start + at] = value;
                if fix {
                    let mut h = tar::Header::new_old();
                    h.as_mut_bytes().copy_from_slice(&bytes[start..start + 512]);
                    h.set_cksum();
                    bytes[start..start + 512].copy_from_slice(h.as_bytes());
                }
            }
            let (got, reads) = entries(&bytes);
            prop_assert!(reads <= 2 * (bytes.len() / 512 + 1), "{} reads", reads);
            if let Ok(got) = got {
                let total: usize = got.iter().map(|(_, d)| d.len()).sum();
                prop_assert!(total <= bytes.len());
            }
        }
    }
}
