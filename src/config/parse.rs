//! Parsing helpers: the value parsers every key goes through (their messages name the key),
//! Java properties and TOML files, and `KAFKA_*` environment names.

use std::collections::BTreeMap;

use super::{invalid, ConfigError};

/// The resolved value of `key` ("" when unset).
pub(super) fn value<'v>(values: &'v BTreeMap<String, String>, key: &str) -> &'v str {
    values.get(key).map(String::as_str).unwrap_or("")
}

pub(super) fn at_least(key: &str, value: &str, min: i64) -> Result<i64, ConfigError> {
    let n = num::<i64>(key, value)?;
    if n < min {
        return Err(invalid(key, value, format!("must be at least {min}")));
    }
    Ok(n)
}

pub(super) fn in_range(key: &str, value: &str, min: i64, max: i64) -> Result<i64, ConfigError> {
    let n = num::<i64>(key, value)?;
    if n < min || n > max {
        return Err(invalid(key, value, format!("must be between {min} and {max}")));
    }
    Ok(n)
}

pub(super) fn num<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse::<T>().map_err(|e| invalid(key, value, e.to_string()))
}

pub(super) fn positive<T: std::str::FromStr + PartialOrd + Default>(key: &str, value: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    let n = num::<T>(key, value)?;
    if n <= T::default() {
        return Err(invalid(key, value, "must be greater than 0"));
    }
    Ok(n)
}

pub(super) fn boolean(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(key, value, "expected true or false")),
    }
}

pub(super) const NON_CONFIG_ENV: &[&str] = &[
    "KAFKA_HOME",
    "KAFKA_OPTS",
    "KAFKA_HEAP_OPTS",
    "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "KAFKA_LOG4J_OPTS",
    "KAFKA_DEBUG",
    "KAFKA_GC_LOG_OPTS",
    "KAFKA_VERSION",
    "KAFKA_CLUSTER_ID",
    // The Confluent image's own settings, read by its start scripts rather than by Kafka.
    "KAFKA_JMX_PORT",
    "KAFKA_JMX_HOSTNAME",
    "KAFKA_LOG4J_ROOT_LOGLEVEL",
    "KAFKA_LOG4J_LOGGERS",
    "KAFKA_TOOLS_LOG4J_LOGLEVEL",
];

/// `KAFKA_ADVERTISED_LISTENERS` -> `advertised.listeners`, with the Confluent image's escapes
/// (`___` for `-`, `__` for `_`); the Bitnami image's `KAFKA_CFG_ADVERTISED_LISTENERS` too.
pub(super) fn env_to_key(name: &str) -> Option<String> {
    let rest = name.strip_prefix("KAFKA_CFG_").or_else(|| name.strip_prefix("KAFKA_"))?;
    if rest.is_empty() || NON_CONFIG_ENV.contains(&name) {
        return None;
    }
    let lower = rest.to_ascii_lowercase();
    Some(
        lower
            .replace("___", "\u{1}")
            .replace("__", "\u{2}")
            .replace('_', ".")
            .replace('\u{1}', "-")
            .replace('\u{2}', "_"),
    )
}

/// Java properties: `key=value`, `key: value` or `key value`; `#`/`!` comments; a trailing
/// backslash continues the line.
pub fn parse_properties(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut logical = String::new();
    for raw in text.lines() {
        let line = raw.trim_start();
        if logical.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!')) {
            continue;
        }
        if let Some(stripped) = line.strip_suffix('\\') {
            logical.push_str(stripped);
            continue;
        }
        logical.push_str(line);
        let entry = std::mem::take(&mut logical);
        let split = entry.find(['=', ':', ' ', '\t']);
        let (k, v) = match split {
            Some(i) => (&entry[..i], entry[i + 1..].trim_start_matches([' ', '\t', '=', ':'])),
            None => (entry.as_str(), ""),
        };
        out.insert(k.trim().to_string(), unescape(v.trim_end()));
    }
    out
}

pub(super) fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// TOML with the same dotted keys: nested tables are flattened back into `a.b.c`.
pub fn parse_toml(text: &str) -> Result<BTreeMap<String, String>, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let mut out = BTreeMap::new();
    flatten_toml("", &toml::Value::Table(table), &mut out);
    Ok(out)
}

pub(super) fn flatten_toml(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    let scalar = |v: &toml::Value| match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        toml::Value::Array(_) | toml::Value::Table(_) => String::new(),
    };
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten_toml(&key, v, out);
            }
        }
        toml::Value::Array(items) => {
            out.insert(prefix.to_string(), items.iter().map(scalar).collect::<Vec<_>>().join(","));
        }
        other => {
            out.insert(prefix.to_string(), scalar(other));
        }
    }
}
