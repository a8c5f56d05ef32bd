//! Limits: partitions per topic and request, connections (per broker, address and listener,
//! and their creation rates), request memory and concurrency, the I/O pool.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::listeners::Endpoint;
use super::parse::{at_least, num, positive, value};
use super::{invalid, ConfigError};

/// A connection creation rate: Kafka's Int.MaxValue (its default) means no limit.
pub(super) fn creation_rate(key: &str, value: &str) -> Result<Option<u32>, ConfigError> {
    let n = num::<i32>(key, value)?;
    match n {
        i32::MAX => Ok(None),
        n if n < 0 => Err(invalid(key, value, "must be at least 0")),
        n => Ok(Some(n as u32)),
    }
}

/// `listener.name.<l>.max.connection.creation.rate`, per listener.
pub(super) fn listener_creation_rates(
    values: &BTreeMap<String, String>,
    listeners: &[Endpoint],
) -> Result<HashMap<String, u32>, ConfigError> {
    let mut out = HashMap::new();
    for ep in listeners {
        let key = format!("listener.name.{}.max.connection.creation.rate", ep.listener_name.to_ascii_lowercase());
        if let Some(v) = values.get(&key) {
            if let Some(rate) = creation_rate(&key, v)? {
                out.insert(ep.listener_name.clone(), rate);
            }
        }
    }
    Ok(out)
}

/// `queued.max.request.bytes`: -1 (Kafka's default) or any negative value is no pool; 0
/// would let no request in at all, so it is refused.
pub(super) fn request_bytes_pool(value: &str) -> Result<Option<usize>, ConfigError> {
    let key = "queued.max.request.bytes";
    let n = num::<i64>(key, value)?;
    match n {
        n if n < 0 => Ok(None),
        0 => Err(invalid(key, value, "must be positive, or -1 for no limit")),
        n => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

/// Kafka's listener-prefixed form of `max.connections`; the listener part is lower case.
pub(super) fn listener_max_connections(
    values: &BTreeMap<String, String>,
    listeners: &[Endpoint],
) -> Result<HashMap<String, usize>, ConfigError> {
    let mut out = HashMap::new();
    for ep in listeners {
        let key = format!("listener.name.{}.max.connections", ep.listener_name.to_ascii_lowercase());
        if let Some(v) = values.get(&key) {
            out.insert(ep.listener_name.clone(), non_negative_usize(&key, v)?);
        }
    }
    Ok(out)
}

pub(super) fn non_negative_usize(key: &str, value: &str) -> Result<usize, ConfigError> {
    let n = num::<i64>(key, value)?;
    usize::try_from(n).map_err(|_| invalid(key, value, "must not be negative"))
}

/// `host:count,host:count`, as Kafka takes it; a host name stands for every address it
/// resolves to when the broker starts.
pub(super) fn per_ip_overrides(value: &str) -> Result<Vec<(std::net::IpAddr, usize)>, ConfigError> {
    const KEY: &str = "max.connections.per.ip.overrides";
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (host, count) =
            item.rsplit_once(':').ok_or_else(|| invalid(KEY, value, format!("{item:?} is not host:count")))?;
        let count = non_negative_usize(KEY, count)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            out.push((ip, count));
            continue;
        }
        let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(host, 0))
            .map_err(|e| invalid(KEY, value, format!("cannot resolve {host}: {e}")))?;
        out.extend(addrs.map(|a| (a.ip(), count)));
    }
    Ok(out)
}

/// `gregor.log.segment.fd.cache.size`: -1 (None: sized from the open-file limit at start) or
/// 1..=1,000,000 (more would be more descriptors than any limit a kernel lets one process have).
fn segment_fd_cache_size(value: &str) -> Result<Option<usize>, ConfigError> {
    const KEY: &str = "gregor.log.segment.fd.cache.size";
    match num::<i64>(KEY, value)? {
        -1 => Ok(None),
        n if (1..=1_000_000).contains(&n) => Ok(Some(n as usize)),
        _ => Err(invalid(KEY, value, "must be -1 (from the open-file limit) or between 1 and 1000000")),
    }
}

