//! Regular-expression subscriptions (KIP-848): the coordinator, not the client, turns a
//! member's pattern into topics, and the group shares one resolution per pattern.
//!
//! Kafka compiles patterns with RE2/J; the `regex` crate reads the same RE2 syntax, with these
//! differences: `\Q...\E` quoting and the Unicode general categories (`\p{L}` and the like) are
//! refused here as invalid, and RE2/J's possessive forms are refused by both.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use regex::Regex;
use tokio::time::Instant;

use super::TopicsView;

/// How often a group's patterns are matched against the topics again, so that new topics are
/// picked up: Kafka's REGEX_BATCH_REFRESH_INTERVAL_MS.
pub(super) const REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// A compiled pattern may not grow past this (the pattern comes from the network).
const COMPILED_SIZE_LIMIT: usize = 1 << 20;

/// Compiles a subscription pattern; it must match a topic's whole name, as RE2/J's
/// `matches()` does.
pub(super) fn compile(pattern: &str) -> Result<Regex, String> {
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(COMPILED_SIZE_LIMIT)
        .build()
        .map_err(|e| e.to_string())
}

/// The topics each pattern of a group's members resolved to, and when they were resolved.
#[derive(Debug, Default)]
pub(super) struct Resolutions {
    by_pattern: BTreeMap<String, BTreeSet<String>>,
    refreshed: Option<Instant>,
}

impl Resolutions {
    /// The topics `pattern` resolved to (none until it is resolved).
    pub(super) fn topics<'a>(&'a self, pattern: &str) -> impl Iterator<Item = &'a String> + 'a {
        self.by_pattern.get(pattern).into_iter().flatten()
    }

    /// Resolves the patterns in use when one of them is new or the last pass is older than
    /// [`REFRESH_INTERVAL`], and forgets the ones no member uses. Whether any pattern's topics
    /// changed.
    pub(super) fn refresh<'a>(
        &mut self,
        in_use: impl Iterator<Item = &'a str>,
        topics: &dyn TopicsView,
        now: Instant,
    ) -> bool {
        let in_use: BTreeSet<&str> = in_use.collect();
        let before = self.by_pattern.len();
        self.by_pattern.retain(|p, _| in_use.contains(p.as_str()));
        let mut changed = self.by_pattern.len() != before;
        let unresolved = in_use.iter().any(|p| !self.by_pattern.contains_key(*p));
        let stale = self.refreshed.is_none_or(|t| now.duration_since(t) >= REFRESH_INTERVAL);
        if in_use.is_empty() || !(unresolved || stale) {
            return changed;
        }
        let compiled: Vec<(&str, Regex)> = in_use.iter().filter_map(|p| Some((*p, compile(p).ok()?))).collect();
        let mut fresh: BTreeMap<String, BTreeSet<String>> =
            in_use.iter().map(|p| (p.to_string(), BTreeSet::new())).collect();
        for name in topics.names() {
            for (p, re) in &compiled {
                if re.is_match(&name) {
                    if let Some(set) = fresh.get_mut(*p) {
                        set.insert(name.clone());
                    }
                }
            }
        }
        changed |= fresh != self.by_pattern;
        self.by_pattern = fresh;
        self.refreshed = Some(now);
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_whole_names_and_bad_ones_are_refused() {
        let re = compile("orders-.*").unwrap();
        assert!(re.is_match("orders-eu"));
        assert!(!re.is_match("old-orders-eu"), "RE2/J's matches() is anchored at both ends");
        assert!(compile("a|b").unwrap().is_match("b"));
        assert!(!compile("a|b").unwrap().is_match("ab"));
        assert!(compile("(unclosed").is_err());
        assert!(compile("x{1000}{1000}").is_err(), "bounded");
    }
}
