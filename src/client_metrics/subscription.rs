//! Client-metrics subscriptions (KIP-714's CLIENT_METRICS config resource, Kafka's
//! `ClientMetricsConfigs`): which metric name prefixes the matching clients push, and how often.
//!
//! A subscription has three keys, all optional: `metrics` (a comma-separated list of prefixes;
//! `*` or a lone empty string subscribes every metric), `interval.ms` (100 to 3,600,000, default
//! 300,000) and `match` (comma-separated `selector=regex` pairs, all of which must match the
//! client; none matches every client). Validation refuses what Kafka refuses, with its error
//! codes: an unknown key or an interval out of bounds is INVALID_REQUEST, a value of the wrong
//! type or an illegal match pattern INVALID_CONFIG.
//!
//! Regular expressions: Kafka 4.x compiles new patterns with RE2/J (earlier versions, and
//! patterns stored by them, with `java.util.regex`) and requires the whole value to match;
//! here they are compiled with the `regex` crate, whose syntax is RE2's, anchored at both ends.
//! What only `java.util.regex` accepts (look-around, back-references, possessive quantifiers)
//! is refused as Kafka 4.x refuses a new such pattern, rather than matched differently.

use std::collections::BTreeMap;

use regex::Regex;

use crate::protocol::{ApiError, ErrorCode};

pub const METRICS: &str = "metrics";
pub const INTERVAL_MS: &str = "interval.ms";
pub const MATCH: &str = "match";
pub const KEYS: &[&str] = &[METRICS, INTERVAL_MS, MATCH];

/// Kafka's `ClientMetricsConfigs.INTERVAL_MS_DEFAULT` and its bounds.
pub const INTERVAL_MS_DEFAULT: i32 = 5 * 60 * 1000;
const MIN_INTERVAL_MS: i32 = 100;
const MAX_INTERVAL_MS: i32 = 3_600_000;

/// The metrics entry that subscribes every metric.
pub const ALL_METRICS: &str = "*";

/// The client attributes a `match` selector may name (Kafka's `ALLOWED_MATCH_PARAMS`).
pub const CLIENT_INSTANCE_ID: &str = "client_instance_id";
pub const CLIENT_ID: &str = "client_id";
pub const CLIENT_SOFTWARE_NAME: &str = "client_software_name";
pub const CLIENT_SOFTWARE_VERSION: &str = "client_software_version";
pub const CLIENT_SOURCE_ADDRESS: &str = "client_source_address";
pub const CLIENT_SOURCE_PORT: &str = "client_source_port";
const SELECTORS: &[&str] = &[
    CLIENT_INSTANCE_ID,
    CLIENT_ID,
    CLIENT_SOFTWARE_NAME,
    CLIENT_SOFTWARE_VERSION,
    CLIENT_SOURCE_ADDRESS,
    CLIENT_SOURCE_PORT,
];

/// A validated subscription, ready to match clients.
#[derive(Debug, Clone)]
pub struct Subscription {
    pub name: String,
    pub metrics: Vec<String>,
    pub interval_ms: i32,
    /// Selector name to its anchored pattern; every one must match.
    pub patterns: Vec<(String, Regex)>,
}

/// What a client told the broker about itself, as KIP-714's selectors see it.
#[derive(Debug, Clone, Default)]
pub struct ClientAttributes {
    pub client_instance_id: String,
    pub client_id: String,
    pub software_name: Option<String>,
    pub software_version: Option<String>,
    pub source_address: String,
    pub source_port: Option<u16>,
}

impl ClientAttributes {
    fn get(&self, selector: &str) -> Option<String> {
        match selector {
            CLIENT_INSTANCE_ID => Some(self.client_instance_id.clone()),
            CLIENT_ID => Some(self.client_id.clone()),
            CLIENT_SOFTWARE_NAME => self.software_name.clone(),
            CLIENT_SOFTWARE_VERSION => self.software_version.clone(),
            CLIENT_SOURCE_ADDRESS => Some(self.source_address.clone()),
            CLIENT_SOURCE_PORT => self.source_port.map(|p| p.to_string()),
            _ => None,
        }
    }
}

