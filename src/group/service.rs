//! The group coordinator's runtime on this broker (Kafka's `GroupCoordinatorService` around
//! its coordinator): it runs the coordinator's steps, performs their effects once the
//! coordinator's lock is released (appends to `__consumer_offsets`, marks for the ZooKeeper
//! mirrors), loads and unloads groups with leadership of the offsets partitions, and drives
//! the timers.
//!
//! It sees the rest of the broker through the narrow handles below, wired in `broker.rs`: the
//! offsets topic as the metadata image and the replica manager show it, the znode store, and a
//! way to have the controller create the topic on first use.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::consumer::records::ConsumerRecord;
use super::consumer::{
    ConsumerGroupConfig, ConsumerGroupCoordinator, ConsumerStore, HeartbeatRequest, HeartbeatResult, TopicsView,
};
use super::coordinator::{
    ClassicSnapshot, CommittedOffset, CoordinatorConfig, Group, GroupCoordinator, GroupRecord, GroupState, GroupStore,
    JoinRequest, JoinResult, MemberRegistration, OffsetToCommit, PendingTxnOffset, SyncResult, TopicPartition,
};
use super::offsets_log::{self, OffsetValue, OffsetsKey, StoredMember};
use super::share::{
    MirrorChange, ShareGroupConfig, ShareGroupCoordinator, ShareHeartbeatRequest, ShareHeartbeatResult,
};
use super::zk_mirror::{MembershipMirror, OffsetMirror};
use super::{partition_for, OFFSETS_TOPIC};
use crate::config::MigrationPolicy;
use crate::io_pool::IoPool;
use crate::log::batch::{encode_batch, BatchHeader, BatchOptions, SimpleRecord};
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

/// `__consumer_offsets` as this broker sees it: the metadata image's view of the topic and
/// the partitions the replica manager hosts.
pub trait OffsetsPartitions: Send + Sync {
    /// The partitions the topic has in the metadata image; None while it does not exist.
    fn partition_count(&self) -> Option<i32>;
    /// Whether the image names this broker leader of partition `p`.
    fn leads_in_image(&self, p: i32) -> bool;
    /// Whether this broker leads partition `p` with its log open.
    fn is_local_leader(&self, p: i32) -> bool;
    /// Appends a batch as leader; Err is a Kafka error code.
    fn append(&self, p: i32, batch: Bytes) -> Result<(), i16>;
    /// Whether appending about `len` bytes to partition `p` could wait on the disk beyond a
    /// page-cache write (a roll or an fsync due, or the log busy).
    fn append_may_block(&self, p: i32, len: usize) -> bool;
    /// (log start, log end) of partition `p` here.
    fn log_range(&self, p: i32) -> Option<(i64, i64)>;
    /// Batches from `offset` up to the log end, at most about `max_bytes`; Err is a Kafka error code.
    fn read(&self, p: i32, offset: i64, max_bytes: usize) -> Result<Bytes, i16>;
    /// Whether the metadata image knows this partition (OffsetCommit's check).
    fn topic_partition_exists(&self, topic: &str, partition: i32) -> bool;
}

/// Creating `__consumer_offsets` on first use (FindCoordinator), through the controller.
pub trait OffsetsTopicCreator: Send + Sync {
    /// Ok(true) created (or requested), Ok(false) nothing to create; Err (code, message).
    fn create_offsets_topic(&self) -> Result<bool, (i16, String)>;
}

/// The znodes the mirrors write: the old offsets tree and `/consumers/<group>` membership.
pub trait GroupZnodes: Send + Sync {
    fn is_zookeeper(&self) -> bool;
    fn upsert_many(&self, writes: &[(String, String)]) -> Result<(), String>;
    fn delete_recursive(&self, path: &str) -> Result<(), String>;
    fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), String>;
    fn delete_own_ephemerals(&self, path: &str) -> Result<(), String>;
}

/// The handles and settings the service is built from.
pub struct GroupServiceHandles {
    pub broker_id: i32,
    pub coordinator: CoordinatorConfig,
    pub partitions: Arc<dyn OffsetsPartitions>,
    pub creator: Arc<dyn OffsetsTopicCreator>,
    pub znodes: Arc<dyn GroupZnodes>,
    pub io: Arc<IoPool>,
    /// `offsets.zookeeper.mirror.interval.ms` (None: off) and its writes per pass.
    pub offsets_zk_mirror_interval: Option<Duration>,
    pub offsets_zk_mirror_max_writes: usize,
    /// The consumer protocol's settings and the topics its subscriptions name.
    pub consumer: ConsumerGroupConfig,
    pub topics: Arc<dyn TopicsView>,
    /// Share groups' settings (KIP-932).
    pub share: ShareGroupConfig,
    /// Groups' own configs (GROUP config resources).
    pub group_configs: Arc<super::configs::GroupConfigs>,
}

