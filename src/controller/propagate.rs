//! How the controller tells brokers what it decided (Kafka's `ControllerBrokerRequestBatch`):
//! after each pass it compares its image with what it last told the brokers and sends only the
//! difference, one LeaderAndIsr, UpdateMetadata and StopReplica per broker per pass. A broker
//! that is new to the controller (just started, re-registered, or reconnected) gets the whole
//! state from its channel instead.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use uuid::Uuid;

use super::channel::ControlRequest;
use super::Controller;
use crate::metadata::cache::ClusterSnapshot;
use crate::metadata::PartitionInfo;
use crate::protocol::inter_broker::{
    LeaderAndIsrLiveLeader, LeaderAndIsrPartitionState, LeaderAndIsrRequest, LeaderAndIsrTopicState,
    StopReplicaPartitionState, StopReplicaRequest, StopReplicaTopicState, UpdateMetadataBroker, UpdateMetadataEndpoint,
    UpdateMetadataPartitionState, UpdateMetadataRequest, UpdateMetadataTopicState,
};
use crate::protocol::ErrorCode;
use crate::replication::control::{FULL_STATE, INCREMENTAL_STATE, LEADER_DURING_DELETE};
use crate::sync::MutexExt;

/// What the brokers were last told, per partition, and which brokers (with their epochs).
#[derive(Default)]
pub struct Propagated {
    partitions: HashMap<String, (Uuid, BTreeMap<i32, PartitionInfo>)>,
    brokers: BTreeMap<i32, i64>,
}

/// One partition to send, with its topic.
#[derive(Clone, Copy)]
struct Item<'a> {
    topic: &'a str,
    topic_id: Uuid,
    state: &'a PartitionInfo,
}

/// The requests of one pass, before they are split per broker.
#[derive(Default)]
struct Batch<'a> {
    /// Leader, epoch or replicas changed: LeaderAndIsr to the replicas.
    leadership: Vec<Item<'a>>,
    /// Only the ISR or partition epoch changed: LeaderAndIsr to the leader, which proposes
    /// the next ISR change against this partition epoch.
    isr_only: Vec<Item<'a>>,
    /// Anything changed, ISR included: UpdateMetadata to every broker.
    metadata: Vec<Item<'a>>,
    /// Topics deleted: (topic, id, partition, its old replicas).
    deleted: Vec<(String, Uuid, i32, Vec<i32>)>,
    /// Replicas removed by a reassignment: (broker, topic, partition).
    removed: Vec<(i32, &'a str, i32)>,
}

impl Controller {
    /// Forgets what brokers were told: the next [`Controller::propagate`] sends everything (a new
    /// controller knows nothing of what its predecessor sent).
    pub fn reset_propagated(&self) {
        *self.propagated.lock_unpoisoned() = Propagated::default();
        self.channels.clear();
    }

