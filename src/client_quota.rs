//! Client quotas (Kafka's `ClientQuotaManager` with its default callback): byte-rate bounds
//! on produce and fetch per user and client id, kept in ZooKeeper in Kafka's layout
//! (`/config/users/<user>`, `/config/users/<user>/clients/<client>`, `/config/clients/<client>`,
//! `<default>` for the defaults), announced under `/config/changes` and re-read by every
//! broker when announced.
//!
//! Which quota applies is Kafka's order: user and client, user and default client, user,
//! default user and client, default user and default client, default user, client, default
//! client. Without authentication every client is the user `ANONYMOUS`, as in Kafka.
//!
//! Enforced: `producer_byte_rate` (a produce is answered late by its throttle time, with it
//! in `throttle_time_ms`, which mutes the connection as Kafka does since every connection has
//! one request in flight) and `consumer_byte_rate` (a fetch over the quota is answered with no
//! data after its throttle time). Refused with INVALID_REQUEST, since nothing here could
//! enforce them: `request_percentage`, `controller_mutation_rate` and the IP entity's
//! `connection_creation_rate`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::config::BrokerConfig;
use crate::metadata::store::ZnodeStore;
use crate::metadata::{zk_data, StoreError};
use crate::sync::{MutexExt, RwLockExt};

pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";
pub const IP: &str = "ip";
pub const DEFAULT: &str = "<default>";
pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
/// The principal of every client without authentication.
pub const ANONYMOUS: &str = "ANONYMOUS";

/// Keys Kafka knows for user and client entities, and the IP entity's.
const CLIENT_KEYS: &[&str] =
    &[PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, "request_percentage", "controller_mutation_rate"];
const IP_KEYS: &[&str] = &["connection_creation_rate"];
const ENFORCED: &[&str] = &[PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE];

/// A quota entity: user and client id (None: the `<default>` one), each optional.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entity {
    pub user: Option<Option<String>>,
    pub client: Option<Option<String>>,
}

impl Entity {
    /// The znode holding the entity's quotas.
    pub fn path(&self) -> Option<String> {
        let name = |n: &Option<String>| n.as_deref().map(sanitize).unwrap_or_else(|| DEFAULT.to_string());
        match (&self.user, &self.client) {
            (Some(u), Some(c)) => Some(format!("/config/users/{}/clients/{}", name(u), name(c))),
            (Some(u), None) => Some(format!("/config/users/{}", name(u))),
            (None, Some(c)) => Some(format!("/config/clients/{}", name(c))),
            (None, None) => None,
        }
    }
}

// Kafka's `Sanitizer`: user and client ids are URL-encoded into znode names, as user names
// for SCRAM credentials are.
pub use crate::security::scram::{desanitize, sanitize};

fn entity_name(znode: &str) -> Option<String> {
    (znode != DEFAULT).then(|| desanitize(znode))
}

/// Every stored entity with its quotas.
pub type QuotaTable = BTreeMap<Entity, BTreeMap<String, f64>>;

/// Checks one AlterClientQuotas entity and its keys; returns the refusal message.
pub fn check_alteration(entity: &[(String, Option<String>)], keys: &[&str]) -> Result<Entity, String> {
    let mut e = Entity { user: None, client: None };
    for (kind, name) in entity {
        let slot = match kind.as_str() {
            USER => &mut e.user,
            CLIENT_ID => &mut e.client,
            IP => return Err(format!("{IP} quotas (connection_creation_rate) are not enforced by this broker")),
            other => return Err(format!("Unsupported quota entity type: {other}")),
        };
        if slot.is_some() {
            return Err(format!("Duplicate quota entity type: {kind}"));
        }
        if name.as_deref() == Some("") {
            return Err(format!("Empty {kind} name is not allowed; use the default entity"));
        }
        *slot = Some(name.clone());
    }
    if e.user.is_none() && e.client.is_none() {
        return Err("Invalid empty client quota entity".into());
    }
    for key in keys {
        if IP_KEYS.contains(key) || !CLIENT_KEYS.contains(key) {
            return Err(format!("Invalid configuration key {key}"));
        }
        if !ENFORCED.contains(key) {
            return Err(format!("Quota {key} is not enforced by this broker; only {ENFORCED:?} are"));
        }
    }
    Ok(e)
}