pub struct GroupCoordinatorService {
    broker_id: i32,
    coordinator: GroupCoordinator,
    /// Groups of the consumer protocol (KIP-848); their committed offsets live with the
    /// classic groups' in `coordinator`.
    consumer: ConsumerGroupCoordinator,
    /// Share groups (KIP-932): membership only, kept in memory.
    share: ShareGroupCoordinator,
    partitions: Arc<dyn OffsetsPartitions>,
    creator: Arc<dyn OffsetsTopicCreator>,
    znodes: Arc<dyn GroupZnodes>,
    io: Arc<IoPool>,
    /// `__consumer_offsets` partitions whose groups are being loaded.
    loading: Mutex<HashSet<i32>>,
    /// Committed offsets waiting to be copied into ZooKeeper's old offsets tree.
    offsets_zk_mirror: OffsetMirror,
    offsets_zk_mirror_interval: Option<Duration>,
    offsets_zk_mirror_max_writes: usize,
    /// Group membership waiting to be written under `/consumers/<group>`.
    membership_zk_mirror: MembershipMirror,
}

impl GroupCoordinatorService {
    pub fn new(h: GroupServiceHandles) -> GroupCoordinatorService {
        let mirror_offsets = h.offsets_zk_mirror_interval.is_some() && h.znodes.is_zookeeper();
        GroupCoordinatorService {
            broker_id: h.broker_id,
            coordinator: GroupCoordinator::new(h.coordinator),
            consumer: ConsumerGroupCoordinator::new(h.consumer, h.topics.clone()),
            share: ShareGroupCoordinator::new(h.share, h.topics, h.group_configs),
            partitions: h.partitions,
            creator: h.creator,
            znodes: h.znodes,
            io: h.io,
            loading: Mutex::new(HashSet::new()),
            offsets_zk_mirror: OffsetMirror::new(mirror_offsets),
            offsets_zk_mirror_interval: h.offsets_zk_mirror_interval,
            offsets_zk_mirror_max_writes: h.offsets_zk_mirror_max_writes,
            membership_zk_mirror: MembershipMirror::default(),
        }
    }

    /// The pure state machine, for reads (DescribeGroups, ListGroups, OffsetFetch).
    pub fn coordinator(&self) -> &GroupCoordinator {
        &self.coordinator
    }

    /// The consumer protocol's groups, for reads (ConsumerGroupDescribe, ListGroups).
    pub fn consumer_groups(&self) -> &ConsumerGroupCoordinator {
        &self.consumer
    }

    /// Share groups, for reads (ShareGroupDescribe, ListGroups).
    pub fn share_groups(&self) -> &ShareGroupCoordinator {
        &self.share
    }

    // ---- request handlers' steps: each performs its effects before it returns ----

    /// ShareGroupHeartbeat. A group id names one kind of group: a live classic or consumer
    /// group's id is refused, as Kafka refuses it.
    pub fn share_heartbeat(&self, req: ShareHeartbeatRequest) -> ShareHeartbeatResult {
        let classic = self.coordinator.with_group(&req.group_id, |g| !g.members.is_empty()) == Some(true);
        if classic || self.consumer.has_members(&req.group_id) {
            return ShareHeartbeatResult {
                error_code: ErrorCode::GroupIdNotFound.code(),
                error_message: Some(format!("Group {} is not a share group.", req.group_id)),
                member_epoch: -1,
                ..Default::default()
            };
        }
        let mut changes = Vec::new();
        let result = self.share.heartbeat(req, &mut changes);
        self.mirror_share_changes(changes);
        result
    }

    fn mirror_share_changes(&self, changes: Vec<MirrorChange>) {
        for change in changes {
            match change {
                MirrorChange::Joined(group, member) => self.membership_zk_mirror.member_joined(&group, &member),
                MirrorChange::Left(group, member) => self.membership_zk_mirror.member_left(&group, &member),
            }
        }
    }