    /// Sends brokers what changed in the image for the topics in `scope` (all if None).
    pub fn propagate(&self, scope: Option<&BTreeSet<String>>) {
        if !self.store.is_zookeeper() || !self.is_controller() {
            return;
        }
        // One propagation at a time, from the snapshot read under the lock to the requests
        // queued under it: two passes that diffed in one order and queued in the other would
        // hand a broker the second diff (say one partition of a new topic) before the first
        // (the whole topic), and for that moment its Metadata would show the topic with fewer
        // partitions than it has. Queueing never blocks (a full queue marks a resync).
        let mut sent = self.propagated.lock_unpoisoned();
        let snapshot = self.cache.snapshot();
        let me = self.config.broker_id;
        let live: BTreeMap<i32, i64> = snapshot.brokers.iter().map(|b| (b.id, b.epoch)).collect();
        let mut batch = Batch::default();
        let new_brokers: BTreeSet<i32>;
        let live_changed;
        {
            new_brokers = live.iter().filter(|(id, e)| sent.brokers.get(id) != Some(e)).map(|(id, _)| *id).collect();
            live_changed = sent.brokers != live;
            sent.brokers = live.clone();
            let names: BTreeSet<String> = match scope {
                Some(s) => s.clone(),
                None => snapshot.topics.keys().chain(sent.partitions.keys()).cloned().collect(),
            };
            for name in &names {
                match snapshot.topics.get(name) {
                    // A topic read back while its partition states are still being written
                    // waits until all of them are there: a broker told of some partitions
                    // only would show clients a topic with fewer partitions than it has.
                    Some(topic) if topic.partitions.iter().any(|p| p.leader_epoch < 0) => {}
                    Some(topic) => {
                        let entry = sent.partitions.entry(name.clone()).or_insert_with(|| (topic.id, BTreeMap::new()));
                        entry.0 = topic.id;
                        for p in &topic.partitions {
                            let old = entry.1.get(&p.index);
                            if old.is_some_and(|o| same_state(o, p)) {
                                continue;
                            }
                            let item = Item { topic: &topic.name, topic_id: topic.id, state: p };
                            let leadership = old.is_none_or(|o| {
                                o.leader != p.leader || o.leader_epoch != p.leader_epoch || o.replicas != p.replicas
                            });
                            if let Some(o) = old {
                                for r in o.replicas.iter().filter(|r| !p.replicas.contains(r)) {
                                    batch.removed.push((*r, &topic.name, p.index));
                                }
                            }
                            if leadership {
                                batch.leadership.push(item);
                            } else {
                                batch.isr_only.push(item);
                            }
                            batch.metadata.push(item);
                            entry.1.insert(p.index, p.clone());
                        }
                    }
                    None => {
                        if let Some((id, parts)) = sent.partitions.remove(name.as_str()) {
                            for (index, p) in parts {
                                batch.deleted.push((name.clone(), id, index, p.replicas));
                            }
                        }
                    }
                }
            }
        }
        let live_ids: Vec<(i32, i64)> = live.iter().map(|(a, b)| (*a, *b)).collect();
        if let Some(me) = self.arc() {
            self.channels.retain(&me, &live_ids);
        }
        let epoch = self.controller_epoch();
        let offline = self.offline_replicas_by_partition();
        let mut own = (None, None);
        for (&id, &broker_epoch) in &live {
            if id != me && new_brokers.contains(&id) {
                // Its channel is new and starts with the whole state.
                continue;
            }
            let mut stop: Vec<(String, i32, bool)> = batch
                .deleted
                .iter()
                .filter(|(_, _, _, replicas)| replicas.contains(&id))
                .map(|(t, _, p, _)| (t.clone(), *p, true))
                .collect();
            stop.extend(batch.removed.iter().filter(|(b, _, _)| *b == id).map(|(_, t, p)| (t.to_string(), *p, true)));
            let leadership: Vec<&Item> = batch
                .leadership
                .iter()
                .filter(|i| i.state.replicas.contains(&id))
                .chain(batch.isr_only.iter().filter(|i| i.state.leader == id))
                .collect();
            let lai = (!leadership.is_empty())
                .then(|| leader_and_isr(me, epoch, broker_epoch, &leadership, &snapshot, false));
            let stop = (!stop.is_empty()).then(|| stop_replica(me, epoch, broker_epoch, &stop));
            if id == me {
                own = (lai, stop);
                continue;
            }
            // Leadership first, then metadata, as Kafka orders them: a broker never tells
            // clients it leads a partition before it does.
            if let Some(r) = lai {
                self.channels.send(id, ControlRequest::LeaderAndIsr(r));
            }
            if !batch.metadata.is_empty() || !batch.deleted.is_empty() || live_changed {
                let items: Vec<&Item> = batch.metadata.iter().collect();
                let um = update_metadata(me, epoch, broker_epoch, &items, &batch.deleted, &snapshot, &offline);
                self.channels.send(id, ControlRequest::UpdateMetadata(um));
            }
            if let Some(r) = stop {
                self.channels.send(id, ControlRequest::StopReplica(r));
            }
        }
        drop(sent);
        // The controller applies its own share directly (it opens and closes logs, so not
        // under the lock); its image is already current.
        let (lai, stop) = own;
        if let (Some(r), Some(local)) = (lai, self.local()) {
            let resp = local.become_leader_or_follower(&r);
            // Its own replicas in an offline log dir, as another broker's answer would name them.
            let storage = ErrorCode::KafkaStorageError.code();
            let offline: Vec<_> = resp.partition_errors.into_iter().filter(|e| e.error_code == storage).collect();
            self.on_replicas_offline(self.config.broker_id, offline);
        }
        if let Some(r) = stop {
            self.stop_replicas(&r);
        }
        // The controller sends itself no UpdateMetadata: its groups learn of deletions here.
        let deleted: Vec<(String, i32)> = batch.deleted.iter().map(|(t, _, p, _)| (t.clone(), *p)).collect();
        self.on_partitions_deleted(&deleted);
    }