impl Subscription {
    /// Kafka's `isMatch`: no pattern matches every client; otherwise each selector's attribute
    /// must be known and match its pattern whole.
    pub fn matches(&self, client: &ClientAttributes) -> bool {
        self.patterns.iter().all(|(selector, re)| client.get(selector).is_some_and(|v| re.is_match(&v)))
    }
}

/// Kafka's LIST parsing: comma-separated, each item trimmed; an empty value is no item.
pub fn list(value: &str) -> Vec<String> {
    if value.trim().is_empty() {
        return Vec::new();
    }
    value.split(',').map(|s| s.trim().to_string()).collect()
}

/// Kafka's `ConfigType` of each key, for DescribeConfigs v3+ (INT 3, LIST 7).
pub fn config_type(key: &str) -> i8 {
    match key {
        INTERVAL_MS => 3,
        _ => 7,
    }
}

/// The value a key has when the subscription does not set it.
pub fn default_value(key: &str) -> String {
    match key {
        INTERVAL_MS => INTERVAL_MS_DEFAULT.to_string(),
        _ => String::new(),
    }
}

fn illegal_pattern(pattern: &str) -> ApiError {
    ApiError::new(ErrorCode::InvalidConfig, format!("Illegal client matching pattern: {pattern}"))
}

/// Kafka's `parseMatchingPatterns` (4.x): `selector=regex`, split at the first '=' (the
/// expression may hold more), both sides trimmed; the expression in RE2 syntax, which the
/// `regex` crate shares.
pub fn parse_patterns(patterns: &[String]) -> Result<Vec<(String, Regex)>, ApiError> {
    let mut out: Vec<(String, Regex)> = Vec::new();
    for pattern in patterns {
        let Some((selector, value)) = pattern.split_once('=') else { return Err(illegal_pattern(pattern)) };
        let (selector, value) = (selector.trim(), value.trim());
        if !SELECTORS.contains(&selector) {
            return Err(illegal_pattern(pattern));
        }
        let re = Regex::new(&format!("^(?:{value})$")).map_err(|e| {
            let why = e.to_string();
            let why = why.lines().last().unwrap_or_default().trim().to_string();
            ApiError::new(
                ErrorCode::InvalidConfig,
                format!("Client match pattern `{selector}={value}` is not a valid regular expression: {why}."),
            )
        })?;
        // A later pattern for the same selector replaces the earlier one, as Kafka's map does.
        out.retain(|(s, _)| s != selector);
        out.push((selector.to_string(), re));
    }
    Ok(out)
}

/// A list key's items; Kafka refuses a list with an item twice (`ValidList.anyNonDuplicateValues`).
fn unique_list(key: &str, value: Option<&String>) -> Result<Vec<String>, ApiError> {
    let items = value.map(|v| list(v)).unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    if items.iter().any(|i| !seen.insert(i)) {
        return Err(ApiError::new(
            ErrorCode::InvalidConfig,
            format!("Configuration '{key}' values must not be duplicated."),
        ));
    }
    Ok(items)
}