    pub async fn join(&self, req: JoinRequest) -> JoinResult {
        // A consumer group with members takes classic members too, unless migration is off.
        if self.consumer.has_members(&req.group_id) {
            let refuse = |code: ErrorCode| JoinResult {
                error_code: code.code(),
                generation_id: -1,
                member_id: req.member_id.clone(),
                ..Default::default()
            };
            if self.consumer.config().migration == MigrationPolicy::Disabled {
                return refuse(ErrorCode::InconsistentGroupProtocol);
            }
            let c = self.coordinator.config();
            if req.session_timeout_ms < c.min_session_timeout_ms || req.session_timeout_ms > c.max_session_timeout_ms {
                return refuse(ErrorCode::InvalidSessionTimeout);
            }
            if let Some(r) = self.consumer.classic_join(self, &req) {
                return r;
            }
        }
        self.coordinator.join(self, req).await
    }

    /// ConsumerGroupHeartbeat. Appends to `__consumer_offsets`: call it off the async workers.
    /// A classic group with members is converted first when the migration policy allows it
    /// and its members all use the consumer's embedded protocol; otherwise the group id is
    /// not a consumer group's, as Kafka answers.
    pub fn consumer_heartbeat(&self, req: HeartbeatRequest) -> HeartbeatResult {
        let not_found = |message: String| HeartbeatResult {
            error_code: ErrorCode::GroupIdNotFound.code(),
            error_message: Some(message),
            ..Default::default()
        };
        if self.share.has_members(&req.group_id) {
            return not_found(format!("Group {} is not a consumer group.", req.group_id));
        }
        if self.coordinator.with_group(&req.group_id, |g| !g.members.is_empty()) == Some(true) {
            // Only a joining member converts the group, as Kafka creates a consumer group only then.
            if req.member_epoch != 0 {
                return not_found(format!("Group {} is not a consumer group.", req.group_id));
            }
            if !self.consumer.config().migration.upgrade() {
                return not_found(format!(
                    "Cannot upgrade classic group {} to consumer group because the online upgrade is disabled.",
                    req.group_id
                ));
            }
            if let Some(Err(e)) = self.coordinator.upgrade(self, &req.group_id, |s| self.consumer.adopt_classic(s)) {
                tracing::info!(group = %req.group_id, "{e}");
                return not_found(e);
            }
        }
        self.consumer.heartbeat(self, req)
    }

    /// Whether `group_id` names a group of the consumer protocol here: one exists, and no
    /// classic group of that id has members (a classic group may start in an empty consumer
    /// group's id; the group with members is the one clients see).
    pub fn is_consumer_group(&self, group_id: &str) -> bool {
        self.consumer.contains(group_id)
            && self.coordinator.with_group(group_id, |g| g.members.is_empty()) != Some(false)
    }

    /// OffsetFetch v9+'s member check for groups of the consumer protocol.
    pub fn validate_offset_fetch(&self, group_id: &str, member_id: Option<&str>, member_epoch: i32) -> Result<(), i16> {
        self.consumer.validate_fetch(group_id, member_id, member_epoch)
    }

