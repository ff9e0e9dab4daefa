//! `tar_members`: a generator expanding a tar archive into one virtual `File`
//! per regular member, reading only the 512-byte headers (by range), so with
//! prefetch the archive is read from its local copy and without it only the
//! headers cross the network. Members are then read by range of the parent.
//!
//! Understands ustar (with its name prefix) and GNU long names (`L` entries);
//! other entry types (directories, links, pax headers) are skipped.

use futures::Stream;

use crate::error::UdfError;
use crate::file::File;

const BLOCK: u64 = 512;

/// The regular members of the tar archive `file`, in archive order.
pub fn tar_members(file: File) -> impl Stream<Item = Result<File, UdfError>> + Send + 'static {
    futures::stream::try_unfold(
        (file, 0u64, None::<String>),
        |(file, mut offset, mut long_name)| async move {
            loop {
                if offset + BLOCK > file.size {
                    return Ok(None);
                }
                let header = file.read_range(offset..offset + BLOCK).await?;
                if header.iter().all(|&b| b == 0) {
                    return Ok(None); // end-of-archive marker
                }
                let bad = |what: &str| UdfError::Read {
                    url: file.url(),
                    source: format!("not a tar archive: {what} at byte {offset}").into(),
                };
                let size = octal(&header[124..136]).ok_or_else(|| bad("bad size field"))?;
                let data = offset + BLOCK;
                let next = data + size.div_ceil(BLOCK) * BLOCK;
                if data + size > file.size {
                    return Err(bad("member past the end"));
                }
                match header[156] {
                    b'L' => {
                        let name = file.read_range(data..data + size).await?;
                        long_name = Some(cstr(&name));
                        offset = next;
                    }
                    b'0' | 0 => {
                        let name = long_name.take().unwrap_or_else(|| ustar_name(&header));
                        let member = File::member_of(&file, &name, data, size);
                        return Ok(Some((member, (file, next, None))));
                    }
                    _ => {
                        long_name = None;
                        offset = next;
                    }
                }
            }
        },
    )
}

fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn ustar_name(header: &[u8]) -> String {
    let name = cstr(&header[0..100]);
    let is_ustar = &header[257..262] == b"ustar";
    let prefix = if is_ustar {
        cstr(&header[345..500])
    } else {
        String::new()
    };
    if prefix.is_empty() {
        name
    } else {
        format!("{prefix}/{name}")
    }
}

/// Parses a NUL/space-terminated octal field (or GNU base-256 for large sizes).
fn octal(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        return Some(
            field[1..]
                .iter()
                .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)),
        );
    }
    let text = std::str::from_utf8(field).ok()?;
    let digits = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, 8).ok()
}

/// One WebDataset sample: the members of a tar shard sharing a key (the member
/// name up to the first `.` of its last path segment), e.g. `s/0001.jpg` and
/// `s/0001.cls` form sample `s/0001`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    pub key: String,
    pub members: Vec<File>,
}

/// The samples of a WebDataset shard: consecutive tar members grouped by key.
pub fn webdataset_samples(
    file: File,
) -> impl Stream<Item = Result<Sample, UdfError>> + Send + 'static {
    use futures::StreamExt;
    let members = tar_members(file).boxed();
    futures::stream::try_unfold(
        (members, None::<File>),
        |(mut members, mut pending)| async move {
            let mut sample: Option<Sample> = None;
            loop {
                let next = match pending.take() {
                    Some(m) => Some(m),
                    None => members.next().await.transpose()?,
                };
                let Some(member) = next else {
                    return Ok(sample.map(|s| (s, (members, None))));
                };
                let key = sample_key(&member);
                match &mut sample {
                    Some(s) if s.key == key => s.members.push(member),
                    Some(_) => return Ok(sample.map(|s| (s, (members, Some(member))))),
                    None => {
                        sample = Some(Sample {
                            key,
                            members: vec![member],
                        })
                    }
                }
            }
        },
    )
}

fn sample_key(member: &File) -> String {
    let name = member
        .member()
        .map(|m| m.name)
        .unwrap_or_else(|| member.path.clone());
    let (dir, base) = match name.rsplit_once('/') {
        Some((d, b)) => (Some(d), b),
        None => (None, name.as_str()),
    };
    let stem = base.split('.').next().unwrap_or(base);
    match dir {
        Some(d) => format!("{d}/{stem}"),
        None => stem.to_string(),
    }
}