/// Kafka's `ClientMetricsConfigs.validate` and the parse that follows it: the subscription the
/// configs describe, or the error Kafka answers with.
pub fn parse(name: &str, configs: &BTreeMap<String, String>) -> Result<Subscription, ApiError> {
    if name.is_empty() {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "Subscription name can't be empty"));
    }
    if let Some(key) = configs.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(ApiError::new(ErrorCode::InvalidRequest, format!("Unknown client metrics configuration: {key}")));
    }
    let interval_ms = match configs.get(INTERVAL_MS) {
        None => INTERVAL_MS_DEFAULT,
        Some(v) => {
            let ms: i32 = v.trim().parse().map_err(|_| {
                ApiError::new(
                    ErrorCode::InvalidConfig,
                    format!("Invalid value {v} for configuration {INTERVAL_MS}: Not a number of type INT"),
                )
            })?;
            if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&ms) {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("Invalid value {ms} for {INTERVAL_MS}, interval must be between 100 and 3600000 (1 hour)"),
                ));
            }
            ms
        }
    };
    let metrics = unique_list(METRICS, configs.get(METRICS))?;
    let patterns = parse_patterns(&unique_list(MATCH, configs.get(MATCH))?)?;
    Ok(Subscription { name: name.to_string(), metrics, interval_ms, patterns })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn code(r: Result<Subscription, ApiError>) -> i16 {
        r.err().map(|e| e.code).unwrap_or(0)
    }

    #[test]
    fn keys_and_bounds_are_kafkas() {
        let s = parse("s", &configs(&[])).unwrap();
        assert_eq!((s.interval_ms, s.metrics.len(), s.patterns.len()), (300_000, 0, 0));
        let s =
            parse("s", &configs(&[("metrics", "org.apache.kafka.producer., a.b "), ("interval.ms", "100")])).unwrap();
        assert_eq!(s.metrics, vec!["org.apache.kafka.producer.", "a.b"]);
        assert_eq!(s.interval_ms, 100);
        assert!(parse("s", &configs(&[("interval.ms", "3600000")])).is_ok());
        let invalid_request = ErrorCode::InvalidRequest.code();
        let invalid_config = ErrorCode::InvalidConfig.code();
        assert_eq!(code(parse("", &configs(&[]))), invalid_request);
        assert_eq!(code(parse("s", &configs(&[("interval.ms", "99")]))), invalid_request);
        assert_eq!(code(parse("s", &configs(&[("interval.ms", "3600001")]))), invalid_request);
        assert_eq!(code(parse("s", &configs(&[("bogus", "1")]))), invalid_request);
        assert_eq!(code(parse("s", &configs(&[("interval.ms", "soon")]))), invalid_config);
        for bad in
            ["client_id", "nobody=x", "client_id=(", "client_id=(?=a)", "client_id=(a)\\1", "client_id=a,client_id=a"]
        {
            assert_eq!(code(parse("s", &configs(&[("match", bad)]))), invalid_config, "{bad}");
        }
        assert_eq!(code(parse("s", &configs(&[("metrics", "a.,b.,a.")]))), invalid_config);
        // Split at the first '=' only, as Kafka 4.x: the expression may contain one, or be empty.
        let s = parse("s", &configs(&[("match", "client_id=a=b")])).unwrap();
        assert!(s.patterns[0].1.is_match("a=b"));
        let s = parse("s", &configs(&[("match", "client_id=")])).unwrap();
        assert!(s.patterns[0].1.is_match("") && !s.patterns[0].1.is_match("x"));
    }

    #[test]
    fn every_pattern_must_match_the_whole_attribute() {
        let s = parse(
            "s",
            &configs(&[("match", "client_software_name=librdkafka, client_software_version=2\\.1.*,client_id=app.*")]),
        )
        .unwrap();
        let mut c = ClientAttributes {
            client_instance_id: "AAAAAAAAAAAAAAAAAAAAAA".into(),
            client_id: "app-1".into(),
            software_name: Some("librdkafka".into()),
            software_version: Some("2.16.0".into()),
            source_address: "127.0.0.1".into(),
            source_port: Some(5000),
        };
        assert!(s.matches(&c));
        c.software_name = Some("apache-kafka-java".into());
        assert!(!s.matches(&c), "the pattern is anchored");
        c.software_name = None;
        assert!(!s.matches(&c), "an unknown attribute matches nothing");
        c.software_name = Some("xlibrdkafka".into());
        assert!(!s.matches(&c));
        let everyone = parse("all", &configs(&[("metrics", "*")])).unwrap();
        assert!(everyone.matches(&c));
        let port =
            parse("p", &configs(&[("match", "client_source_port=50\\d\\d,client_source_address=127\\..*")])).unwrap();
        c.software_name = Some("librdkafka".into());
        assert!(port.matches(&c));
        c.source_port = Some(6000);
        assert!(!port.matches(&c));
    }
}
