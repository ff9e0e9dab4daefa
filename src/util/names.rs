//! Closest-name suggestions: the candidate within a small edit distance of a
//! misspelled name (case-insensitive), or none when nothing is close.

/// The candidate closest to `name` by edit distance, if close enough to be a typo.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let distance = |a: &str, b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, cb) in b.iter().enumerate() {
                cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    };
    candidates
        .into_iter()
        .map(|c| (distance(&name.to_lowercase(), &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= (name.len() / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn suggests_a_close_name_and_nothing_for_a_far_one() {
        let names = ["prefetch", "parallel", "cache"];
        assert_eq!(closest("prefech", names), Some("prefetch"));
        assert_eq!(closest("CACHE", names), Some("cache"));
        assert_eq!(closest("zzzzzzzz", names), None);
        assert_eq!(closest("x", []), None);
    }
}