    pub async fn sync(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncResult {
        if let Some(r) = self.consumer.classic_sync(group_id, generation, member_id) {
            return r;
        }
        self.coordinator.sync(self, group_id, generation, member_id, instance_id, assignments).await
    }

    pub fn heartbeat(&self, group_id: &str, generation: i32, member_id: &str, instance_id: Option<&str>) -> i16 {
        if let Some(code) = self.consumer.classic_heartbeat(group_id, generation, member_id) {
            return code;
        }
        self.coordinator.heartbeat(group_id, generation, member_id, instance_id)
    }

    pub fn leave(&self, group_id: &str, members: &[(String, Option<String>)]) -> Result<Vec<i16>, i16> {
        if let Some(codes) = self.consumer.classic_leave(self, group_id, members) {
            return Ok(codes);
        }
        self.coordinator.leave(self, group_id, members)
    }

    pub fn commit_offsets(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        offsets: Vec<OffsetToCommit>,
    ) -> Vec<(TopicPartition, i16)> {
        // A consumer-protocol group checks the member and its epoch itself; its offsets are
        // then stored as a commit from outside any classic generation.
        match self.consumer.validate_commit(group_id, member_id, generation) {
            Some(Err(code)) => offsets.into_iter().map(|(tp, ..)| (tp, code)).collect(),
            Some(Ok(())) => self.coordinator.commit_offsets(self, group_id, -1, "", offsets),
            None => self.coordinator.commit_offsets(self, group_id, generation, member_id, offsets),
        }
    }

    /// Whether committing `offsets` may wait on the disk: then the caller runs the commit on
    /// the I/O pool, as the produce path does with such appends; otherwise the page-cache write
    /// costs less than the hop.
    pub fn commit_may_block(&self, group_id: &str, offsets: &[OffsetToCommit]) -> bool {
        let Some(p) = self.offsets_partition(group_id) else { return false };
        // A bound above each record's size: key (version, group, topic, partition) and value
        // (version, offset, leader epoch, metadata, timestamps), plus the batch header.
        let len = 61
            + offsets
                .iter()
                .map(|((topic, _), _, _, meta)| {
                    64 + group_id.len() + topic.len() + meta.as_ref().map_or(0, String::len)
                })
                .sum::<usize>();
        self.partitions.append_may_block(p, len)
    }

    pub fn fetch_offsets(
        &self,
        group_id: &str,
        wanted: Option<Vec<TopicPartition>>,
    ) -> Vec<(TopicPartition, Option<CommittedOffset>)> {
        self.coordinator.fetch_offsets(group_id, wanted)
    }

    pub fn delete_offsets(
        &self,
        group_id: &str,
        tps: Vec<TopicPartition>,
        subscribed: impl Fn(&Group, &str) -> bool,
    ) -> Result<Vec<(TopicPartition, i16)>, i16> {
        // A consumer-protocol group's members keep the offsets of the topics they subscribe to.
        let in_use = self
            .consumer
            .with_group(group_id, |g| {
                g.members.values().flat_map(|m| m.subscribed_topic_names.iter().cloned()).collect::<HashSet<String>>()
            })
            .unwrap_or_default();
        if in_use.is_empty() {
            return self.coordinator.delete_offsets(self, group_id, tps, subscribed);
        }
        let (kept, free): (Vec<TopicPartition>, Vec<TopicPartition>) =
            tps.into_iter().partition(|(topic, _)| in_use.contains(topic));
        let mut results = match free.is_empty() {
            true => Vec::new(),
            false => self.coordinator.delete_offsets(self, group_id, free, subscribed)?,
        };
        results.extend(kept.into_iter().map(|tp| (tp, ErrorCode::GroupSubscribedToTopic.code())));
        Ok(results)
    }

    pub fn delete_group(&self, group_id: &str) -> i16 {
        match self.consumer.delete_group(self, group_id) {
            Some(code) if code != ErrorCode::None.code() => code,
            // Its offsets, kept with the classic groups', go with it.
            Some(_) => match self.coordinator.delete_group(self, group_id) {
                code if code == ErrorCode::GroupIdNotFound.code() => ErrorCode::None.code(),
                code => code,
            },
            None => self.coordinator.delete_group(self, group_id),
        }
    }

    pub fn with_group<R>(&self, group_id: &str, f: impl FnOnce(&Group) -> R) -> Option<R> {
        self.coordinator.with_group(group_id, f)
    }

    pub fn list(&self) -> Vec<(String, String, GroupState)> {
        self.coordinator.list()
    }

    // ---- transactional offsets (the transaction coordinator's side) ----

    pub fn add_txn_offsets(&self, producer_id: i64, partition: i32, offsets: Vec<PendingTxnOffset>) {
        self.coordinator.add_txn_offsets(producer_id, partition, offsets);
    }

    pub fn complete_txn_offsets(&self, producer_id: i64, partition: i32, commit: bool) {
        self.coordinator.complete_txn_offsets(producer_id, partition, commit);
    }

    pub fn pending_txn_partitions(&self, group: &str) -> HashSet<TopicPartition> {
        self.coordinator.pending_txn_partitions(group)
    }

    // ---- where groups live ----

    /// The `__consumer_offsets` partition of `group`, hashed over the partitions the topic
    /// really has (Kafka reads the count from ZooKeeper): a topic created with another count,
    /// before `offsets.topic.num.partitions` changed or by a client, must keep every group
    /// where its offsets already are. None while the topic does not exist.
    pub fn offsets_partition(&self, group: &str) -> Option<i32> {
        Some(partition_for(group, self.partitions.partition_count()?))
    }

    /// Whether this broker coordinates `group` (leads its `__consumer_offsets` partition):
    /// NOT_COORDINATOR sends the client back to FindCoordinator after leadership moved.
    pub fn check_coordinator(&self, group: &str) -> Result<(), i16> {
        // A broker that has not yet learnt of `__consumer_offsets` (it was just created
        // elsewhere) leads none of it: NOT_COORDINATOR, which clients answer by asking
        // FindCoordinator again, where COORDINATOR_NOT_AVAILABLE fails librdkafka's committed().
        let p = self.offsets_partition(group).ok_or(ErrorCode::NotCoordinator.code())?;
        if self.partitions.is_local_leader(p) {
            return if self.is_loading(p) { Err(ErrorCode::CoordinatorLoadInProgress.code()) } else { Ok(()) };
        }
        // Named leader in the image while its log is still being opened (a topic just
        // created): the coordinator is on its way, so the client retries here instead of
        // taking NOT_COORDINATOR, which librdkafka's synchronous commit returns as is.
        if self.partitions.leads_in_image(p) {
            return Err(ErrorCode::CoordinatorLoadInProgress.code());
        }
        Err(ErrorCode::NotCoordinator.code())
    }

    /// FindCoordinator's first step: the topic, created on first use as Kafka does.
    pub fn ensure_offsets_topic(&self) -> Result<(), i16> {
        if self.partitions.partition_count().is_some() {
            return Ok(());
        }
        match self.creator.create_offsets_topic() {
            Ok(true) => Ok(()),
            Ok(false) => Err(ErrorCode::CoordinatorNotAvailable.code()),
            Err(_) if self.partitions.partition_count().is_some() => Ok(()),
            // Created by another broker; this one learns of it on its next ZooKeeper pass.
            Err((code, _)) if code == ErrorCode::TopicAlreadyExists.code() => {
                Err(ErrorCode::CoordinatorNotAvailable.code())
            }
            // Fewer brokers alive than offsets.topic.replication.factor: clients ask again
            // until there are enough, so this is not worth a warning per request.
            Err((code, e)) if code == ErrorCode::InvalidReplicationFactor.code() => {
                tracing::debug!(error = %e, "cannot create {OFFSETS_TOPIC} yet");
                Err(ErrorCode::CoordinatorNotAvailable.code())
            }
            Err((_, e)) => {
                tracing::warn!(error = %e, "cannot create {OFFSETS_TOPIC}");
                Err(ErrorCode::CoordinatorNotAvailable.code())
            }
        }
    }

    pub fn set_loading(&self, partition: i32, loading: bool) {
        let mut set = self.loading.lock_unpoisoned();
        if loading {
            set.insert(partition);
        } else {
            set.remove(&partition);
        }
    }

    pub fn is_loading(&self, partition: i32) -> bool {
        self.loading.lock_unpoisoned().contains(&partition)
    }

    /// This broker's id, for the coordinator lookups of `broker.rs`.
    pub fn broker_id(&self) -> i32 {
        self.broker_id
    }

    // ---- leadership of the offsets partitions ----

    /// Replays `__consumer_offsets` into the coordinator (at startup, before serving).
    /// `only`: one partition (this broker just became its leader); None: every one it leads.
    pub fn load_groups(&self, only: Option<i32>) {
        let Some(count) = self.partitions.partition_count() else { return };
        if let Some(p) = only {
            // What an earlier term as coordinator left in memory is not the log's state.
            self.coordinator.unload_groups(self, |g| partition_for(g, count) == p);
            self.consumer.unload(self, |g| partition_for(g, count) == p);
        }
        let now = crate::log::now_ms();
        let mut loaded = 0usize;
        let mut restore_empty: HashMap<String, bool> = HashMap::new();
        for p in (0..count).filter(|p| only.is_none_or(|o| o == *p)) {
            let Some((mut offset, end)) = self.partitions.log_range(p) else { continue };
            // Offsets committed in transactions wait for their marker, as they did when written.
            let mut in_txn: HashMap<i64, Vec<offsets_log::KeyValue>> = HashMap::new();
            while offset < end {
                let records = match self.partitions.read(p, offset, 1 << 20) {
                    Ok(r) if !r.is_empty() => r,
                    _ => break,
                };
                let mut buf = &records[..];
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
                                Some(PendingTxnOffset { group, tp: (topic, partition), offset: committed(v) })
                            }
                            _ => None,
                        }
                    })
                    .collect();
                self.coordinator.add_txn_offsets(pid, p, pending);
            }
        }
        if loaded > 0 {
            tracing::info!(records = loaded, "loaded consumer group state from {OFFSETS_TOPIC}");
        }
        let ids: Vec<String> = restore_empty.into_iter().filter(|(_, again)| *again).map(|(g, _)| g).collect();
        self.coordinator.store_loaded_as_empty(self, &ids);
        self.consumer.finish_load(self, |g| only.is_none_or(|p| partition_for(g, count) == p));
    }

    /// Applies one record; for a group metadata record, returns the group and whether it must
    /// be stored again as Empty.
    fn apply_offsets_record(&self, kv: &offsets_log::KeyValue, now: i64) -> Option<(String, bool)> {
        match OffsetsKey::decode(&kv.key) {
            Some(OffsetsKey::Offset { group, topic, partition }) => {
                let value = kv.value.as_deref().and_then(OffsetValue::decode).map(committed);
                self.coordinator.load_offset(&group, (topic, partition), value);
                None
            }
            Some(OffsetsKey::Group { group }) => {
                let header = kv.value.as_deref().and_then(offsets_log::decode_group_header);
                let again = self.coordinator.load_group(&group, header, now);
                Some((group, again))
            }
            None => {
                if let Some(record) = ConsumerRecord::decode(&kv.key, kv.value.as_deref()) {
                    self.consumer.replay(record);
                }
                None
            }
        }
    }

    /// Forgets the groups of `__consumer_offsets` partition `p` after this broker stopped
    /// leading it.
    pub fn unload_groups(&self, p: i32) {
        let Some(count) = self.partitions.partition_count() else { return };
        let n = self.coordinator.unload_groups(self, |g| partition_for(g, count) == p)
            + self.consumer.unload(self, |g| partition_for(g, count) == p);
        self.share.unload(|g| partition_for(g, count) == p);
        if n > 0 {
            tracing::info!(partition = p, groups = n, "unloaded consumer groups: no longer their coordinator");
        }
    }

    /// Kafka's `GroupCoordinator.onPartitionsDeleted`, called wherever this broker learns that
    /// partitions were deleted: committed offsets for them must not outlive the topic (a topic
    /// created again under the name starts at offset 0, and tools describing a group would
    /// ask for the old topic's offsets). Appends to `__consumer_offsets`: call it off the async
    /// workers.
    pub fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        let removed = self.coordinator.on_partitions_deleted(self, deleted);
        if removed > 0 {
            tracing::info!(
                partitions = deleted.len(),
                offsets = removed,
                "removed committed offsets of deleted partitions"
            );
        }
    }

    // ---- background work ----

    /// Starts the timers (session and rebalance timeouts, offsets expiry) and the ZooKeeper
    /// mirrors.
    pub fn start(self: &Arc<Self>) {
        self.spawn_timers();
        super::zk_mirror::spawn_offsets_mirror(self.clone());
        super::zk_mirror::spawn_membership_mirror(self.clone());
    }

    fn spawn_timers(self: &Arc<Self>) {
        let s = self.clone();
        tokio::spawn(async move {
            // Session timeouts are seconds long; a tenth of a second is precise enough.
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                // The step is memory only; what it leaves (records of emptied groups) is
                // appended on the I/O pool.
                let stripes = s.coordinator.tick_step();
                if !stripes.is_empty() {
                    let s2 = s.clone();
                    let _ = s.io.run(move || s2.coordinator.perform(&*s2, &stripes)).await;
                }
                let mut changes = Vec::new();
                s.share.tick(&mut changes);
                s.mirror_share_changes(changes);
                if s.consumer.tick_step() {
                    let s2 = s.clone();
                    let _ = s.io.run(move || s2.consumer.perform(&*s2)).await;
                }
            }
        });
        let s = self.clone();
        tokio::spawn(async move {
            let every = s.coordinator.config().offsets_retention_check_interval_ms;
            let mut tick = tokio::time::interval(Duration::from_millis(every));
            tick.tick().await;
            loop {
                tick.tick().await;
                let s2 = s.clone();
                // Expiry appends tombstones to __consumer_offsets: disk work, off the async workers.
                let _ =
                    s.io.run(move || {
                        let retention = s2.coordinator.config().offsets_retention_ms;
                        let live = s2.consumer.list_with_members();
                        s2.coordinator.expire_offsets_except(&*s2, crate::log::now_ms(), retention, &live)
                    })
                    .await;
            }
        });
    }

    pub(super) fn znodes(&self) -> &dyn GroupZnodes {
        &*self.znodes
    }

    pub(super) fn offsets_mirror(&self) -> (&OffsetMirror, Option<Duration>, usize) {
        (&self.offsets_zk_mirror, self.offsets_zk_mirror_interval, self.offsets_zk_mirror_max_writes)
    }

    pub(super) fn membership_mirror(&self) -> &MembershipMirror {
        &self.membership_zk_mirror
    }

    fn append(&self, group: &str, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), i16> {
        // A batch of no records is invalid on disk (the log refuses it with INVALID_RECORD),
        // and there is nothing to persist: e.g. DeleteGroups after OffsetDelete removed all.
        if records.is_empty() {
            return Ok(());
        }
        let p = self.offsets_partition(group).ok_or(ErrorCode::NotCoordinator.code())?;
        let ts = crate::log::now_ms();
        let simple: Vec<SimpleRecord<'_>> = records
            .iter()
            .map(|(k, v)| SimpleRecord { timestamp: ts, key: Some(k), value: v.as_deref(), headers: vec![] })
            .collect();
        let batch = encode_batch(&BatchOptions::default(), &simple);
        self.partitions.append(p, batch.into())
    }
}

