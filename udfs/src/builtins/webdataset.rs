//! `webdataset_samples`: the samples of a WebDataset shard, grouped as the
//! Python `webdataset` library groups them (`tariterators.py`), so a shard
//! its `TarWriter` wrote gives the same samples, keys and members here.
//!
//! Guarantees:
//! - members are the tar archive's regular members in archive order (see
//!   `tar.rs`: PAX and GNU long names, so keys longer than 100 bytes and
//!   unicode keys come back whole);
//! - a member's key is its name up to the first `.` of its last path segment
//!   (`base_plus_ext`: `s/0001.seg.png` is key `s/0001`, suffix `seg.png`; a
//!   last segment starting with `.` takes the directory as its key when the
//!   segment before it has no `.`); a name with no such `.` has no key and is
//!   skipped, and so are metadata members whose first path segment is
//!   `__..__`;
//! - consecutive members with equal keys form one sample; two members of one
//!   sample with the same (lower-cased) suffix are an error, as in Python;
//! - [`Grouper`] holds one sample at a time, so memory is bounded by the
//!   largest sample, not by the shard.

use std::collections::HashSet;

use futures::Stream;
use serde::{Deserialize, Serialize};

use crate::builtins::tar::{TarEntry, tar_entries};
use crate::error::UdfError;
use crate::file::File;

/// One WebDataset sample: the consecutive members of a tar shard sharing a
/// key, e.g. `s/0001.jpg` and `s/0001.cls` form sample `s/0001`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// The members' shared key (`s/0001`).
    pub key: String,
    /// The members, in archive order.
    pub members: Vec<File>,
    /// The name of each member inside the archive (`names[i]` is `members[i]`'s).
    pub names: Vec<String>,
}

/// Two members of one sample share a suffix.
#[derive(Debug, thiserror::Error)]
#[error("duplicate member {name:?} in WebDataset sample {key:?} (suffix {suffix:?} seen twice)")]
pub struct DuplicateSuffix {
    /// The sample's key.
    pub key: String,
    /// The second member's name.
    pub name: String,
    /// The suffix both members have.
    pub suffix: String,
}

/// The key and suffix of a member name (`base_plus_ext`), `None` when the
/// name has no key.
pub fn key_and_suffix(name: &str) -> Option<(&str, &str)> {
    let segment = name.rfind('/').map_or(0, |i| i + 1);
    let dot = name[segment..].find('.')?;
    if dot == 0 {
        // The key must end in a run of non-dots: the directory part, whose
        // last segment (with its `/`) then holds no `.`.
        let dir = name[..segment].strip_suffix('/')?;
        let before = &dir[dir.rfind('/').map_or(0, |i| i + 1)..];
        if before.contains('.') {
            return None;
        }
    }
    Some((&name[..segment + dot], &name[segment + dot + 1..]))
}

/// A metadata member (`__meta__`, `__x__/...`): skipped by WebDataset readers.
fn is_meta(name: &str) -> bool {
    let first = name.split('/').next().unwrap_or(name);
    first.len() >= 4 && first.starts_with("__") && first.ends_with("__")
}

/// Groups tar entries into samples, one sample held at a time.
#[derive(Debug, Default)]
pub struct Grouper {
    current: Option<Sample>,
    suffixes: HashSet<String>,
}

impl Grouper {
    /// Adds the next entry; returns the sample it completes, if any.
    pub fn push(&mut self, entry: TarEntry) -> Result<Option<Sample>, DuplicateSuffix> {
        if is_meta(&entry.name) {
            return Ok(None);
        }
        let Some((key, suffix)) = key_and_suffix(&entry.name) else {
            return Ok(None);
        };
        let suffix = suffix.to_lowercase();
        let done = match &self.current {
            Some(s) if s.key == key => None,
            _ => {
                self.suffixes.clear();
                self.current.replace(Sample {
                    key: key.to_string(),
                    members: Vec::new(),
                    names: Vec::new(),
                })
            }
        };
        let Some(sample) = self.current.as_mut() else {
            return Ok(done);
        };
        if !self.suffixes.insert(suffix.clone()) {
            return Err(DuplicateSuffix {
                key: sample.key.clone(),
                name: entry.name,
                suffix,
            });
        }
        sample.members.push(entry.member);
        sample.names.push(entry.name);
        Ok(done)
    }

    /// The last sample, once the entries are exhausted.
    pub fn finish(self) -> Option<Sample> {
        self.current
    }
}

