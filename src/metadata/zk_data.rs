//! Kafka's znode paths and the JSON it keeps in them (Kafka 3.x, ZooKeeper mode), so that an
//! operator who knows `zkCli.sh ls /brokers` finds what they expect.

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{json, Value};
use uuid::Uuid;

pub const CLUSTER_ID: &str = "/cluster/id";
pub const BROKER_IDS: &str = "/brokers/ids";
pub const BROKER_TOPICS: &str = "/brokers/topics";
pub const CONTROLLER: &str = "/controller";
pub const CONTROLLER_EPOCH: &str = "/controller_epoch";
pub const CONFIG_TOPICS: &str = "/config/topics";
pub const CONFIG_CHANGES: &str = "/config/changes";
pub const PRODUCER_ID_BLOCK: &str = "/latest_producer_id_block";
/// Kafka's FeatureZNode: the cluster's finalized features (KIP-584). Its znode version is
/// the finalized-features epoch ApiVersions reports.
pub const FEATURE: &str = "/feature";

/// The persistent paths Kafka creates at startup (`KafkaZkClient.createTopLevelPaths`).
pub const TOP_LEVEL_PATHS: &[&str] = &[
    "/consumers",
    "/brokers/ids",
    "/brokers/topics",
    "/brokers/seqid",
    "/config/changes",
    "/config/topics",
    "/config/clients",
    "/config/users",
    "/config/brokers",
    "/config/ips",
    "/admin/delete_topics",
    "/isr_change_notification",
    "/latest_producer_id_block",
    "/log_dir_event_notification",
];

/// Where a broker tells the controller a log dir of its went offline (Kafka's
/// `LogDirEventNotificationZNode`), one persistent sequential child per event.
pub const LOG_DIR_EVENT_NOTIFICATION: &str = "/log_dir_event_notification";
pub const LOG_DIR_EVENT_PREFIX: &str = "log_dir_event_";
/// Kafka's `LogDirEventNotificationHandler.LogDirFailureEvent`.
pub const LOG_DIR_FAILURE_EVENT: i64 = 1;

/// A log dir event's JSON, as Kafka's `LogDirEventNotificationSequenceZNode.encode` writes it.
pub fn log_dir_event_json(broker: i32) -> String {
    serde_json::json!({"version": 1, "broker": broker, "event": LOG_DIR_FAILURE_EVENT}).to_string()
}

/// The broker a log dir failure notification names (None for another event or bad JSON).
pub fn parse_log_dir_event(data: &str) -> Option<i32> {
    let v: serde_json::Value = serde_json::from_str(data).ok()?;
    if v.get("event")?.as_i64()? != LOG_DIR_FAILURE_EVENT {
        return None;
    }
    i32::try_from(v.get("broker")?.as_i64()?).ok()
}

pub fn broker_path(id: i32) -> String {
    format!("{BROKER_IDS}/{id}")
}
pub fn topic_path(topic: &str) -> String {
    format!("{BROKER_TOPICS}/{topic}")
}
pub fn partition_state_path(topic: &str, partition: i32) -> String {
    format!("{BROKER_TOPICS}/{topic}/partitions/{partition}/state")
}
pub fn topic_config_path(topic: &str) -> String {
    format!("{CONFIG_TOPICS}/{topic}")
}

/// Kafka prints UUIDs (topic and cluster ids) as URL-safe base64 without padding.
pub fn uuid_to_kafka(id: Uuid) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id.as_bytes())
}

pub fn uuid_from_kafka(s: &str) -> Option<Uuid> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).ok()?;
    Uuid::from_slice(&bytes).ok()
}

/// A fresh random id that is never the zero UUID nor Kafka's reserved METADATA_TOPIC_ID
/// (which starts 0x0000...), and whose base64 form does not start with '-'.
pub fn new_kafka_uuid() -> Uuid {
    loop {
        let id = Uuid::new_v4();
        if id.as_bytes()[0] != 0 && !uuid_to_kafka(id).starts_with('-') {
            return id;
        }
    }
}

pub fn cluster_id_json(id: &str) -> String {
    json!({"version": "1", "id": id}).to_string()
}

pub fn parse_cluster_id(data: &str) -> Option<String> {
    let v: Value = serde_json::from_str(data).ok()?;
    v.get("id")?.as_str().map(str::to_string)
}

/// `/brokers/topics/<t>`: the replica assignment, version 3 with the topic id.
pub fn topic_json(assignment: &BTreeMap<i32, Vec<i32>>, topic_id: Uuid) -> String {
    topic_json_moving(assignment, topic_id, &BTreeMap::new())
}

/// A partition's reassignment in flight, as Kafka 2.4+ keeps it in the topic znode
/// (`adding_replicas`, `removing_replicas`): the replica list is then the union of the old
/// and the target replicas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moving {
    pub adding: Vec<i32>,
    pub removing: Vec<i32>,
}

/// Partition -> its reassignment in flight (only partitions being moved).
pub type Reassignments = BTreeMap<i32, Moving>;

