//! How the coordinator's state reaches disk and the znode tree on this broker: offsets and group
//! metadata as records in `__consumer_offsets`, membership under `/consumers/<group>`.

use std::sync::Arc;

use super::coordinator::{CommittedOffset, Group, GroupState, GroupStore, Member};
use super::offsets_log::{self, OffsetValue, OffsetsKey, StoredMember};
use super::{partition_for, OFFSETS_TOPIC};
use crate::broker::Broker;
use crate::log::batch::{encode_batch, BatchHeader, BatchOptions, SimpleRecord};

const NOT_COORDINATOR: i16 = 16;
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;

pub struct BrokerGroupStore<'a>(pub &'a Broker);

impl BrokerGroupStore<'_> {
    fn append(&self, group: &str, records: Vec<(bytes::Bytes, Option<bytes::Bytes>)>) -> Result<(), i16> {
        // A batch of no records is invalid on disk (the log refuses it with INVALID_RECORD),
        // and there is nothing to persist: e.g. DeleteGroups after OffsetDelete removed all.
        if records.is_empty() {
            return Ok(());
        }
        let b = self.0;
        let p = b.offsets_partition(group).ok_or(NOT_COORDINATOR)?;
        let partition = b.replicas.partition(OFFSETS_TOPIC, p).ok_or(NOT_COORDINATOR)?;
        let ts = crate::log::now_ms();
        let simple: Vec<SimpleRecord<'_>> = records
            .iter()
            .map(|(k, v)| SimpleRecord { timestamp: ts, key: Some(k), value: v.as_deref(), headers: vec![] })
            .collect();
        let batch = encode_batch(&BatchOptions::default(), &simple);
        let result = partition.append(batch.into(), u32::MAX);
        if result.error_code != 0 {
            return Err(result.error_code);
        }
        Ok(())
    }
}

impl GroupStore for BrokerGroupStore<'_> {
    fn store_offsets(&self, group: &str, offsets: &[((String, i32), Option<CommittedOffset>)]) -> Result<(), i16> {
        let records = offsets
            .iter()
            .map(|((topic, partition), value)| {
                let key = OffsetsKey::Offset { group: group.to_string(), topic: topic.clone(), partition: *partition };
                let value = value.as_ref().map(|v| {
                    OffsetValue {
                        offset: v.offset,
                        leader_epoch: v.leader_epoch,
                        metadata: v.metadata.clone(),
                        commit_timestamp: v.commit_timestamp,
                    }
                    .encode()
                });
                (key.encode(), value)
            })
            .collect();
        self.append(group, records)?;
        for ((topic, partition), value) in offsets {
            self.0.offsets_zk_mirror.record(group, topic, *partition, value.as_ref().map(|v| v.offset));
        }
        Ok(())
    }

    fn store_group(&self, group: &Group) -> Result<(), i16> {
        let key = OffsetsKey::Group { group: group.id.clone() }.encode();
        if group.state == GroupState::Dead {
            return self.append(&group.id, vec![(key, None)]);
        }
        let protocol = group.protocol_name.as_deref();
        let metadata: Vec<(bytes::Bytes, &Member)> = group
            .members
            .values()
            .map(|m| {
                (
                    m.protocols
                        .iter()
                        .find(|(n, _)| Some(n.as_str()) == protocol)
                        .map(|(_, b)| b.clone())
                        .unwrap_or_default(),
                    m,
                )
            })
            .collect();
        let members: Vec<StoredMember<'_>> = metadata
            .iter()
            .map(|(sub, m)| StoredMember {
                member_id: &m.id,
                instance_id: m.instance_id.as_deref(),
                client_id: &m.client_id,
                client_host: &m.client_host,
                rebalance_timeout: m.rebalance_timeout.as_millis() as i32,
                session_timeout: m.session_timeout.as_millis() as i32,
                subscription: sub,
                assignment: &m.assignment,
            })
            .collect();
        let value = offsets_log::encode_group_value(
            group.protocol_type.as_deref().unwrap_or(""),
            group.generation,
            protocol,
            group.leader.as_deref(),
            group.current_state_timestamp().unwrap_or_else(crate::log::now_ms),
            &members,
        );
        self.append(&group.id, vec![(key, Some(value))])
    }

    fn topic_partition_exists(&self, topic: &str, partition: i32) -> bool {
        self.0.cache.topic(topic).is_some_and(|t| t.partitions.iter().any(|p| p.index == partition))
    }

    // ZooKeeper (or the embedded store's journal) is written by a background task: the
    // coordinator calls these holding the lock every group request waits for.
    fn member_joined(&self, group: &str, member: &Member) {
        self.0.membership_zk_mirror.member_joined(group, member);
    }

    fn member_left(&self, group: &str, member_id: &str) {
        self.0.membership_zk_mirror.member_left(group, member_id);
    }

    fn owners_changed(&self, group: &str, owners: &[(String, i32, String)]) {
        self.0.membership_zk_mirror.owners_changed(group, owners);
    }
}

