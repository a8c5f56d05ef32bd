//! Client telemetry (KIP-714; Kafka's `ClientMetricsManager`): the client-metrics
//! subscriptions kept in ZooKeeper, the client instances that asked for theirs, and what those
//! clients push.
//!
//! Subscriptions live in `/config/client-metrics/<name>` (Kafka's config entity type, the same
//! JSON as a topic's overrides) and are announced under `/config/changes`, so every broker
//! reads them again when one changes. A client instance is created by its first
//! GetTelemetrySubscriptions or PushTelemetry on this broker, matched once against the
//! subscriptions (again when they change), and forgotten after `max(60 s, 3 × its push
//! interval)` without a request, or sooner when `gregor.client.telemetry.max.clients` newer
//! ones need the room: junk clients cost a bounded table, never a growing one.
//!
//! Where pushed metrics go: Kafka hands them to a receiver plugin. Here the numeric data points
//! of the OTLP payload are kept per client instance (each push replaces the last, so a client
//! that stops reporting a metric stops showing it) and served on `/metrics` with the client's
//! instance id and client id as labels, within `gregor.client.telemetry.max.series.per.client`
//! and `gregor.client.telemetry.max.series`. Subscriptions ask for cumulative sums (Kafka asks
//! for deltas, which its plugins accumulate), so a pushed counter is a Prometheus counter as it
//! stands.

pub mod otlp;
pub mod subscription;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::client_telemetry::ClientTelemetryConfig;
use crate::metadata::{zk_data, StoreError, ZnodeStore};
use crate::protocol::ErrorCode;
use crate::sync::{MutexExt, RwLockExt};
pub use subscription::{ClientAttributes, Subscription};

pub const CONFIG_CLIENT_METRICS: &str = "/config/client-metrics";

/// Kafka's `DEFAULT_CACHE_EXPIRY_MS`: the least time an idle client instance is remembered.
const MIN_INSTANCE_EXPIRY: Duration = Duration::from_secs(60);

/// Compression types a client may push with, in the broker's order of preference (Kafka's
/// `SUPPORTED_COMPRESSION_TYPES`: zstd, lz4, gzip, snappy).
pub const ACCEPTED_COMPRESSION_TYPES: &[i8] = &[4, 3, 1, 2];

/// The znode of a subscription (its name sanitized as Kafka sanitizes entity names).
pub fn subscription_path(name: &str) -> String {
    format!("{CONFIG_CLIENT_METRICS}/{}", crate::security::scram::sanitize(name))
}

/// What a GetTelemetrySubscriptions or PushTelemetry is answered with, besides its error.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscribed {
    pub client_instance_id: Uuid,
    pub subscription_id: i32,
    pub metrics: Vec<String>,
    pub push_interval_ms: i32,
    pub telemetry_max_bytes: i32,
}

/// A PushTelemetry as the manager sees it.
#[derive(Clone, Copy)]
pub struct Push<'a> {
    pub client_instance_id: Uuid,
    pub subscription_id: i32,
    pub terminating: bool,
    pub compression_type: i8,
    pub metrics: &'a [u8],
}

/// A pushed series: metric name and sorted attributes.
type SeriesKey = (String, Vec<(String, String)>);

struct Instance {
    attributes: ClientAttributes,
    subscription_id: i32,
    /// The subscriptions' version this instance was matched against.
    subscription_version: u64,
    metrics: Vec<String>,
    push_interval_ms: i32,
    last_get: Option<Instant>,
    last_push: Option<Instant>,
    last_error: ErrorCode,
    terminating: bool,
    last_seen: Instant,
    /// Its place in the least-recently-seen order.
    seq: u64,
    /// The numeric points of its last accepted push, by (name, attributes).
    series: BTreeMap<SeriesKey, (f64, bool)>,
}

impl Instance {
    fn expiry(&self) -> Duration {
        MIN_INSTANCE_EXPIRY.max(Duration::from_millis(self.push_interval_ms.max(0) as u64 * 3))
    }