/// `/brokers/topics/<t>` with the reassignments in flight.
pub fn topic_json_moving(assignment: &BTreeMap<i32, Vec<i32>>, topic_id: Uuid, moving: &Reassignments) -> String {
    let partitions: serde_json::Map<String, Value> =
        assignment.iter().map(|(p, r)| (p.to_string(), json!(r))).collect();
    let side = |f: fn(&Moving) -> &Vec<i32>| -> serde_json::Map<String, Value> {
        moving.iter().filter(|(_, m)| !f(m).is_empty()).map(|(p, m)| (p.to_string(), json!(f(m)))).collect()
    };
    json!({
        "partitions": partitions,
        "topic_id": uuid_to_kafka(topic_id),
        "adding_replicas": side(|m| &m.adding),
        "removing_replicas": side(|m| &m.removing),
        "version": 3
    })
    .to_string()
}

/// Partition -> replica list, as `/brokers/topics/<t>` holds it.
pub type Assignment = BTreeMap<i32, Vec<i32>>;

pub fn parse_topic_json(data: &str) -> Option<(Assignment, Option<Uuid>)> {
    parse_topic_json_moving(data).map(|(a, id, _)| (a, id))
}

/// The topic znode with its reassignments in flight (missing keys read as none, as Kafka
/// reads the version 1 layout).
pub fn parse_topic_json_moving(data: &str) -> Option<(Assignment, Option<Uuid>, Reassignments)> {
    let v: Value = serde_json::from_str(data).ok()?;
    let ids = |r: &Value| -> Option<Vec<i32>> {
        Some(r.as_array()?.iter().filter_map(|r| r.as_i64()).map(|r| r as i32).collect())
    };
    let mut assignment = BTreeMap::new();
    for (p, replicas) in v.get("partitions")?.as_object()? {
        let p: i32 = p.parse().ok()?;
        assignment.insert(p, ids(replicas)?);
    }
    let id = v.get("topic_id").and_then(Value::as_str).and_then(uuid_from_kafka);
    let mut moving: Reassignments = BTreeMap::new();
    for (key, adding) in [("adding_replicas", true), ("removing_replicas", false)] {
        let Some(map) = v.get(key).and_then(Value::as_object) else { continue };
        for (p, replicas) in map {
            let (Ok(p), Some(replicas)) = (p.parse::<i32>(), ids(replicas)) else { continue };
            if replicas.is_empty() || !assignment.contains_key(&p) {
                continue;
            }
            let m = moving.entry(p).or_default();
            if adding {
                m.adding = replicas;
            } else {
                m.removing = replicas;
            }
        }
    }
    Some((assignment, id, moving))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub leader: i32,
    pub leader_epoch: i32,
    pub isr: Vec<i32>,
    pub controller_epoch: i32,
}

pub fn partition_state_json(s: &PartitionState) -> String {
    json!({
        "controller_epoch": s.controller_epoch,
        "leader": s.leader,
        "version": 1,
        "leader_epoch": s.leader_epoch,
        "isr": s.isr
    })
    .to_string()
}

pub fn parse_partition_state(data: &str) -> Option<PartitionState> {
    let v: Value = serde_json::from_str(data).ok()?;
    Some(PartitionState {
        leader: v.get("leader")?.as_i64()? as i32,
        leader_epoch: v.get("leader_epoch")?.as_i64()? as i32,
        isr: v.get("isr")?.as_array()?.iter().filter_map(Value::as_i64).map(|r| r as i32).collect(),
        controller_epoch: v.get("controller_epoch").and_then(Value::as_i64).unwrap_or(0) as i32,
    })
}

pub fn topic_config_json(config: &BTreeMap<String, String>) -> String {
    json!({"version": 1, "config": config}).to_string()
}

pub fn parse_topic_config(data: &str) -> BTreeMap<String, String> {
    serde_json::from_str::<Value>(data)
        .ok()
        .and_then(|v| v.get("config").cloned())
        .and_then(|c| serde_json::from_value(c).ok())
        .unwrap_or_default()
}

/// `/brokers/ids/<id>`, version 5, as a Kafka 3.x ZooKeeper-mode broker registers itself.
pub fn broker_registration_json(
    endpoints: &[crate::config::Endpoint],
    rack: Option<&str>,
    timestamp_ms: i64,
) -> String {
    let first = endpoints.first();
    let protocol_map: serde_json::Map<String, Value> =
        endpoints.iter().map(|e| (e.listener_name.clone(), json!(e.security_protocol()))).collect();
    let eps: Vec<String> = endpoints.iter().map(|e| format!("{}://{}:{}", e.listener_name, e.host, e.port)).collect();
    let mut v = json!({
        "features": {},
        "listener_security_protocol_map": protocol_map,
        "endpoints": eps,
        "jmx_port": -1,
        "port": first.map(|e| e.port as i64).unwrap_or(-1),
        "host": first.map(|e| e.host.clone()),
        "version": 5,
        "timestamp": timestamp_ms.to_string()
    });
    if let Some(rack) = rack {
        v["rack"] = json!(rack);
    }
    v.to_string()
}