    /// Everything a broker needs from the controller, for a new or reconnected channel: the
    /// whole image, then the state of every partition it replicates.
    pub fn full_state_for(&self, target: i32) -> Vec<ControlRequest> {
        let snapshot = self.cache.snapshot();
        let me = self.config.broker_id;
        let epoch = self.controller_epoch();
        let broker_epoch = snapshot.brokers.iter().find(|b| b.id == target).map(|b| b.epoch).unwrap_or(-1);
        let all: Vec<Item> = snapshot
            .topics
            .values()
            .filter(|t| t.partitions.iter().all(|p| p.leader_epoch >= 0))
            .flat_map(|t| {
                t.partitions.iter().filter(|p| p.leader_epoch >= 0).map(move |p| Item {
                    topic: &t.name,
                    topic_id: t.id,
                    state: p,
                })
            })
            .collect();
        let mine: Vec<&Item> = all.iter().filter(|i| i.state.replicas.contains(&target)).collect();
        let every: Vec<&Item> = all.iter().collect();
        vec![
            ControlRequest::UpdateMetadata(update_metadata(
                me,
                epoch,
                broker_epoch,
                &every,
                &[],
                &snapshot,
                &self.offline_replicas_by_partition(),
            )),
            ControlRequest::LeaderAndIsr(leader_and_isr(me, epoch, broker_epoch, &mine, &snapshot, true)),
        ]
    }
}

fn same_state(a: &PartitionInfo, b: &PartitionInfo) -> bool {
    a.leader == b.leader
        && a.leader_epoch == b.leader_epoch
        && a.isr == b.isr
        && a.replicas == b.replicas
        && a.partition_epoch == b.partition_epoch
        && a.adding_replicas == b.adding_replicas
        && a.removing_replicas == b.removing_replicas
}

/// Items grouped by topic, in the order they came.
fn by_topic<'a, 'b>(items: &'b [&'b Item<'a>]) -> Vec<(&'a str, Uuid, Vec<&'a PartitionInfo>)> {
    let mut out: Vec<(&str, Uuid, Vec<&PartitionInfo>)> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for i in items {
        let slot = *at.entry(i.topic).or_insert_with(|| {
            out.push((i.topic, i.topic_id, Vec::new()));
            out.len() - 1
        });
        out[slot].2.push(i.state);
    }
    out
}

fn leader_and_isr(
    me: i32,
    epoch: i32,
    broker_epoch: i64,
    items: &[&Item],
    snapshot: &ClusterSnapshot,
    full: bool,
) -> LeaderAndIsrRequest {
    let topics = by_topic(items)
        .into_iter()
        .map(|(name, id, parts)| LeaderAndIsrTopicState {
            topic_name: name.to_string(),
            topic_id: id,
            partitions: parts
                .into_iter()
                .map(|p| LeaderAndIsrPartitionState {
                    partition_index: p.index,
                    controller_epoch: epoch,
                    leader: p.leader,
                    leader_epoch: p.leader_epoch,
                    isr: p.isr.clone(),
                    partition_epoch: p.partition_epoch,
                    replicas: p.replicas.clone(),
                    adding_replicas: p.adding_replicas.clone(),
                    removing_replicas: p.removing_replicas.clone(),
                    is_new: false,
                    ..Default::default()
                })
                .collect(),
        })
        .collect();
    let live_leaders = snapshot
        .brokers
        .iter()
        .map(|b| LeaderAndIsrLiveLeader { broker_id: b.id, host_name: b.host.clone(), port: b.port as i32 })
        .collect();
    LeaderAndIsrRequest {
        controller_id: me,
        is_kraft_controller: false,
        controller_epoch: epoch,
        broker_epoch,
        request_type: if full { FULL_STATE } else { INCREMENTAL_STATE },
        topics,
        live_leaders,
    }
}