    /// Kafka's `maybeUpdateGetRequestTimestamp`: a Get is due a push interval after the last
    /// Get or push.
    fn may_get(&mut self, now: Instant) -> bool {
        let last = self.last_get.max(self.last_push);
        let due = last.is_none_or(|t| now.duration_since(t) >= self.interval());
        if due {
            self.last_get = Some(now);
        }
        due
    }

    /// Kafka's `maybeUpdatePushRequestTimestamp`: the first push after a Get is accepted at
    /// once (clients jitter their interval), later ones a push interval apart.
    fn may_push(&mut self, now: Instant) -> bool {
        let due =
            self.last_get > self.last_push || self.last_push.is_none_or(|t| now.duration_since(t) >= self.interval());
        if due {
            self.last_push = Some(now);
        }
        due
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(self.push_interval_ms.max(0) as u64)
    }
}

#[derive(Default)]
struct Subscriptions {
    /// Name to (stored configs, parsed subscription).
    by_name: BTreeMap<String, (BTreeMap<String, String>, Subscription)>,
    /// Moves with every change, so instances matched earlier are matched again.
    version: u64,
}

#[derive(Default)]
struct Instances {
    by_id: HashMap<Uuid, Instance>,
    /// seq -> id, oldest first: who goes when the table is full.
    order: BTreeMap<u64, Uuid>,
    next_seq: u64,
    /// Series held over all instances.
    series: usize,
}

impl Instances {
    fn remove(&mut self, id: &Uuid) -> Option<Instance> {
        let instance = self.by_id.remove(id)?;
        self.order.remove(&instance.seq);
        self.series -= instance.series.len();
        Some(instance)
    }

    /// Forgets the instances idle past their expiry, oldest first, stopping at the first that
    /// is not (the order is by last request; expiries differ, so a few may stay a little long
    /// until the bound or a later sweep takes them).
    fn expire(&mut self, now: Instant) -> usize {
        let mut gone = 0;
        while let Some((_, id)) = self.order.first_key_value() {
            let id = *id;
            let expired = self.by_id.get(&id).is_none_or(|i| now.duration_since(i.last_seen) >= i.expiry());
            if !expired {
                break;
            }
            if self.remove(&id).is_none() {
                // An order entry without its instance (never left so): dropped, not looped on.
                self.order.pop_first();
            }
            gone += 1;
        }
        gone
    }

    fn touch(&mut self, id: &Uuid, now: Instant) {
        let seq = self.next_seq;
        if let Some(i) = self.by_id.get_mut(id) {
            self.order.remove(&i.seq);
            i.seq = seq;
            i.last_seen = now;
            self.order.insert(seq, *id);
            self.next_seq += 1;
        }
    }
}

struct Stats {
    pushes: IntCounterVec,
    push_bytes: IntCounter,
    subscription_requests: IntCounterVec,
    series_dropped: IntCounter,
    instances: IntGauge,
}

impl Stats {
    fn new() -> prometheus::Result<Stats> {
        Ok(Stats {
            pushes: IntCounterVec::new(
                Opts::new(
                    "gregor_client_telemetry_pushes_total",
                    "PushTelemetry requests by the error they were answered with (NONE: accepted)",
                ),
                &["error"],
            )?,
            push_bytes: IntCounter::new(
                "gregor_client_telemetry_push_bytes_total",
                "Bytes of accepted PushTelemetry payloads, as received (compressed)",
            )?,
            subscription_requests: IntCounterVec::new(
                Opts::new(
                    "gregor_client_telemetry_subscription_requests_total",
                    "GetTelemetrySubscriptions requests by the error they were answered with (NONE: answered)",
                ),
                &["error"],
            )?,
            series_dropped: IntCounter::new(
                "gregor_client_telemetry_series_dropped_total",
                "Pushed data points not shown on /metrics: over gregor.client.telemetry.max.series(.per.client)",
            )?,
            instances: IntGauge::new(
                "gregor_client_telemetry_instances",
                "Client instances this broker remembers (Kafka's client-metrics instance-count)",
            )?,
        })
    }
}

pub struct ClientMetricsManager {
    store: Arc<ZnodeStore>,
    config: ClientTelemetryConfig,
    subscriptions: RwLock<Subscriptions>,
    instances: Mutex<Instances>,
    stats: Option<Stats>,
}