/// `gregor.log.index.mmap.cache.size`: -1 (None: sized from vm.max_map_count at start) or
/// 1..=100,000,000 (no kernel lets one process hold more maps; whether this one's limit can
/// is checked at start).
fn index_mmap_cache_size(value: &str) -> Result<Option<usize>, ConfigError> {
    const KEY: &str = "gregor.log.index.mmap.cache.size";
    match num::<i64>(KEY, value)? {
        -1 => Ok(None),
        n if (1..=100_000_000).contains(&n) => Ok(Some(n as usize)),
        _ => Err(invalid(KEY, value, "must be -1 (from vm.max_map_count) or between 1 and 100000000")),
    }
}

/// The limits, as parsed.
pub(super) struct Limits {
    pub max_request_partition_size_limit: i32,
    pub max_partitions_per_topic: i32,
    pub max_partitions_per_request: i64,
    pub connection_log_interval: Duration,
    pub open_files_reserved: u64,
    pub segment_fd_cache_size: Option<usize>,
    pub index_mmap_cache_size: Option<usize>,
    pub socket_request_max_bytes: usize,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub max_connections_per_ip_overrides: Vec<(std::net::IpAddr, usize)>,
    pub connections_max_idle: Duration,
    pub listener_max_connections: HashMap<String, usize>,
    pub max_connection_creation_rate: Option<u32>,
    pub listener_max_connection_creation_rate: HashMap<String, u32>,
    pub queued_max_request_bytes: Option<usize>,
    pub queued_max_requests: usize,
    pub num_io_threads: usize,
    pub max_decoded_bytes_per_request: usize,
}

impl Limits {
    pub(super) fn parse(values: &BTreeMap<String, String>, listeners: &[Endpoint]) -> Result<Limits, ConfigError> {
        let get = |k: &str| value(values, k);
        Ok(Limits {
            max_request_partition_size_limit: positive::<i32>(
                "max.request.partition.size.limit",
                get("max.request.partition.size.limit"),
            )?,
            max_partitions_per_topic: positive::<i32>(
                "gregor.max.partitions.per.topic",
                get("gregor.max.partitions.per.topic"),
            )?,
            max_partitions_per_request: positive::<i64>(
                "gregor.max.partitions.per.request",
                get("gregor.max.partitions.per.request"),
            )?,
            connection_log_interval: Duration::from_millis(positive::<u64>(
                "gregor.connection.log.interval.ms",
                get("gregor.connection.log.interval.ms"),
            )?),
            open_files_reserved: num::<u64>("gregor.open.files.reserved", get("gregor.open.files.reserved"))?,
            segment_fd_cache_size: segment_fd_cache_size(get("gregor.log.segment.fd.cache.size"))?,
            index_mmap_cache_size: index_mmap_cache_size(get("gregor.log.index.mmap.cache.size"))?,
            socket_request_max_bytes: positive::<usize>("socket.request.max.bytes", get("socket.request.max.bytes"))?,
            max_connections: non_negative_usize("max.connections", get("max.connections"))?,
            max_connections_per_ip: non_negative_usize("max.connections.per.ip", get("max.connections.per.ip"))?,
            max_connections_per_ip_overrides: per_ip_overrides(get("max.connections.per.ip.overrides"))?,
            connections_max_idle: Duration::from_millis(positive::<u64>(
                "connections.max.idle.ms",
                get("connections.max.idle.ms"),
            )?),
            listener_max_connections: listener_max_connections(values, listeners)?,
            max_connection_creation_rate: creation_rate(
                "max.connection.creation.rate",
                get("max.connection.creation.rate"),
            )?,
            listener_max_connection_creation_rate: listener_creation_rates(values, listeners)?,
            queued_max_request_bytes: request_bytes_pool(get("queued.max.request.bytes"))?,
            queued_max_requests: positive("queued.max.requests", get("queued.max.requests"))?,
            num_io_threads: at_least("num.io.threads", get("num.io.threads"), 1)? as usize,
            max_decoded_bytes_per_request: positive(
                "gregor.max.decoded.bytes.per.request",
                get("gregor.max.decoded.bytes.per.request"),
            )?,
        })
    }
}