impl Broker {
    pub fn group_store(&self) -> BrokerGroupStore<'_> {
        BrokerGroupStore(self)
    }

    /// Kafka's `GroupCoordinator.onPartitionsDeleted`, called wherever this broker learns that
    /// partitions were deleted: committed offsets for them must not outlive the topic (a topic
    /// created again under the name starts at offset 0, and tools describing a group would
    /// ask for the old topic's offsets). Appends to `__consumer_offsets`: call it off the async
    /// workers.
    pub fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        let removed = self.groups.on_partitions_deleted(&self.group_store(), deleted);
        if removed > 0 {
            tracing::info!(
                partitions = deleted.len(),
                offsets = removed,
                "removed committed offsets of deleted partitions"
            );
        }
    }

    /// The `__consumer_offsets` partition of `group`, hashed over the partitions the topic
    /// really has (Kafka reads the count from ZooKeeper): a topic created with another count,
    /// before `offsets.topic.num.partitions` changed or by a client, must keep every group
    /// where its offsets already are. None while the topic does not exist.
    pub fn offsets_partition(&self, group: &str) -> Option<i32> {
        let topic = self.cache.topic(OFFSETS_TOPIC)?;
        Some(partition_for(group, topic.partitions.len() as i32))
    }

    /// Whether this broker coordinates `group` (leads its `__consumer_offsets` partition):
    /// NOT_COORDINATOR sends the client back to FindCoordinator after leadership moved.
    pub fn check_coordinator(&self, group: &str) -> Result<(), i16> {
        // A broker that has not yet learnt of `__consumer_offsets` (it was just created
        // elsewhere) leads none of it: NOT_COORDINATOR, which clients answer by asking
        // FindCoordinator again, where COORDINATOR_NOT_AVAILABLE fails librdkafka's committed().
        let p = self.offsets_partition(group).ok_or(NOT_COORDINATOR)?;
        match self.replicas.partition(OFFSETS_TOPIC, p) {
            Some(_) if self.is_loading_offsets(p) => Err(COORDINATOR_LOAD_IN_PROGRESS),
            Some(_) => Ok(()),
            // Named leader in the image while its log is still being opened (a topic just
            // created): the coordinator is on its way, so the client retries here instead of
            // taking NOT_COORDINATOR, which librdkafka's synchronous commit returns as is.
            None if self.leads_in_image(p) => Err(COORDINATOR_LOAD_IN_PROGRESS),
            None => Err(NOT_COORDINATOR),
        }
    }

    fn leads_in_image(&self, p: i32) -> bool {
        let me = self.config.broker_id;
        self.cache.topic(OFFSETS_TOPIC).is_some_and(|t| t.partitions.iter().any(|x| x.index == p && x.leader == me))
    }

    /// The broker that coordinates `group`: the leader of its `__consumer_offsets` partition,
    /// creating the topic on first use as Kafka does.
    pub fn group_coordinator_for(&self, group: &str, listener: &str) -> Result<(i32, String, u16), i16> {
        if self.cache.topic(OFFSETS_TOPIC).is_none() {
            self.create_offsets_topic()?;
        }
        self.coordinator_in(OFFSETS_TOPIC, group, listener)
    }

    /// The leader of `key`'s partition of the internal topic `topic` (`__consumer_offsets`
    /// for groups, `__transaction_state` for transactional ids), with its address on
    /// `listener`.
    pub(crate) fn coordinator_in(&self, topic: &str, key: &str, listener: &str) -> Result<(i32, String, u16), i16> {
        let topic = self.cache.topic(topic).ok_or(COORDINATOR_NOT_AVAILABLE)?;
        let p = partition_for(key, topic.partitions.len() as i32);
        let leader =
            topic.partitions.iter().find(|x| x.index == p).map(|x| x.leader).ok_or(COORDINATOR_NOT_AVAILABLE)?;
        if leader < 0 {
            return Err(COORDINATOR_NOT_AVAILABLE);
        }
        if leader == self.config.broker_id {
            // Named leader but the partition not yet open or its groups still loading: a
            // client sent here now would get COORDINATOR_LOAD_IN_PROGRESS from its first commit,
            // which librdkafka's synchronous commit hands to the application. Not available
            // keeps it asking FindCoordinator, which it retries by itself.
            let loading = topic.name == OFFSETS_TOPIC && self.is_loading_offsets(p);
            if loading || self.replicas.partition(&topic.name, p).is_none() {
                return Err(COORDINATOR_NOT_AVAILABLE);
            }
            let ep = self.config.advertised_for(listener).ok_or(COORDINATOR_NOT_AVAILABLE)?;
            return Ok((leader, ep.host.clone(), ep.port));
        }
        let snapshot = self.cache.snapshot();
        let b = snapshot.brokers.iter().find(|b| b.id == leader).ok_or(COORDINATOR_NOT_AVAILABLE)?;
        let (host, port) = b.endpoint_for(listener).ok_or(COORDINATOR_NOT_AVAILABLE)?;
        Ok((b.id, host.to_string(), port))
    }

    fn create_offsets_topic(&self) -> Result<(), i16> {
        match self.controller.auto_create(OFFSETS_TOPIC) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(COORDINATOR_NOT_AVAILABLE),
            Err(_) if self.cache.topic(OFFSETS_TOPIC).is_some() => Ok(()),
            // Created by another broker; this one learns of it on its next ZooKeeper pass.
            Err(e) if e.code == crate::api::error::ErrorCode::TopicAlreadyExists.code() => {
                Err(COORDINATOR_NOT_AVAILABLE)
            }
            // Fewer brokers alive than offsets.topic.replication.factor: clients ask again
            // until there are enough, so this is not worth a warning per request.
            Err(e) if e.code == crate::api::error::ErrorCode::InvalidReplicationFactor.code() => {
                tracing::debug!(error = %e, "cannot create {OFFSETS_TOPIC} yet");
                Err(COORDINATOR_NOT_AVAILABLE)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot create {OFFSETS_TOPIC}");
                Err(COORDINATOR_NOT_AVAILABLE)
            }
        }
    }

    /// Replays `__consumer_offsets` into the coordinator (at startup, before serving).
    /// `only`: one partition (this broker just became its leader); None: every one it leads.
    pub fn load_groups(&self, only: Option<i32>) {
        let Some(topic) = self.cache.topic(OFFSETS_TOPIC) else { return };
        let count = topic.partitions.len() as i32;
        if let Some(p) = only {
            // What an earlier term as coordinator left in memory is not the log's state.
            self.groups.unload_groups(&self.group_store(), |g| partition_for(g, count) == p);
        }
        let now = crate::log::now_ms();
        let mut loaded = 0usize;
        let mut restore_empty: std::collections::HashMap<String, bool> = std::collections::HashMap::new();
        for p in topic.partitions.iter().filter(|p| only.is_none_or(|o| o == p.index)) {
            // Offsets committed in transactions wait for their marker, as they did when written.
            let mut in_txn: std::collections::HashMap<i64, Vec<offsets_log::KeyValue>> = Default::default();
            let Some(partition) = self.replicas.partition(OFFSETS_TOPIC, p.index) else { continue };
            let mut offset = partition.log_start_offset();
            let end = partition.log_end_offset();
            while offset < end {
                let read = partition.read_to_log_end(offset, 1 << 20);
                if read.error_code != 0 || read.records.is_empty() {
                    break;
                }
                let mut buf = &read.records[..];
                let mut next = offset;
                while let Some(h) = BatchHeader::parse(buf) {
                    let size = h.total_size();
                    if size > buf.len() {
                        break;
                    }
                    if h.is_control() {
                        let commit = crate::log::batch::control_marker(&buf[..size]);
                        if let Some(records) = in_txn.remove(&h.producer_id).filter(|_| commit == Some(true)) {
                            for kv in records {
                                self.apply_offsets_record(&kv, now);
                                loaded += 1;
                            }
                        }
                    } else if h.is_transactional() {
                        in_txn.entry(h.producer_id).or_default().extend(offsets_log::batch_records(&buf[..size]));
                    } else {
                        for kv in offsets_log::batch_records(&buf[..size]) {
                            if let Some((group, store_again)) = self.apply_offsets_record(&kv, now) {
                                restore_empty.insert(group, store_again);
                            }
                            loaded += 1;
                        }
                    }
                    next = h.next_offset();
                    buf = &buf[size..];
                }
                if next <= offset {
                    break;
                }
                offset = next;
            }
            for (pid, records) in in_txn {
                let pending = records
                    .iter()
                    .filter_map(|kv| {
                        match (OffsetsKey::decode(&kv.key), kv.value.as_deref().and_then(OffsetValue::decode)) {
                            (Some(OffsetsKey::Offset { group, topic, partition }), Some(v)) => {
                                Some(super::coordinator::PendingTxnOffset {
                                    group,
                                    tp: (topic, partition),
                                    offset: CommittedOffset {
                                        offset: v.offset,
                                        leader_epoch: v.leader_epoch,
                                        metadata: v.metadata,
                                        commit_timestamp: v.commit_timestamp,
                                    },
                                })
                            }
                            _ => None,
                        }
                    })
                    .collect();
                self.groups.add_txn_offsets(pid, p.index, pending);
            }
        }
        if loaded > 0 {
            tracing::info!(records = loaded, "loaded consumer group state from {OFFSETS_TOPIC}");
        }
        let ids: Vec<String> = restore_empty.into_iter().filter(|(_, again)| *again).map(|(g, _)| g).collect();
        self.groups.store_loaded_as_empty(&self.group_store(), &ids);
    }

    /// Applies one record; for a group metadata record, returns the group and whether it must
    /// be stored again as Empty.
    fn apply_offsets_record(&self, kv: &offsets_log::KeyValue, now: i64) -> Option<(String, bool)> {
        match OffsetsKey::decode(&kv.key) {
            Some(OffsetsKey::Offset { group, topic, partition }) => {
                let value = kv.value.as_deref().and_then(OffsetValue::decode).map(|v| CommittedOffset {
                    offset: v.offset,
                    leader_epoch: v.leader_epoch,
                    metadata: v.metadata,
                    commit_timestamp: v.commit_timestamp,
                });
                self.groups.load_offset(&group, (topic, partition), value);
                None
            }
            Some(OffsetsKey::Group { group }) => {
                let header = kv.value.as_deref().and_then(offsets_log::decode_group_header);
                let again = self.groups.load_group(&group, header, now);
                Some((group, again))
            }
            None => None,
        }
    }

    /// Forgets the groups of `__consumer_offsets` partition `p` after this broker stopped
    /// leading it.
    pub fn unload_groups(&self, p: i32) {
        let Some(topic) = self.cache.topic(OFFSETS_TOPIC) else { return };
        let count = topic.partitions.len() as i32;
        let n = self.groups.unload_groups(&self.group_store(), |g| partition_for(g, count) == p);
        if n > 0 {
            tracing::info!(partition = p, groups = n, "unloaded consumer groups: no longer their coordinator");
        }
    }

    /// Drives session and rebalance timeouts.
    pub fn spawn_group_timer(self: &Arc<Self>) {
        let b = self.clone();
        tokio::spawn(async move {
            // Session timeouts are seconds long; a tenth of a second is precise enough.
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
            loop {
                tick.tick().await;
                b.groups.tick(&b.group_store());
            }
        });
        let b = self.clone();
        tokio::spawn(async move {
            let every = b.groups.config().offsets_retention_check_interval_ms;
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(every));
            tick.tick().await;
            loop {
                tick.tick().await;
                let b2 = b.clone();
                // Expiry appends tombstones to __consumer_offsets: disk work, off the async workers.
                let _ = tokio::task::spawn_blocking(move || {
                    let retention = b2.groups.config().offsets_retention_ms;
                    b2.groups.expire_offsets(&b2.group_store(), crate::log::now_ms(), retention)
                })
                .await;
            }
        });
    }
}