impl ClientMetricsManager {
    pub fn new(store: Arc<ZnodeStore>, config: ClientTelemetryConfig) -> ClientMetricsManager {
        let stats =
            Stats::new().map_err(|e| tracing::warn!(error = %e, "cannot create the client telemetry metrics")).ok();
        ClientMetricsManager { store, config, subscriptions: RwLock::default(), instances: Mutex::default(), stats }
    }

    /// Whether GetTelemetrySubscriptions and PushTelemetry are served.
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// The subscriptions' names (ListClientMetricsResources).
    pub fn names(&self) -> Vec<String> {
        self.subscriptions.read_unpoisoned().by_name.keys().cloned().collect()
    }

    /// A subscription's stored configs; None if there is no such subscription.
    pub fn configs(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.subscriptions.read_unpoisoned().by_name.get(name).map(|(c, _)| c.clone())
    }

    /// Reads every subscription from the store. One that does not validate (written by
    /// another tool) is logged and left out, as a broker skips an invalid config change.
    pub fn reload(&self) -> Result<(), StoreError> {
        let mut by_name = BTreeMap::new();
        for child in self.store.try_children(CONFIG_CLIENT_METRICS)? {
            let Some(data) = self.store.try_get(&format!("{CONFIG_CLIENT_METRICS}/{child}"))? else { continue };
            let configs = zk_data::parse_topic_config(&data);
            let name = crate::security::scram::desanitize(&child);
            match subscription::parse(&name, &configs) {
                Ok(s) => {
                    by_name.insert(name, (configs, s));
                }
                Err(e) => {
                    tracing::warn!(subscription = %name, error = %e.message, "invalid client metrics subscription; ignored")
                }
            }
        }
        let mut subs = self.subscriptions.write_unpoisoned();
        let same = subs.by_name.len() == by_name.len()
            && subs.by_name.iter().zip(&by_name).all(|((a, (ca, _)), (b, (cb, _)))| a == b && ca == cb);
        if !same {
            tracing::info!(subscriptions = by_name.len(), "client metrics subscriptions changed");
            subs.by_name = by_name;
            subs.version += 1;
        }
        Ok(())
    }

    /// Stores a subscription's configs (none: deletes it, as Kafka drops a subscription whose
    /// every config was deleted), announces the change to the other brokers, and applies it here.
    pub fn store_subscription(&self, name: &str, configs: &BTreeMap<String, String>) -> Result<(), StoreError> {
        let path = subscription_path(name);
        if configs.is_empty() {
            self.store.delete_recursive(&path)?;
        } else {
            self.store.set(&path, &zk_data::topic_config_json(configs))?;
        }
        let entity_path = path.trim_start_matches("/config/").to_string();
        let notice = serde_json::json!({"version": 2, "entity_path": entity_path}).to_string();
        self.store.create_sequential(&format!("{}/config_change_", zk_data::CONFIG_CHANGES), &notice)?;
        self.reload()
    }

    fn count_get(&self, error: ErrorCode) {
        if let Some(s) = &self.stats {
            s.subscription_requests.with_label_values(&[&error_name(error)]).inc();
        }
    }

    fn count_push(&self, error: ErrorCode, bytes: usize) {
        if let Some(s) = &self.stats {
            s.pushes.with_label_values(&[&error_name(error)]).inc();
            if error == ErrorCode::None {
                s.push_bytes.inc_by(bytes as u64);
            }
        }
    }