/// A byte rate measured against its quota: a token bucket holding one quota window
/// (`quota.window.size.seconds`) of the rate, that may go below zero.
struct Bucket {
    tokens: f64,
    at: Instant,
}

pub struct ClientQuotas {
    /// Where the quota entities are kept (`/config/users`, `/config/clients`).
    store: Arc<ZnodeStore>,
    /// `quota.window.size.seconds`: the burst a quota allows.
    window: Duration,
    table: RwLock<QuotaTable>,
    /// Per (quota key, matched entity's user tag, client tag), as Kafka keys its sensors.
    buckets: Mutex<HashMap<(&'static str, String, String), Bucket>>,
}

impl ClientQuotas {
    pub fn new(store: Arc<ZnodeStore>, config: &BrokerConfig) -> ClientQuotas {
        let secs = config.values.get("quota.window.size.seconds").and_then(|v| v.parse::<u64>().ok()).unwrap_or(1);
        ClientQuotas {
            store,
            window: Duration::from_secs(secs.max(1)),
            table: RwLock::default(),
            buckets: Mutex::default(),
        }
    }

    pub fn table(&self) -> QuotaTable {
        self.table.read_unpoisoned().clone()
    }

    /// The quota `key` for (user, client id) in Kafka's order, with the sensor it counts in.
    fn lookup(&self, key: &str, user: &str, client: &str) -> Option<(f64, String, String)> {
        let table = self.table.read_unpoisoned();
        if table.is_empty() {
            return None;
        }
        let u = || Some(Some(user.to_string()));
        let c = || Some(Some(client.to_string()));
        let d = || Some(None);
        let both = (user.to_string(), client.to_string());
        let user_only = (user.to_string(), String::new());
        let client_only = (String::new(), client.to_string());
        let order = [
            (Entity { user: u(), client: c() }, &both),
            (Entity { user: u(), client: d() }, &both),
            (Entity { user: u(), client: None }, &user_only),
            (Entity { user: d(), client: c() }, &both),
            (Entity { user: d(), client: d() }, &both),
            (Entity { user: d(), client: None }, &user_only),
            (Entity { user: None, client: c() }, &client_only),
            (Entity { user: None, client: d() }, &client_only),
        ];
        let found = order.into_iter().find_map(|(e, tags)| {
            let v = table.get(&e)?.get(key)?;
            Some((*v, tags.0.clone(), tags.1.clone()))
        });
        found
    }

    /// Counts `bytes` against the quota `key` of (user, client) and returns how long the
    /// client must wait (zero when within its quota or without one).
    pub fn record(&self, key: &'static str, user: &str, client: &str, bytes: usize, window: Duration) -> Duration {
        let Some((rate, ut, ct)) = self.lookup(key, user, client) else { return Duration::ZERO };
        let mut buckets = self.buckets.lock_unpoisoned();
        let b =
            buckets.entry((key, ut, ct)).or_insert(Bucket { tokens: rate * window.as_secs_f64(), at: Instant::now() });
        refill(b, rate, window);
        b.tokens -= bytes as f64;
        debt(b, rate, window)
    }