/// The samples of a WebDataset shard: consecutive tar members grouped by key.
pub fn webdataset_samples(
    file: File,
) -> impl Stream<Item = Result<Sample, UdfError>> + Send + 'static {
    use futures::StreamExt;
    let url = file.url();
    let entries = tar_entries(file).boxed();
    futures::stream::try_unfold(Some((entries, Grouper::default())), move |state| {
        let url = url.clone();
        async move {
            let Some((mut entries, mut grouper)) = state else {
                return Ok(None);
            };
            while let Some(entry) = entries.next().await.transpose()? {
                let done = grouper.push(entry).map_err(|e| UdfError::Read {
                    url: url.clone(),
                    source: Box::new(e),
                })?;
                if let Some(sample) = done {
                    return Ok(Some((sample, Some((entries, grouper)))));
                }
            }
            Ok(grouper.finish().map(|s| (s, None)))
        }
    })
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt;
    use proptest::prelude::*;

    use super::*;
    use crate::test_source::MemorySource;

    /// Python webdataset's `base_plus_ext`, verbatim.
    fn python_base_plus_ext(name: &str) -> Option<(String, String)> {
        let re = regex::Regex::new(r"^((?:.*/|)[^.]+)[.]([^/]*)$").expect("regex");
        let c = re.captures(name)?;
        Some((c[1].to_string(), c[2].to_string()))
    }

    #[test]
    fn keys_as_python_webdataset_splits_them() {
        for (name, want) in [
            ("s/0001.jpg", Some(("s/0001", "jpg"))),
            ("s/0001.seg.png", Some(("s/0001", "seg.png"))),
            ("a.b/c.d", Some(("a.b/c", "d"))),
            ("a/.b", Some(("a/", "b"))),
            ("x.y/.b", None),
            (".hidden", None),
            ("noext", None),
            ("dir.d/noext", None),
            ("/.c", Some(("/", "c"))),
            ("a//.b", Some(("a//", "b"))),
        ] {
            assert_eq!(key_and_suffix(name), want, "{name}");
            let py = python_base_plus_ext(name);
            assert_eq!(
                key_and_suffix(name),
                py.as_ref().map(|(k, s)| (k.as_str(), s.as_str())),
                "{name}"
            );
        }
    }

    fn entry(name: &str) -> TarEntry {
        let parent = File {
            path: "s.tar".into(),
            size: 1 << 20,
            ..File::default()
        };
        TarEntry {
            name: name.to_string(),
            member: File::member_of(&parent, name, 512, 1),
        }
    }

    #[test]
    fn grouping_skips_meta_and_keyless_members_and_rejects_duplicates() {
        let mut g = Grouper::default();
        let mut samples = Vec::new();
        for name in [
            "__meta__",
            "__x__/a.txt",
            "a.jpg",
            "a.CLS",
            "README",
            "b.jpg",
        ] {
            samples.extend(g.push(entry(name)).expect("no duplicate"));
        }
        samples.extend(g.finish());
        let got: Vec<_> = samples
            .iter()
            .map(|s| (s.key.as_str(), s.names.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", vec!["a.jpg".to_string(), "a.CLS".to_string()]),
                ("b", vec!["b.jpg".to_string()]),
            ]
        );
        let mut g = Grouper::default();
        g.push(entry("k.txt")).expect("first");
        let err = g
            .push(entry("k.TXT"))
            .expect_err("same suffix, lower-cased");
        assert!(err.to_string().contains("duplicate member"), "{err}");
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// `key_and_suffix` is Python's regex, for any name without a newline.
        #[test]
        fn key_and_suffix_is_the_python_pattern(name in "[a-c./_é]{0,12}") {
            let py = python_base_plus_ext(&name);
            prop_assert_eq!(key_and_suffix(&name), py.as_ref().map(|(k, s)| (k.as_str(), s.as_str())));
        }

        /// Grouping any names: an error for a duplicate suffix, or samples
        /// that hold every keyed member once, in order, with distinct
        /// consecutive keys.
        #[test]
        fn grouping_keeps_every_keyed_member_in_order(names in proptest::collection::vec("(__m__/)?[ab]{1,2}(/[ab])?\\.[xyXY]{0,2}|README", 0..24)) {
            let mut g = Grouper::default();
            let mut samples = Vec::new();
            for n in &names {
                match g.push(entry(n)) {
                    Ok(done) => samples.extend(done),
                    Err(_) => return Ok(()),
                }
            }
            samples.extend(g.finish());
            let keyed: Vec<&String> = names.iter().filter(|n| !is_meta(n) && key_and_suffix(n).is_some()).collect();
            let grouped: Vec<&String> = samples.iter().flat_map(|s| &s.names).collect();
            prop_assert_eq!(keyed, grouped);
            for pair in samples.windows(2) {
                prop_assert_ne!(&pair[0].key, &pair[1].key);
            }
            for s in &samples {
                prop_assert_eq!(s.names.len(), s.members.len());
                for n in &s.names {
                    prop_assert_eq!(key_and_suffix(n).map(|(k, _)| k), Some(s.key.as_str()));
                }
            }
        }

        /// Any bytes as a shard: samples or an error, never a hang.
        #[test]
        fn arbitrary_shards_end(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
            let source = MemorySource::new(bytes.clone());
            let file = source.file();
            let _ = source.run(webdataset_samples(file).try_collect::<Vec<_>>());
            prop_assert!(source.reads() <= 2 * (bytes.len() / 512 + 1));
        }
    }
}