    /// Matches a client against every subscription, as Kafka's `createClientInstance`: the
    /// union of the matching subscriptions' metrics (`*` alone if any asks for all), the
    /// shortest of their intervals (the default if none matches).
    fn matched(&self, id: Uuid, attributes: ClientAttributes, now: Instant, seq: u64) -> Instance {
        let subs = self.subscriptions.read_unpoisoned();
        let mut metrics: Vec<String> = Vec::new();
        let mut interval = subscription::INTERVAL_MS_DEFAULT;
        let mut all = false;
        for (_, s) in subs.by_name.values() {
            if s.matches(&attributes) {
                all |= s.metrics.iter().any(|m| m == subscription::ALL_METRICS);
                metrics.extend(s.metrics.iter().cloned());
                interval = interval.min(s.interval_ms);
            }
        }
        metrics.sort();
        metrics.dedup();
        if all {
            metrics = vec![subscription::ALL_METRICS.to_string()];
        }
        Instance {
            attributes,
            subscription_id: subscription_id(&metrics, interval, id),
            subscription_version: subs.version,
            metrics,
            push_interval_ms: interval,
            last_get: None,
            last_push: None,
            last_error: ErrorCode::None,
            terminating: false,
            last_seen: now,
            seq,
            series: BTreeMap::new(),
        }
    }

    /// The instance for `id`, created or matched again (subscriptions changed) as needed, and
    /// marked as just seen; the table is kept within its bound.
    fn with_instance<T>(
        &self,
        id: Uuid,
        attributes: ClientAttributes,
        f: impl FnOnce(&mut Instance, &mut usize) -> T,
    ) -> T {
        let now = Instant::now();
        let version = self.subscriptions.read_unpoisoned().version;
        let mut instances = self.instances.lock_unpoisoned();
        instances.expire(now);
        let stale = instances.by_id.get(&id).is_some_and(|i| i.subscription_version != version);
        if stale || !instances.by_id.contains_key(&id) {
            // Matched again from the attributes it was first seen with, as Kafka keeps the
            // instance's metadata; its timestamps start over, so a changed subscription is
            // fetched at once.
            let attributes = match instances.remove(&id) {
                Some(old) => old.attributes,
                None => attributes,
            };
            while instances.by_id.len() >= self.config.max_clients {
                let Some((_, oldest)) = instances.order.pop_first() else { break };
                instances.remove(&oldest);
            }
            let seq = instances.next_seq;
            instances.next_seq += 1;
            let instance = self.matched(id, attributes, now, seq);
            instances.order.insert(seq, id);
            instances.by_id.insert(id, instance);
        } else {
            instances.touch(&id, now);
        }
        if let Some(s) = &self.stats {
            s.instances.set(instances.by_id.len() as i64);
        }
        let Instances { by_id, series, .. } = &mut *instances;
        match by_id.get_mut(&id) {
            Some(instance) => f(instance, series),
            // Inserted just above under the same lock.
            None => unreachable!("client instance {id} vanished under the lock"),
        }
    }

    /// GetTelemetrySubscriptions: a new client instance id for a client that has none, and the
    /// subscription that applies to it; THROTTLING_QUOTA_EXCEEDED before its push interval has
    /// passed (unless its last push failed for a reason the new subscription may cure).
    pub fn get_subscriptions(
        &self,
        requested_id: Uuid,
        mut attributes: ClientAttributes,
    ) -> Result<Subscribed, ErrorCode> {
        let id = if requested_id.is_nil() { self.new_instance_id() } else { requested_id };
        attributes.client_instance_id = instance_id_string(id);
        let max_bytes = self.config.max_bytes;
        let result = self.with_instance(id, attributes, |i, _| {
            let exempt =
                matches!(i.last_error, ErrorCode::UnknownSubscriptionId | ErrorCode::UnsupportedCompressionType);
            if !i.may_get(Instant::now()) && !exempt {
                return Err(ErrorCode::ThrottlingQuotaExceeded);
            }
            i.last_error = ErrorCode::None;
            Ok(Subscribed {
                client_instance_id: id,
                subscription_id: i.subscription_id,
                metrics: i.metrics.clone(),
                push_interval_ms: i.push_interval_ms,
                telemetry_max_bytes: max_bytes,
            })
        });
        self.count_get(result.as_ref().err().copied().unwrap_or(ErrorCode::None));
        result
    }

    fn new_instance_id(&self) -> Uuid {
        let instances = self.instances.lock_unpoisoned();
        loop {
            let id = Uuid::new_v4();
            // Kafka's Uuid.randomUuid never hands out an id whose base64 form starts with '-'.
            if id.as_bytes()[0] >> 2 != 62 && !instances.by_id.contains_key(&id) {
                return id;
            }
        }
    }