fn committed(v: OffsetValue) -> CommittedOffset {
    CommittedOffset {
        offset: v.offset,
        leader_epoch: v.leader_epoch,
        metadata: v.metadata,
        commit_timestamp: v.commit_timestamp,
    }
}

/// The service performs the coordinator's effects.
impl GroupStore for GroupCoordinatorService {
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
            self.offsets_zk_mirror.record(group, topic, *partition, value.as_ref().map(|v| v.offset));
        }
        Ok(())
    }

    fn store_group(&self, group: &GroupRecord) -> Result<(), i16> {
        let key = OffsetsKey::Group { group: group.id.clone() }.encode();
        if group.state == GroupState::Dead {
            return self.append(&group.id, vec![(key, None)]);
        }
        let members: Vec<StoredMember<'_>> = group
            .members
            .iter()
            .map(|m| StoredMember {
                member_id: &m.id,
                instance_id: m.instance_id.as_deref(),
                client_id: &m.client_id,
                client_host: &m.client_host,
                rebalance_timeout: m.rebalance_timeout_ms,
                session_timeout: m.session_timeout_ms,
                subscription: &m.subscription,
                assignment: &m.assignment,
            })
            .collect();
        let value = offsets_log::encode_group_value(
            group.protocol_type.as_deref().unwrap_or(""),
            group.generation,
            group.protocol_name.as_deref(),
            group.leader.as_deref(),
            group.current_state_timestamp.unwrap_or_else(crate::log::now_ms),
            &members,
        );
        self.append(&group.id, vec![(key, Some(value))])
    }

    fn topic_partition_exists(&self, topic: &str, partition: i32) -> bool {
        self.partitions.topic_partition_exists(topic, partition)
    }

    // Marks only: ZooKeeper (or the embedded store's journal) is written by a background task.
    fn member_joined(&self, group: &str, member: &MemberRegistration) {
        self.membership_zk_mirror.member_joined(group, member);
    }

    fn member_left(&self, group: &str, member_id: &str) {
        self.membership_zk_mirror.member_left(group, member_id);
    }

    fn owners_changed(&self, group: &str, owners: &[(String, i32, String)]) {
        self.membership_zk_mirror.owners_changed(group, owners);
    }
}

/// The service performs the consumer protocol's effects the same way.
impl ConsumerStore for GroupCoordinatorService {
    fn append(&self, group: &str, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), i16> {
        GroupCoordinatorService::append(self, group, records)
    }

    fn member_joined(&self, group: &str, member: &MemberRegistration) {
        self.membership_zk_mirror.member_joined(group, member);
    }

    fn member_left(&self, group: &str, member_id: &str) {
        self.membership_zk_mirror.member_left(group, member_id);
    }

    fn owners_changed(&self, group: &str, owners: &[(String, i32, String)]) {
        self.membership_zk_mirror.owners_changed(group, owners);
    }

    fn downgrade(&self, snapshot: ClassicSnapshot) {
        self.coordinator.downgrade(self, snapshot);
    }
}

#[cfg(test)]
mod tests;