fn update_metadata(
    me: i32,
    epoch: i32,
    broker_epoch: i64,
    items: &[&Item],
    deleted: &[(String, Uuid, i32, Vec<i32>)],
    snapshot: &ClusterSnapshot,
    offline: &BTreeMap<(String, i32), Vec<i32>>,
) -> UpdateMetadataRequest {
    let state = |name: &str, p: &PartitionInfo| UpdateMetadataPartitionState {
        partition_index: p.index,
        controller_epoch: epoch,
        leader: p.leader,
        leader_epoch: p.leader_epoch,
        isr: p.isr.clone(),
        zk_version: p.partition_epoch,
        replicas: p.replicas.clone(),
        offline_replicas: p
            .replicas
            .iter()
            .copied()
            .filter(|r| {
                !snapshot.brokers.iter().any(|b| b.id == *r)
                    || (!offline.is_empty() && offline.get(&(name.to_string(), p.index)).is_some_and(|o| o.contains(r)))
            })
            .collect(),
    };
    let mut topics: Vec<UpdateMetadataTopicState> = by_topic(items)
        .into_iter()
        .map(|(name, id, parts)| UpdateMetadataTopicState {
            topic_name: name.to_string(),
            topic_id: id,
            partitions: parts.into_iter().map(|p| state(name, p)).collect(),
        })
        .collect();
    let mut gone: BTreeMap<&str, (Uuid, Vec<UpdateMetadataPartitionState>)> = BTreeMap::new();
    for (topic, id, index, replicas) in deleted {
        gone.entry(topic).or_insert_with(|| (*id, Vec::new())).1.push(UpdateMetadataPartitionState {
            partition_index: *index,
            controller_epoch: epoch,
            leader: LEADER_DURING_DELETE,
            leader_epoch: -1,
            replicas: replicas.clone(),
            ..Default::default()
        });
    }
    topics.extend(gone.into_iter().map(|(name, (id, partitions))| UpdateMetadataTopicState {
        topic_name: name.to_string(),
        topic_id: id,
        partitions,
    }));
    let live_brokers = snapshot
        .brokers
        .iter()
        .map(|b| UpdateMetadataBroker {
            id: b.id,
            endpoints: b
                .endpoints
                .iter()
                .map(|e| UpdateMetadataEndpoint {
                    port: e.port as i32,
                    host: e.host.clone(),
                    listener: e.listener_name.clone(),
                    security_protocol: match e.security_protocol() {
                        "SSL" => 1,
                        "SASL_PLAINTEXT" => 2,
                        "SASL_SSL" => 3,
                        _ => 0,
                    },
                })
                .collect(),
            rack: b.rack.clone(),
        })
        .collect();
    UpdateMetadataRequest {
        controller_id: me,
        is_kraft_controller: false,
        request_type: 0,
        controller_epoch: epoch,
        broker_epoch,
        topics,
        live_brokers,
    }
}

fn stop_replica(me: i32, epoch: i32, broker_epoch: i64, parts: &[(String, i32, bool)]) -> StopReplicaRequest {
    let mut topics: BTreeMap<&str, Vec<StopReplicaPartitionState>> = BTreeMap::new();
    for (t, p, delete) in parts {
        topics.entry(t).or_default().push(StopReplicaPartitionState {
            partition_index: *p,
            leader_epoch: LEADER_DURING_DELETE,
            delete_partition: *delete,
        });
    }
    StopReplicaRequest {
        controller_id: me,
        is_kraft_controller: false,
        controller_epoch: epoch,
        broker_epoch,
        topics: topics
            .into_iter()
            .map(|(t, partitions)| StopReplicaTopicState { topic_name: t.to_string(), partitions })
            .collect(),
    }
}