/// `/feature` as the controller of a Kafka 3.x cluster with IBP >= 3.3 writes it: JSON
/// version 2 (no `min_version_level`), status 1 (enabled), and the finalized features, which a
/// ZooKeeper-mode broker (no supported features) leaves empty.
pub fn feature_znode_json(features: &BTreeMap<String, i16>) -> String {
    let features: serde_json::Map<String, Value> =
        features.iter().map(|(name, level)| (name.clone(), json!({"max_version_level": level}))).collect();
    json!({"features": features, "version": 2, "status": 1}).to_string()
}

/// `/feature` as read back: JSON version, whether enabled, and the finalized features (name to
/// max version level).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureZnode {
    pub version: i64,
    pub enabled: bool,
    pub features: BTreeMap<String, i16>,
}

/// Parses `/feature` with Kafka's rules (`FeatureZNode.decode`): version 1 or 2, a status of
/// 0 or 1, a features map whose entries have `max_version_level` >= 1 (and, in version 1,
/// `min_version_level`). None if any of that fails.
pub fn parse_feature_znode(data: &str) -> Option<FeatureZnode> {
    let v: Value = serde_json::from_str(data).ok()?;
    let version = v.get("version")?.as_i64().filter(|n| (1..=2).contains(n))?;
    let enabled = match v.get("status")?.as_i64()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let mut features = BTreeMap::new();
    for (name, levels) in v.get("features")?.as_object()? {
        let max = levels.get("max_version_level")?.as_i64().filter(|m| *m >= 1)?;
        if version == 1 {
            let min = levels.get("min_version_level")?.as_i64()?;
            if min < 1 || max < min {
                return None;
            }
        }
        features.insert(name.clone(), i16::try_from(max).ok()?);
    }
    Some(FeatureZnode { version, enabled, features })
}

pub fn controller_json(broker_id: i32, timestamp_ms: i64) -> String {
    json!({"version": 2, "brokerid": broker_id, "timestamp": timestamp_ms.to_string(), "kraftControllerEpoch": -1})
        .to_string()
}

pub fn producer_id_block_json(broker: i32, start: i64, end: i64) -> String {
    json!({"version": 1, "broker": broker, "block_start": start.to_string(), "block_end": end.to_string()}).to_string()
}

pub fn parse_producer_id_block_end(data: &str) -> Option<i64> {
    let v: Value = serde_json::from_str(data).ok()?;
    v.get("block_end")?.as_str()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_dir_events_are_written_and_read_as_kafka_does() {
        let json = log_dir_event_json(3);
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v, json!({"version": 1, "broker": 3, "event": 1}));
        assert_eq!(parse_log_dir_event(&json), Some(3));
        assert_eq!(parse_log_dir_event(r#"{"version":1,"broker":3,"event":2}"#), None);
        assert_eq!(parse_log_dir_event("not json"), None);
    }

    #[test]
    fn uuid_base64_roundtrip_is_22_chars() {
        let id = new_kafka_uuid();
        let s = uuid_to_kafka(id);
        assert_eq!(s.len(), 22);
        assert_eq!(uuid_from_kafka(&s), Some(id));
    }

    #[test]
    fn topic_and_state_json_roundtrip() {
        let mut a = BTreeMap::new();
        a.insert(0, vec![1, 2]);
        a.insert(1, vec![2, 1]);
        let id = new_kafka_uuid();
        let (back, back_id) = parse_topic_json(&topic_json(&a, id)).unwrap();
        assert_eq!(back, a);
        assert_eq!(back_id, Some(id));
        // A hand-written znode from an old tool has no topic id.
        let (old, none) = parse_topic_json(r#"{"version":1,"partitions":{"0":[0]}}"#).unwrap();
        assert_eq!(old[&0], vec![0]);
        assert!(none.is_none());
        let s = PartitionState { leader: 1, leader_epoch: 3, isr: vec![1, 2], controller_epoch: 7 };
        assert_eq!(parse_partition_state(&partition_state_json(&s)), Some(s));
    }

    #[test]
    fn feature_znode_is_kafkas_json() {
        let empty = feature_znode_json(&BTreeMap::new());
        let v: Value = serde_json::from_str(&empty).unwrap();
        assert_eq!(v, json!({"features": {}, "version": 2, "status": 1}));
        assert_eq!(
            parse_feature_znode(&empty),
            Some(FeatureZnode { version: 2, enabled: true, features: BTreeMap::new() })
        );
        let v1 = r#"{"features":{"f":{"min_version_level":1,"max_version_level":3}},"version":1,"status":0}"#;
        let parsed = parse_feature_znode(v1).unwrap();
        assert_eq!((parsed.version, parsed.enabled, parsed.features.get("f")), (1, false, Some(&3)));
        for bad in [
            r#"{"features":{},"version":3,"status":1}"#,
            r#"{"features":{},"version":2}"#,
            r#"{"features":{},"version":2,"status":2}"#,
            r#"{"version":2,"status":1}"#,
            r#"{"features":{"f":{"max_version_level":0}},"version":2,"status":1}"#,
            r#"{"features":{"f":{"max_version_level":2}},"version":1,"status":1}"#,
            "not json",
        ] {
            assert_eq!(parse_feature_znode(bad), None, "{bad}");
        }
    }
}
