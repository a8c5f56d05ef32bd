//! A broker's identity at startup (Kafka's `KafkaServer` startup steps): its id, the
//! `meta.properties` of its log dirs, and its registration under `/brokers/ids`.

use std::time::Duration;

use super::now_ms;
use crate::config::BrokerConfig;
use crate::metadata::{zk_data, StoreError, ZnodeStore};

/// `broker.id`, or with `broker.id=-1` the id kept in meta.properties or a new one from
/// `/brokers/seqid` (its version plus `reserved.broker.max.id`), as Kafka does.
pub(super) fn resolve_broker_id(config: &BrokerConfig, store: &ZnodeStore) -> anyhow::Result<i32> {
    if config.broker_id >= 0 {
        return Ok(config.broker_id);
    }
    for dir in &config.log_dirs {
        if let Ok(text) = std::fs::read_to_string(dir.join("meta.properties")) {
            if let Some(id) = crate::config::parse_properties(&text).get("broker.id").and_then(|v| v.parse().ok()) {
                return Ok(id);
            }
        }
    }
    let generation = config.values.get("broker.id.generation.enable").map(String::as_str) != Some("false");
    if !generation {
        anyhow::bail!("broker.id is -1 and broker.id.generation.enable is false");
    }
    let reserved: i32 = config.values.get("reserved.broker.max.id").and_then(|v| v.parse().ok()).unwrap_or(1000);
    let path = "/brokers/seqid";
    loop {
        let current = store.get_versioned(path)?;
        match current {
            None => match store.create(path, "", false) {
                Ok(()) | Err(StoreError::NodeExists(_)) => continue,
                Err(e) => return Err(e.into()),
            },
            Some((_, version)) => match store.set_if_version(path, "", version) {
                Ok(()) => return Ok(reserved + version + 1),
                Err(StoreError::BadVersion(_)) => continue,
                Err(e) => return Err(e.into()),
            },
        }
    }
}

/// Writes this broker's ephemeral `/brokers/ids/<id>`. A node left by a previous run of the
/// same broker disappears when its session expires, so that case is retried for one session
/// timeout; a live broker with the same id makes startup fail with Kafka's message.
pub(super) async fn register(config: &BrokerConfig, store: &ZnodeStore) -> anyhow::Result<()> {
    let path = zk_data::broker_path(config.broker_id);
    let data = zk_data::broker_registration_json(&config.advertised_listeners, config.rack.as_deref(), now_ms());
    let give_up = tokio::time::Instant::now() + Duration::from_millis(config.zookeeper_session_timeout_ms + 2000);
    loop {
        match store.create(&path, &data, true) {
            Ok(()) => return Ok(()),
            Err(StoreError::NodeExists(_)) if store.is_zookeeper() && tokio::time::Instant::now() < give_up => {
                tracing::warn!(%path, "broker id is registered by another session; waiting for it to expire");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(StoreError::NodeExists(_)) => {
                anyhow::bail!(
                    "Error while creating ephemeral at {path}, node already exists and owner does not match current session: \
                     another broker is running with broker.id={}",
                    config.broker_id
                )
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `meta.properties` in each log dir, as a ZooKeeper-mode Kafka writes it.
pub(super) fn write_meta_properties(config: &BrokerConfig, cluster_id: &str) -> anyhow::Result<()> {
    for dir in &config.log_dirs {
        let path = dir.join("meta.properties");
        if let Ok(existing) = std::fs::read_to_string(&path) {
            let props = crate::config::parse_properties(&existing);
            if let Some(other) = props.get("broker.id").filter(|v| **v != config.broker_id.to_string()) {
                anyhow::bail!(
                    "Stored node id {other} doesn't match previous node id {} in {}",
                    config.broker_id,
                    path.display()
                );
            }
            continue;
        }
        let text = format!("#\n#{}\nversion=0\nbroker.id={}\ncluster.id={}\n", now_ms(), config.broker_id, cluster_id);
        std::fs::write(&path, text)?;
    }
    Ok(())
}