    /// How long (user, client) must wait before its quota `key` allows more; zero if it may go on.
    pub fn throttle_time(&self, key: &'static str, user: &str, client: &str, window: Duration) -> Duration {
        let Some((rate, ut, ct)) = self.lookup(key, user, client) else { return Duration::ZERO };
        let mut buckets = self.buckets.lock_unpoisoned();
        let Some(b) = buckets.get_mut(&(key, ut, ct)) else { return Duration::ZERO };
        refill(b, rate, window);
        debt(b, rate, window)
    }
}

fn refill(b: &mut Bucket, rate: f64, window: Duration) {
    let now = Instant::now();
    let cap = rate * window.as_secs_f64();
    b.tokens = (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate).min(cap);
    b.at = now;
}

/// The time until the bucket is out of debt, at most one window per sample Kafka keeps
/// (`quota.window.num`), as Kafka bounds its throttle time.
fn debt(b: &Bucket, rate: f64, window: Duration) -> Duration {
    if b.tokens >= 0.0 {
        return Duration::ZERO;
    }
    let secs = if rate <= 0.0 { f64::MAX } else { -b.tokens / rate };
    Duration::from_secs_f64(secs.min(window.as_secs_f64() * QUOTA_WINDOWS))
}

/// Kafka's `quota.window.num` default: the samples its rates are measured over.
const QUOTA_WINDOWS: f64 = 11.0;

impl ClientQuotas {
    /// `quota.window.size.seconds`: the burst a quota allows.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Reads every quota entity from ZooKeeper: what a broker enforces and DescribeClientQuotas
    /// reports. Costs the entities stored, not the cluster's size.
    pub fn read_client_quotas(&self) -> Result<QuotaTable, StoreError> {
        let mut paths: Vec<(Entity, String)> = Vec::new();
        for u in self.store.try_children("/config/users")? {
            let user = entity_name(&u);
            paths.push((Entity { user: Some(user.clone()), client: None }, format!("/config/users/{u}")));
            for c in self.store.try_children(&format!("/config/users/{u}/clients"))? {
                paths.push((
                    Entity { user: Some(user.clone()), client: Some(entity_name(&c)) },
                    format!("/config/users/{u}/clients/{c}"),
                ));
            }
        }
        for c in self.store.try_children("/config/clients")? {
            paths.push((Entity { user: None, client: Some(entity_name(&c)) }, format!("/config/clients/{c}")));
        }
        let found = self.store.get_many_versioned(&paths.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>())?;
        let mut table = QuotaTable::new();
        for ((entity, path), data) in paths.into_iter().zip(found) {
            let Some((data, _)) = data else { continue };
            let mut values = BTreeMap::new();
            for (k, v) in zk_data::parse_topic_config(&data) {
                if !CLIENT_KEYS.contains(&k.as_str()) {
                    continue;
                }
                let Ok(v) = v.trim().parse::<f64>() else {
                    tracing::warn!(%path, key = %k, value = %v, "quota value is not a number; ignored");
                    continue;
                };
                if !ENFORCED.contains(&k.as_str()) {
                    tracing::warn!(%path, key = %k, "quota written to ZooKeeper that this broker does not enforce");
                }
                values.insert(k, v);
            }
            if !values.is_empty() {
                table.insert(entity, values);
            }
        }
        Ok(table)
    }

    /// Re-reads the quotas after a change was announced.
    pub fn reload_client_quotas(&self) -> Result<(), StoreError> {
        let table = self.read_client_quotas()?;
        let mut cur = self.table.write_unpoisoned();
        if *cur != table {
            tracing::info!(entities = table.len(), "client quotas changed");
            *cur = table;
        }
        Ok(())
    }

    /// Sets and removes quota keys of one entity (checked), stores them and announces them as
    /// Kafka's AdminZkClient does, then applies them here.
    pub fn alter_client_quota(&self, entity: &Entity, ops: &[(String, Option<f64>)]) -> Result<(), StoreError> {
        let Some(path) = entity.path() else { return Ok(()) };
        let mut values = self.store.try_get(&path)?.map(|d| zk_data::parse_topic_config(&d)).unwrap_or_default();
        for (k, v) in ops {
            match v {
                // The byte rates are Kafka LONG configs: stored as integers.
                Some(v) => values.insert(k.clone(), format!("{}", v.round() as i64)),
                None => values.remove(k),
            };
        }
        self.store.set(&path, &zk_data::topic_config_json(&values))?;
        let entity_path = path.trim_start_matches("/config/").to_string();
        let notice = serde_json::json!({"version": 2, "entity_path": entity_path}).to_string();
        self.store.create_sequential(&format!("{}/config_change_", zk_data::CONFIG_CHANGES), &notice)?;
        self.reload_client_quotas()
    }
}

/// Client quotas follow `/config/users`, `/config/clients` and the change notifications.
impl crate::metadata::MetadataListener for ClientQuotas {
    fn on_client_quotas_changed(&self) -> Result<(), StoreError> {
        self.reload_client_quotas()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas() -> (tempfile::TempDir, ClientQuotas) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::metadata::EmbeddedStore::open(dir.path().join("znodes")).unwrap();
        let config = BrokerConfig::from_map(BTreeMap::new()).unwrap();
        (dir, ClientQuotas::new(Arc::new(ZnodeStore::Embedded(store)), &config))
    }

