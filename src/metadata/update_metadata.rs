//! What a broker does with UpdateMetadata (Kafka's `MetadataCache.updateMetadata`): the
//! controller's image of the live brokers and the partitions' state, and the topic configs read
//! when a topic first appears here.

use std::collections::BTreeMap;
use std::sync::Arc;

use uuid::Uuid;

use super::listener::MetadataListener;
use super::{zk_data, BrokerInfo, MetadataCache, PartitionInfo, TopicInfo, ZnodeStore};
use crate::protocol::inter_broker::{UpdateMetadataRequest, UpdateMetadataResponse};

/// The leader of a partition whose topic is being deleted, in UpdateMetadata (Kafka's
/// `LeaderAndIsr.LeaderDuringDelete`).
pub const LEADER_DURING_DELETE: i32 = -2;

/// Brings this broker's metadata image up to date with the controller's: the live brokers
/// (their address on `inter_broker_listener`), and the partitions the request names (a deleted
/// topic's with leader -2). Topic configs are read once, when a topic first appears here.
/// `effects` hears of the change once the cache holds it.
pub fn update_metadata(
    cache: &MetadataCache,
    store: &ZnodeStore,
    inter_broker_listener: &str,
    req: &UpdateMetadataRequest,
    effects: &dyn MetadataListener,
) -> UpdateMetadataResponse {
    let brokers = live_brokers(req, inter_broker_listener);
    let snapshot = cache.snapshot();
    let new_topics: Vec<String> = req
        .topics
        .iter()
        .filter(|t| !snapshot.topics.contains_key(&t.topic_name))
        .filter(|t| t.partitions.iter().any(|p| p.leader != LEADER_DURING_DELETE))
        .map(|t| t.topic_name.clone())
        .collect();
    let configs = read_topic_configs(store, &new_topics);
    cache.update(|c| {
        c.brokers = brokers;
        c.controller_id = req.controller_id;
        for t in &req.topics {
            let mut info = match c.topics.get(&t.topic_name) {
                Some(old) => (**old).clone(),
                None => TopicInfo {
                    name: t.topic_name.clone(),
                    id: t.topic_id,
                    partitions: Vec::new(),
                    configs: configs.get(&t.topic_name).cloned().unwrap_or_default(),
                },
            };
            if t.topic_id != Uuid::nil() {
                info.id = t.topic_id;
            }
            let mut deleted = false;
            for p in &t.partitions {
                if p.leader == LEADER_DURING_DELETE {
                    deleted = true;
                    continue;
                }
                let next = PartitionInfo {
                    index: p.partition_index,
                    leader: p.leader,
                    leader_epoch: p.leader_epoch,
                    replicas: p.replicas.clone(),
                    isr: p.isr.clone(),
                    partition_epoch: p.zk_version,
                    adding_replicas: Vec::new(),
                    removing_replicas: Vec::new(),
                    offline_replicas: p.offline_replicas.clone(),
                };
                match info.partitions.binary_search_by_key(&p.partition_index, |x| x.index) {
                    Ok(i) => {
                        let old = &info.partitions[i];
                        // A reordered older state never replaces a newer one.
                        if (old.leader_epoch, old.partition_epoch) <= (next.leader_epoch, next.partition_epoch) {
                            info.partitions[i] = next;
                        }
                    }
                    Err(i) => info.partitions.insert(i, next),
                }
            }
            if deleted {
                c.topics.remove(&t.topic_name);
            } else {
                c.topics.insert(t.topic_name.clone(), Arc::new(info));
            }
        }
    });
    // DeleteTopics answers once the topic is gone from this image.
    effects.on_metadata_updated();
    // As Kafka's KafkaApis does with the partitions UpdateMetadata shows deleted.
    let deleted: Vec<(String, i32)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .filter(|p| p.leader == LEADER_DURING_DELETE)
                .map(|p| (t.topic_name.clone(), p.partition_index))
        })
        .collect();
    effects.on_partitions_deleted(&deleted);
    UpdateMetadataResponse { error_code: 0 }
}

/// The live brokers UpdateMetadata names, each reached at its endpoint on `listener` (else its
/// first one).
fn live_brokers(req: &UpdateMetadataRequest, listener: &str) -> Vec<BrokerInfo> {
    req.live_brokers
        .iter()
        .filter_map(|b| {
            let endpoints: Vec<crate::config::Endpoint> = b
                .endpoints
                .iter()
                .filter_map(|e| {
                    let protocol = match e.security_protocol {
                        1 => "SSL",
                        2 => "SASL_PLAINTEXT",
                        3 => "SASL_SSL",
                        _ => "PLAINTEXT",
                    };
                    Some(crate::config::Endpoint::of_broker(
                        e.listener.clone(),
                        e.host.clone(),
                        u16::try_from(e.port).ok()?,
                        protocol,
                    ))
                })
                .collect();
            let ep = endpoints.iter().find(|e| e.listener_name == listener).or(endpoints.first())?.clone();
            Some(BrokerInfo { id: b.id, host: ep.host, port: ep.port, rack: b.rack.clone(), epoch: -1, endpoints })
        })
        .collect()
}

/// `/config/topics/<t>` of each topic, in one pipelined read; broker defaults (no overrides)
/// if the store cannot be read.
pub fn read_topic_configs(store: &ZnodeStore, names: &[String]) -> BTreeMap<String, BTreeMap<String, String>> {
    try_read_topic_configs(store, names).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read topic configs; using broker defaults until they change");
        BTreeMap::new()
    })
}

/// The overrides in `/config/topics/<name>` of each topic (empty where none is set).
pub fn try_read_topic_configs(
    store: &ZnodeStore,
    names: &[String],
) -> Result<BTreeMap<String, BTreeMap<String, String>>, crate::metadata::store::StoreError> {
    if names.is_empty() {
        return Ok(BTreeMap::new());
    }
    let paths: Vec<String> = names.iter().map(|n| zk_data::topic_config_path(n)).collect();
    let found = store.get_many_versioned(&paths)?;
    Ok(names
        .iter()
        .zip(found)
        .map(|(n, d)| (n.clone(), d.map(|(d, _)| zk_data::parse_topic_config(&d)).unwrap_or_default()))
        .collect())
}