    /// PushTelemetry, checked in Kafka's order; an accepted payload's numeric points replace
    /// the instance's series on `/metrics`.
    pub fn push(&self, push: Push<'_>, attributes: ClientAttributes) -> Result<(), ErrorCode> {
        let result = self.push_checked(push, attributes);
        self.count_push(result.err().unwrap_or(ErrorCode::None), push.metrics.len());
        result
    }

    fn push_checked(&self, push: Push<'_>, mut attributes: ClientAttributes) -> Result<(), ErrorCode> {
        let id = push.client_instance_id;
        if id.is_nil() || id == Uuid::from_u128(1) {
            return Err(ErrorCode::InvalidRequest);
        }
        attributes.client_instance_id = instance_id_string(id);
        let max_bytes = self.config.max_bytes.max(0) as usize;
        let (per_client, total) = (self.config.max_series_per_client, self.config.max_series);
        self.with_instance(id, attributes, |i, _| {
            let checked = check_push(i, &push, max_bytes, Instant::now());
            // Kafka records the terminating flag whatever the outcome.
            i.terminating = push.terminating;
            i.last_error = checked.err().unwrap_or(ErrorCode::None);
            checked
        })?;
        if push.metrics.is_empty() {
            return Ok(());
        }
        // Decompressed and read outside the table's lock: other clients' requests do not wait.
        let decoded = decode(push.compression_type, push.metrics, max_bytes, per_client);
        let mut instances = self.instances.lock_unpoisoned();
        let Instances { by_id, series: series_total, .. } = &mut *instances;
        // Forgotten meanwhile (the table was full): its points go with it.
        let Some(i) = by_id.get_mut(&id) else { return Ok(()) };
        let (points, mut dropped) = match decoded {
            Ok(p) => p,
            Err(e) => {
                i.last_error = e;
                return Err(e);
            }
        };
        *series_total -= i.series.len();
        let room = total.saturating_sub(*series_total).min(per_client);
        let mut kept = BTreeMap::new();
        for p in points {
            if kept.len() >= room {
                dropped += 1;
                continue;
            }
            let mut attrs = p.attributes;
            attrs.sort();
            kept.insert((p.name, attrs), (p.value, p.counter));
        }
        *series_total += kept.len();
        i.series = kept;
        drop(instances);
        if let (Some(s), true) = (&self.stats, dropped > 0) {
            s.series_dropped.inc_by(dropped as u64);
        }
        Ok(())
    }

    /// The telemetry counters and every client's pushed series, in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(s) = &self.stats {
            let mut families = s.pushes.collect();
            families.extend(s.push_bytes.collect());
            families.extend(s.subscription_requests.collect());
            families.extend(s.series_dropped.collect());
            families.extend(s.instances.collect());
            families.retain(|f| !f.get_metric().is_empty());
            if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
                tracing::warn!(error = %e, "cannot encode client telemetry metrics");
                out.clear();
            }
        }
        let mut instances = self.instances.lock_unpoisoned();
        instances.expire(Instant::now());
        // Family name -> (type, sample lines): each family's series must be written together.
        let mut families: BTreeMap<String, (&'static str, Vec<String>)> = BTreeMap::new();
        for (id, i) in &instances.by_id {
            let id = instance_id_string(*id);
            for ((name, attrs), (value, counter)) in &i.series {
                let family = family_name(name);
                let kind = if *counter { "counter" } else { "gauge" };
                let mut labels =
                    format!("client_instance_id=\"{id}\",client_id=\"{}\"", escape(&i.attributes.client_id));
                let mut used = vec!["client_instance_id".to_string(), "client_id".to_string()];
                for (k, v) in attrs {
                    let k = label_name(k);
                    if used.contains(&k) {
                        continue;
                    }
                    let _ = write!(labels, ",{k}=\"{}\"", escape(v));
                    used.push(k);
                }
                let entry = families.entry(family.clone()).or_insert((kind, Vec::new()));
                if entry.0 != kind {
                    entry.0 = "untyped";
                }
                entry.1.push(format!("{family}{{{labels}}} {}", number(*value)));
            }
        }
        for (family, (kind, lines)) in families {
            let _ = writeln!(out, "# TYPE {family} {kind}");
            for l in lines {
                let _ = writeln!(out, "{l}");
            }
        }
        out
    }
}