    fn e(user: Option<Option<&str>>, client: Option<Option<&str>>) -> Entity {
        Entity { user: user.map(|u| u.map(str::to_string)), client: client.map(|c| c.map(str::to_string)) }
    }

    #[test]
    fn paths_are_kafkas() {
        assert_eq!(e(None, Some(Some("app-1"))).path().unwrap(), "/config/clients/app-1");
        assert_eq!(e(Some(None), Some(None)).path().unwrap(), "/config/users/<default>/clients/<default>");
        assert_eq!(e(Some(Some("CN=a b")), None).path().unwrap(), "/config/users/CN%3Da%20b");
        assert_eq!(desanitize("CN%3Da%20b"), "CN=a b");
    }

    #[test]
    fn the_most_specific_quota_wins() {
        let (_dir, q) = quotas();
        let mut t = QuotaTable::new();
        t.insert(e(None, Some(None)), [(PRODUCER_BYTE_RATE.to_string(), 100.0)].into());
        t.insert(e(None, Some(Some("fast"))), [(PRODUCER_BYTE_RATE.to_string(), 5000.0)].into());
        t.insert(e(Some(Some("ANONYMOUS")), Some(Some("slow"))), [(PRODUCER_BYTE_RATE.to_string(), 10.0)].into());
        *q.table.write().unwrap() = t;
        assert_eq!(q.lookup(PRODUCER_BYTE_RATE, ANONYMOUS, "fast").unwrap().0, 5000.0);
        assert_eq!(q.lookup(PRODUCER_BYTE_RATE, ANONYMOUS, "other").unwrap(), (100.0, String::new(), "other".into()));
        assert_eq!(q.lookup(PRODUCER_BYTE_RATE, ANONYMOUS, "slow").unwrap().0, 10.0);
        assert!(q.lookup(CONSUMER_BYTE_RATE, ANONYMOUS, "fast").is_none());
    }

    #[test]
    fn a_client_over_its_quota_waits_for_the_excess() {
        let (_dir, q) = quotas();
        *q.table.write().unwrap() =
            [(e(None, Some(Some("c"))), [(PRODUCER_BYTE_RATE.to_string(), 1000.0)].into())].into();
        let w = Duration::from_secs(1);
        assert_eq!(q.record(PRODUCER_BYTE_RATE, ANONYMOUS, "c", 500, w), Duration::ZERO);
        let t = q.record(PRODUCER_BYTE_RATE, ANONYMOUS, "c", 2500, w);
        assert!(t > Duration::from_millis(1900) && t <= Duration::from_secs(2), "{t:?}");
        assert!(q.throttle_time(PRODUCER_BYTE_RATE, ANONYMOUS, "c", w) > Duration::ZERO);
        assert_eq!(q.record(PRODUCER_BYTE_RATE, ANONYMOUS, "other", 1 << 30, w), Duration::ZERO);
    }

    #[test]
    fn only_enforced_quotas_are_accepted() {
        let user = |n: &str| vec![(USER.to_string(), Some(n.to_string()))];
        assert!(check_alteration(&user("u"), &[PRODUCER_BYTE_RATE]).is_ok());
        assert!(check_alteration(&user("u"), &["request_percentage"]).unwrap_err().contains("request_percentage"));
        assert!(check_alteration(&[(IP.to_string(), None)], &["connection_creation_rate"]).is_err());
        assert!(check_alteration(&user("u"), &["bogus"]).is_err());
        assert!(check_alteration(&[], &[PRODUCER_BYTE_RATE]).is_err());
    }
}