/// Kafka's `validatePushRequest`, in its order.
fn check_push(i: &mut Instance, push: &Push<'_>, max_bytes: usize, now: Instant) -> Result<(), ErrorCode> {
    if i.terminating {
        return Err(ErrorCode::InvalidRequest);
    }
    if !i.may_push(now) && !push.terminating {
        return Err(ErrorCode::ThrottlingQuotaExceeded);
    }
    if push.subscription_id != i.subscription_id {
        return Err(ErrorCode::UnknownSubscriptionId);
    }
    if !(0..=4).contains(&push.compression_type) {
        return Err(ErrorCode::UnsupportedCompressionType);
    }
    if push.metrics.len() > max_bytes {
        return Err(ErrorCode::TelemetryTooLarge);
    }
    Ok(())
}

/// Decompresses (within `max_bytes`: more is TELEMETRY_TOO_LARGE, as Kafka answers a payload
/// too large once decompressed) and reads the payload; what cannot be read is INVALID_RECORD,
/// Kafka's answer when its receiver fails on the payload.
fn decode(
    compression_type: i8,
    payload: &[u8],
    max_bytes: usize,
    max_points: usize,
) -> Result<(Vec<otlp::DataPoint>, usize), ErrorCode> {
    let plain;
    let data = if compression_type == 0 {
        payload
    } else {
        use crate::log::compression::{decompress, is_too_large};
        match decompress(compression_type as u8, 2, payload, max_bytes) {
            Ok(d) => {
                plain = d;
                &plain[..]
            }
            Err(e) if is_too_large(&e) => return Err(ErrorCode::TelemetryTooLarge),
            Err(_) => return Err(ErrorCode::InvalidRecord),
        }
    };
    otlp::data_points(data, max_points).map_err(|_| ErrorCode::InvalidRecord)
}

/// Kafka's name of an error (`Errors.name()`): THROTTLING_QUOTA_EXCEEDED for
/// ThrottlingQuotaExceeded.
fn error_name(error: ErrorCode) -> String {
    let mut out = String::new();
    for (i, c) in format!("{error:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// Kafka's subscription id: a CRC32C of the metrics and the interval, XORed with the instance
/// id's hash, so a client can tell a changed subscription from its own.
fn subscription_id(metrics: &[String], interval_ms: i32, id: Uuid) -> i32 {
    let text = format!("[{}]{interval_ms}", metrics.join(", "));
    let crc = crc32c::crc32c(text.as_bytes()) as i32;
    let (hi, lo) = id.as_u64_pair();
    let h = hi ^ lo;
    crc ^ ((h >> 32) as i32 ^ h as i32)
}

/// Kafka's string form of a Uuid: URL-safe base64 without padding.
pub fn instance_id_string(id: Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = id.as_bytes();
    let mut out = String::with_capacity(22);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for k in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * k)) & 63) as usize] as char);
        }
    }
    out
}

/// A pushed metric's name as a Prometheus family: what is not `[a-zA-Z0-9_]` becomes `_`; a
/// name that would land in the broker's own namespaces (`kafka_`, `gregor_`) is prefixed with
/// `client_`, so no client can forge or clash with a broker series.
fn family_name(name: &str) -> String {
    let mut s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.is_empty()
        || s.starts_with(|c: char| c.is_ascii_digit())
        || s.starts_with("kafka_")
        || s.starts_with("gregor_")
    {
        s.insert_str(0, "client_");
    }
    s
}

fn label_name(key: &str) -> String {
    let mut s: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) || s.starts_with("__") {
        s.insert_str(0, "a_");
    }
    s
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        v.to_string()
    }
}

/// Subscriptions follow `/config/client-metrics` and the change notifications.
impl crate::metadata::MetadataListener for ClientMetricsManager {
    fn on_client_metrics_changed(&self) -> Result<(), StoreError> {
        self.reload()
    }
}

#[cfg(test)]
mod tests;
