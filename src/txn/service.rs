//! The transaction coordinator at work on this broker: which `__transaction_state` partition
//! holds a transactional id, writing its states there, loading them when this broker takes a
//! partition over, sending the markers that end a transaction, and aborting transactions
//! that outlive their timeout.
//!
//! Each step follows the coordinator's rule: decide under its lock (`coordinator`), then write
//! the new state to the log and wait for the ISR to have it, then apply it. Markers go to the
//! partition leaders after PrepareCommit/PrepareAbort is in the log, and Complete* is written
//! once every leader has its marker; a coordinator that takes over finds Prepare* in the log
//! and sends the markers again (a leader that already has one writes a second, which
//! consumers skip like the first).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::{AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ProducerId, TransactionalId};
use kafka_protocol::protocol::StrBytes;

use super::coordinator::{InitStep, TransactionCoordinator};
use super::handles::{LocalPartitions, MarkerListener, TransactionTopicCreator};
use super::inter_broker::{by_topic, pooled_round_trip};
use super::producer_id::ProducerIdManager;
use super::state::TxnMetadata;
use super::txn_log::{self, TxnLogValue};
use crate::config::BrokerConfig;
use crate::io_pool::IoPool;
use crate::log::batch::{encode_batch, BatchHeader, BatchOptions, SimpleRecord};
use crate::metadata::{CoordinatorAt, MetadataCache, StoreError, ZnodeStore};
use crate::protocol::internal_topics::TRANSACTION_STATE_TOPIC;
use crate::protocol::ErrorCode;
use crate::security::client::InterBrokerClient;

mod markers;

/// The longest pause between rounds of markers, and before a failed completion write is
/// tried again. Kafka has no key for it: its marker sender retries on its next pass, with
/// the reconnect backoff of its client fixed at 50 ms; doubling from 20 ms up to this keeps
/// a leaderless partition from being asked in a tight loop.
pub(super) const MARKER_RETRY_MAX: Duration = Duration::from_secs(1);

/// One partition's answer to a marker: (topic, partition) and the error code.
pub type MarkerResult = ((String, i32), i16);

/// What the service is built from: the coordinator's state and the few handles its effects
/// need, all wired by the broker.
pub struct TransactionHandles {
    pub coordinator: TransactionCoordinator,
    pub producer_ids: ProducerIdManager,
    pub config: Arc<BrokerConfig>,
    pub cache: Arc<MetadataCache>,
    pub store: Arc<ZnodeStore>,
    pub partitions: Arc<dyn LocalPartitions>,
    pub io: Arc<IoPool>,
    pub inter_broker: Arc<InterBrokerClient>,
    pub topic_creator: Arc<dyn TransactionTopicCreator>,
    pub markers: Arc<dyn MarkerListener>,
}

/// The transaction coordinator at work (Kafka's `TransactionCoordinator` with its state
/// manager and marker channel): steps decide under the coordinator's lock, and the state
/// appends, markers and ZooKeeper writes they call for run here after it is released.
pub struct TransactionService {
    coordinator: TransactionCoordinator,
    producer_ids: ProducerIdManager,
    config: Arc<BrokerConfig>,
    cache: Arc<MetadataCache>,
    store: Arc<ZnodeStore>,
    partitions: Arc<dyn LocalPartitions>,
    io: Arc<IoPool>,
    inter_broker: Arc<InterBrokerClient>,
    topic_creator: Arc<dyn TransactionTopicCreator>,
    markers: Arc<dyn MarkerListener>,
    /// For the steps that hold `&self` and start tasks that keep the service (loads).
    self_ref: Weak<TransactionService>,
}

impl TransactionService {
    pub fn new(h: TransactionHandles) -> Arc<TransactionService> {
        Arc::new_cyclic(|me| TransactionService {
            coordinator: h.coordinator,
            producer_ids: h.producer_ids,
            config: h.config,
            cache: h.cache,
            store: h.store,
            partitions: h.partitions,
            io: h.io,
            inter_broker: h.inter_broker,
            topic_creator: h.topic_creator,
            markers: h.markers,
            self_ref: me.clone(),
        })
    }

    fn arc(&self) -> Option<Arc<TransactionService>> {
        self.self_ref.upgrade()
    }

    /// The transactional ids' states, for the handlers that only read them (DescribeTransactions,
    /// ListTransactions, verify-only AddPartitionsToTxn).
    pub fn coordinator(&self) -> &TransactionCoordinator {
        &self.coordinator
    }

    /// A producer id for an idempotent or transactional producer. Claiming a new block is a
    /// ZooKeeper write: it runs on the blocking pool, never on an async worker.
    pub async fn next_producer_id(self: &Arc<Self>) -> Result<i64, StoreError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.producer_ids.next_id())
            .await
            .map_err(|e| StoreError::Io(std::io::Error::other(format!("producer id allocation failed: {e}"))))?
    }

    /// `__transaction_state` is about to be led here: requests wait until it is loaded.
    pub fn set_loading(&self, partition: i32, loading: bool) {
        self.coordinator.set_loading(partition, loading);
    }

    /// A partition stopped being hosted here: forget what it verified.
    pub fn forget_partition(&self, tp: &(String, i32)) {
        self.coordinator.forget_partition(tp);
    }

    /// The `__transaction_state` partition of `id`, hashed over the partitions the topic
    /// really has (as for groups: a topic created with another count keeps every id where
    /// its state already is).
    pub fn txn_partition_for(&self, id: &str) -> Option<i32> {
        let topic = self.cache.topic(TRANSACTION_STATE_TOPIC)?;
        Some(crate::group::partition_for(id, topic.partitions.len() as i32))
    }

    /// Whether this broker coordinates `id`; its partition if so.
    pub fn check_txn_coordinator(&self, id: &str) -> Result<i32, i16> {
        // As for groups: not knowing the topic yet means not leading any of it.
        let p = self.txn_partition_for(id).ok_or(ErrorCode::NotCoordinator.code())?;
        match self.partitions.leader_partition(TRANSACTION_STATE_TOPIC, p) {
            Some(_) if self.coordinator.is_loading(p) => Err(ErrorCode::CoordinatorLoadInProgress.code()),
            Some(_) if self.coordinator.coordinator_epoch(p).is_none() => {
                Err(ErrorCode::CoordinatorLoadInProgress.code())
            }
            Some(_) => Ok(p),
            None => Err(ErrorCode::NotCoordinator.code()),
        }
    }

    /// FindCoordinator for a transactional id: the leader of its `__transaction_state`
    /// partition, creating the topic on first use as Kafka does.
    pub fn txn_coordinator_for(&self, id: &str, listener: &str) -> Result<(i32, String, u16), i16> {
        if self.cache.topic(TRANSACTION_STATE_TOPIC).is_none() {
            self.create_txn_topic()?;
        }
        self.coordinator_of(id, listener)
    }

    /// The leader of `id`'s `__transaction_state` partition, with its address on `listener`.
    fn coordinator_of(&self, id: &str, listener: &str) -> Result<(i32, String, u16), i16> {
        let me = self.config.broker_id;
        let at =
            self.cache.coordinator_at(TRANSACTION_STATE_TOPIC, |n| crate::group::partition_for(id, n), me, listener)?;
        match at {
            CoordinatorAt::Broker { id, host, port } => Ok((id, host, port)),
            CoordinatorAt::Here { partition } => {
                // Named leader but the partition not open here yet: not available keeps the
                // client asking FindCoordinator, which it retries by itself.
                if self.partitions.leader_partition(TRANSACTION_STATE_TOPIC, partition).is_none() {
                    return Err(ErrorCode::CoordinatorNotAvailable.code());
                }
                let ep = self.config.advertised_for(listener).ok_or(ErrorCode::CoordinatorNotAvailable.code())?;
                Ok((me, ep.host.clone(), ep.port))
            }
        }
    }

    fn create_txn_topic(&self) -> Result<(), i16> {
        match self.topic_creator.create_transaction_state_topic() {
            Ok(true) => {
                if !self.store.is_zookeeper() {
                    // Standalone, leadership is taken at creation: nothing to load but the
                    // coordinator epochs.
                    self.load_txns(None);
                }
                Ok(())
            }
            Ok(false) => Err(ErrorCode::CoordinatorNotAvailable.code()),
            Err(_) if self.cache.topic(TRANSACTION_STATE_TOPIC).is_some() => Ok(()),
            Err(e) => {
                // Too few brokers for the replication factor, or another broker is creating
                // it: clients ask again.
                tracing::debug!(error = %e, "cannot create {TRANSACTION_STATE_TOPIC} yet");
                Err(ErrorCode::CoordinatorNotAvailable.code())
            }
        }
    }

    /// A transactional produce to `topic`-`partition`: refused unless the transaction added
    /// the partition (`transaction.partition.verification.enable`, KIP-890 part 1). When this
    /// broker coordinates the id the state is at hand; otherwise the coordinator elsewhere
    /// was asked before the append (`verify_with_coordinator`), and `remote` holds its answer
    /// for partitions not already confirmed.
    pub fn verify_txn_produce(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        tp: &(String, i32),
        remote: &HashMap<(String, i32), i16>,
    ) -> Result<(), i16> {
        if self.check_txn_coordinator(id).is_ok() {
            return self.coordinator.verify_partition(id, pid, epoch, tp);
        }
        if !self.coordinator.config().verify_partitions || self.coordinator.is_verified(tp, pid, epoch) {
            return Ok(());
        }
        match remote.get(tp).copied() {
            // Confirmed by this request, and no marker since (it would have forgotten it).
            Some(code) if code == ErrorCode::None.code() && self.coordinator.is_verified(tp, pid, epoch) => Ok(()),
            Some(code) if code == ErrorCode::None.code() => Err(ErrorCode::NotEnoughReplicas.code()),
            Some(code) => Err(code),
            // Not asked (the coordinator moved here or away between the two looks): retriable.
            None => Err(ErrorCode::NotEnoughReplicas.code()),
        }
    }

    /// Keeps of `tps` (partitions this broker leads) those the transaction's coordinator on
    /// another broker must confirm: none when it is this broker or verification is off.
    pub fn needs_remote_verification(&self, id: &str, pid: i64, epoch: i16, tps: &mut Vec<(String, i32)>) {
        if !self.coordinator.config().verify_partitions || self.check_txn_coordinator(id).is_ok() {
            tps.clear();
            return;
        }
        tps.retain(|tp| !self.coordinator.is_verified(tp, pid, epoch));
    }

    /// AddPartitionsToTxn v4 with verify_only to the coordinator of `id`, as a partition
    /// leader sends it before a transactional append. Returns the code the producer gets per
    /// partition: the coordinator's answer with fencing as INVALID_PRODUCER_EPOCH, and
    /// anything that says "not now" (coordinator moving, unreachable, busy) as the retriable
    /// NOT_ENOUGH_REPLICAS, as Kafka's leader answers. Confirmed partitions are remembered
    /// until their marker.
    pub async fn verify_with_coordinator(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        tps: &[(String, i32)],
    ) -> HashMap<(String, i32), i16> {
        let all = |code: i16| tps.iter().map(|tp| (tp.clone(), code)).collect::<HashMap<_, _>>();
        let Some(p) = self.txn_partition_for(id) else { return all(ErrorCode::NotEnoughReplicas.code()) };
        let snapshot = self.cache.snapshot();
        let leader = snapshot
            .topics
            .get(TRANSACTION_STATE_TOPIC)
            .and_then(|t| t.partitions.iter().find(|x| x.index == p))
            .map(|x| x.leader);
        let Some(b) = leader.and_then(|l| snapshot.brokers.iter().find(|b| b.id == l)) else {
            return all(ErrorCode::NotEnoughReplicas.code());
        };
        let rounds: HashMap<(String, i32), u64> =
            tps.iter().map(|tp| (tp.clone(), self.coordinator.verification_round(tp))).collect();
        let topics = by_topic(tps)
            .into_iter()
            .map(|(name, partitions)| {
                let mut x = AddPartitionsToTxnTopic::default();
                x.name = name;
                x.partitions = partitions;
                x
            })
            .collect();
        let mut txn = AddPartitionsToTxnTransaction::default();
        txn.transactional_id = TransactionalId(StrBytes::from_string(id.to_string()));
        txn.producer_id = ProducerId(pid);
        txn.producer_epoch = epoch;
        txn.verify_only = true;
        txn.topics = topics;
        let mut req = AddPartitionsToTxnRequest::default();
        req.transactions = vec![txn];
        let (host, port) = (b.host.clone(), b.port);
        let client_id = format!("gregor-txn-verify-{}", self.config.broker_id);
        let max = self.config.socket_request_max_bytes;
        // The inter-broker listener's protocol (TLS, SASL), as every broker-to-broker request.
        let connector = &self.inter_broker;
        let key = kafka_protocol::messages::ApiKey::AddPartitionsToTxn;
        let call =
            pooled_round_trip::<_, AddPartitionsToTxnResponse>(connector, &host, port, &client_id, key, 4, &req, max);
        let resp = match tokio::time::timeout(self.inter_broker.request_timeout, call).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::debug!(transactional_id = id, error = %e, "cannot verify a transactional produce");
                return all(ErrorCode::NotEnoughReplicas.code());
            }
            Err(_) => return all(ErrorCode::NotEnoughReplicas.code()),
        };
        // The producer is not shown the broker's own authorization problem: its write is
        // simply not verified.
        if resp.error_code == ErrorCode::ClusterAuthorizationFailed.code() {
            return all(ErrorCode::InvalidTxnState.code());
        }
        if resp.error_code != ErrorCode::None.code() {
            return all(ErrorCode::NotEnoughReplicas.code());
        }
        let mut out = all(ErrorCode::NotEnoughReplicas.code());
        for r in resp.results_by_transaction.iter().filter(|r| r.transactional_id.0.as_str() == id) {
            for t in &r.topic_results {
                for pr in &t.results_by_partition {
                    let tp = (t.name.0.to_string(), pr.partition_index);
                    if !out.contains_key(&tp) {
                        continue;
                    }
                    let code = match ErrorCode::from_code(pr.partition_error_code) {
                        Some(ErrorCode::ProducerFenced) => ErrorCode::InvalidProducerEpoch.code(),
                        Some(
                            ErrorCode::NotCoordinator
                            | ErrorCode::CoordinatorNotAvailable
                            | ErrorCode::CoordinatorLoadInProgress
                            | ErrorCode::ConcurrentTransactions,
                        ) => ErrorCode::NotEnoughReplicas.code(),
                        _ => pr.partition_error_code,
                    };
                    // A marker written here while the question was out may have ended
                    // the transaction the answer speaks of: ask again.
                    let code = match rounds.get(&tp) {
                        Some(&round)
                            if code == ErrorCode::None.code()
                                && !self.coordinator.mark_verified(&tp, pid, epoch, round) =>
                        {
                            ErrorCode::NotEnoughReplicas.code()
                        }
                        _ => code,
                    };
                    out.insert(tp, code);
                }
            }
        }
        out
    }

    /// Writes `target` as `id`'s state and waits until the partition's ISR has it. The caller
    /// applies or abandons it with `complete_write`.
    async fn persist_txn(self: &Arc<Self>, id: &str, target: &TxnMetadata) -> Result<(), i16> {
        let p = self.txn_partition_for(id).ok_or(ErrorCode::NotCoordinator.code())?;
        let partition =
            self.partitions.leader_partition(TRANSACTION_STATE_TOPIC, p).ok_or(ErrorCode::NotCoordinator.code())?;
        let min_isr = self
            .cache
            .topic(TRANSACTION_STATE_TOPIC)
            .and_then(|t| t.configs.get("min.insync.replicas").and_then(|v| v.parse::<usize>().ok()))
            .unwrap_or(1);
        // Standalone, the topic has the one replica there will ever be (its factor is capped
        // at creation), so Kafka's default min ISR of 2 cannot apply.
        let min_isr = if self.store.is_zookeeper() { min_isr } else { 1 };
        if partition.isr_len() < min_isr {
            return Err(ErrorCode::CoordinatorNotAvailable.code());
        }
        let key = txn_log::encode_key(id);
        let value = target.to_value().encode();
        let batch = encode_batch(
            &BatchOptions::default(),
            &[SimpleRecord { timestamp: crate::log::now_ms(), key: Some(&key), value: Some(&value), headers: vec![] }],
        );
        // Never under the coordinator's lock (the step that produced `target` has released
        // it). The produce path's rule: a page-cache write is done here, since a hop to the
        // I/O pool costs more than the write; one that may roll or fsync goes to the pool.
        let (code, last_offset) = if partition.append_may_block(&batch) {
            let part = partition.clone();
            self.io
                .run(move || part.append(Bytes::from(batch)))
                .await
                .map_err(|_| ErrorCode::CoordinatorNotAvailable.code())?
        } else {
            partition.append(Bytes::from(batch))
        };
        match code {
            0 => {}
            code if code == ErrorCode::NotLeaderOrFollower.code() => return Err(ErrorCode::NotCoordinator.code()),
            code => {
                tracing::warn!(transactional_id = id, error = code, "cannot write transaction state");
                return Err(ErrorCode::CoordinatorNotAvailable.code());
            }
        }
        // Kafka's TransactionStateManager gives the append `request.timeout.ms` to reach the
        // ISR of the `__transaction_state` partition.
        let deadline = Instant::now() + self.config.request_timeout;
        // Woken by this partition's high-watermark moves and role changes; registered before
        // each check, so a move in between leaves a permit.
        let waiter = std::sync::Arc::new(tokio::sync::Notify::new());
        loop {
            partition.watch(&waiter);
            if partition.high_watermark() > last_offset {
                return Ok(());
            }
            if !partition.is_leader() {
                return Err(ErrorCode::NotCoordinator.code());
            }
            let now = Instant::now();
            if now >= deadline || tokio::time::timeout(deadline - now, waiter.notified()).await.is_err() {
                return if partition.high_watermark() > last_offset {
                    Ok(())
                } else {
                    Err(ErrorCode::CoordinatorNotAvailable.code())
                };
            }
        }
    }

    /// Persists then applies (or, on failure, abandons) a step's new state.
    async fn write_txn_state(self: &Arc<Self>, id: &str, target: TxnMetadata) -> Result<(), i16> {
        match self.persist_txn(id, &target).await {
            Ok(()) => {
                self.coordinator.complete_write(id, Some(target));
                Ok(())
            }
            Err(code) => {
                self.coordinator.complete_write(id, None);
                Err(code)
            }
        }
    }

    /// InitProducerId with a transactional id: (error, producer id, epoch).
    pub async fn init_transactional_producer(
        self: &Arc<Self>,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> (i16, i64, i16) {
        if let Err(code) = self.check_txn_coordinator(id) {
            return (code, -1, -1);
        }
        let mut new_pid = None;
        for _ in 0..3 {
            let step = match self.coordinator.prepare_init(id, timeout_ms, expected, new_pid, crate::log::now_ms()) {
                Ok(s) => s,
                Err(code) => return (code, -1, -1),
            };
            match step {
                InitStep::NeedProducerId => match self.next_producer_id().await {
                    Ok(pid) => new_pid = Some(pid),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot allocate a producer id");
                        return (ErrorCode::CoordinatorNotAvailable.code(), -1, -1);
                    }
                },
                InitStep::Write(target) => {
                    let (pid, epoch) = (target.producer_id, target.epoch);
                    return match self.write_txn_state(id, target).await {
                        Ok(()) => (ErrorCode::None.code(), pid, epoch),
                        Err(code) => (code, -1, -1),
                    };
                }
                InitStep::AbortFirst(target) => {
                    let prepared = target.clone();
                    if let Err(code) = self.write_txn_state(id, target).await {
                        return (code, -1, -1);
                    }
                    self.spawn_complete(id.to_string(), prepared);
                    return (ErrorCode::ConcurrentTransactions.code(), -1, -1);
                }
            }
        }
        (ErrorCode::CoordinatorNotAvailable.code(), -1, -1)
    }

    /// AddPartitionsToTxn and AddOffsetsToTxn: one error code for all the partitions.
    pub async fn add_partitions_to_txn(
        self: &Arc<Self>,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<(), i16> {
        self.check_txn_coordinator(id)?;
        match self.coordinator.prepare_add_partitions(id, pid, epoch, partitions, crate::log::now_ms())? {
            None => Ok(()),
            Some(target) => self.write_txn_state(id, target).await,
        }
    }

    /// EndTxn: answered once PrepareCommit/PrepareAbort is in the log; the markers and the
    /// Complete state follow in the background.
    pub async fn end_txn(self: &Arc<Self>, id: &str, pid: i64, epoch: i16, commit: bool) -> i16 {
        if let Err(code) = self.check_txn_coordinator(id) {
            return code;
        }
        let target = match self.coordinator.prepare_end(id, pid, epoch, commit, crate::log::now_ms()) {
            Ok(None) => return ErrorCode::None.code(),
            Ok(Some(t)) => t,
            Err(code) => return code,
        };
        let prepared = target.clone();
        if let Err(code) = self.write_txn_state(id, target).await {
            return code;
        }
        self.spawn_complete(id.to_string(), prepared);
        ErrorCode::None.code()
    }

    fn spawn_complete(self: &Arc<Self>, id: String, prepared: TxnMetadata) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        let b = self.clone();
        handle.spawn(async move { b.complete_txn(&id, prepared).await });
    }

    /// Sends the markers of a prepared transaction, then writes its Complete state.
    async fn complete_txn(self: &Arc<Self>, id: &str, prepared: TxnMetadata) {
        loop {
            if !self.send_markers(id, &prepared).await {
                return;
            }
            let Some(target) = self.coordinator.prepare_complete(id, &prepared, crate::log::now_ms()) else { return };
            match self.write_txn_state(id, target).await {
                Ok(()) => return,
                Err(code) => {
                    // The Prepare state stays in the log: this coordinator, or the next one,
                    // sends the markers again.
                    tracing::info!(
                        transactional_id = id,
                        error = code,
                        "cannot write a transaction's completion; retrying"
                    );
                    tokio::time::sleep(MARKER_RETRY_MAX).await;
                    if self.check_txn_coordinator(id).is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Loads the transaction states of `__transaction_state` partition `only` (this broker
    /// just became its leader), or of every partition led here (None: standalone startup),
    /// then finishes the transactions whose markers were being written.
    pub fn load_txns(&self, only: Option<i32>) {
        // LeaderAndIsr may make this broker leader before its metadata cache lists the topic:
        // the partition is loaded all the same, and ids are matched to it by the partition
        // count the log directory layout cannot tell, so by the cache when it has the topic.
        let count = self.cache.topic(TRANSACTION_STATE_TOPIC).map(|t| t.partitions.len() as i32);
        let indexes: Vec<i32> = match only {
            Some(p) => vec![p],
            None => (0..count.unwrap_or(0)).collect(),
        };
        for index in indexes {
            let Some(partition) = self.partitions.leader_partition(TRANSACTION_STATE_TOPIC, index) else { continue };
            self.coordinator.set_loading(index, true);
            let mut loaded: HashMap<String, TxnMetadata> = HashMap::new();
            let mut offset = partition.log_start_offset();
            let end = partition.log_end_offset();
            while offset < end {
                let records = match partition.read(offset, 1 << 20) {
                    Some(r) if !r.is_empty() => r,
                    _ => break,
                };
                let mut buf = &records[..];
                let mut next = offset;
                while let Some(h) = BatchHeader::parse(buf) {
                    let size = h.total_size();
                    if size > buf.len() {
                        break;
                    }
                    for kv in crate::group::offsets_log::batch_records(&buf[..size]) {
                        let Some(id) = txn_log::decode_key(&kv.key) else { continue };
                        match kv.value.as_deref().and_then(TxnLogValue::decode) {
                            Some(v) => {
                                loaded.insert(id, TxnMetadata::from_value(&v));
                            }
                            None => {
                                loaded.remove(&id);
                            }
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
            let n = loaded.len();
            let epoch = partition.leader_epoch();
            let owned = |id: &str| count.is_some_and(|c| crate::group::partition_for(id, c) == index);
            let resume = self.coordinator.load(index, epoch, loaded, owned);
            self.coordinator.set_loading(index, false);
            if n > 0 {
                tracing::info!(partition = index, transactional_ids = n, "loaded transaction state");
            }
            if let Some(b) = self.arc() {
                for (id, prepared) in resume {
                    b.spawn_complete(id, prepared);
                }
            }
        }
    }

    /// Forgets the transactional ids of `__transaction_state` partition `p` after this
    /// broker stopped leading it.
    pub fn unload_txns(&self, p: i32) {
        let Some(topic) = self.cache.topic(TRANSACTION_STATE_TOPIC) else { return };
        let count = topic.partitions.len() as i32;
        let n = self.coordinator.unload(p, |id| crate::group::partition_for(id, count) == p);
        if n > 0 {
            tracing::info!(partition = p, transactional_ids = n, "unloaded transaction state: no longer coordinator");
        }
    }

    /// Aborts transactions open longer than their timeout, every
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`.
    pub fn spawn_txn_timer(self: &Arc<Self>) {
        let b = self.clone();
        tokio::spawn(async move {
            let every = Duration::from_millis(b.coordinator.config().abort_check_interval_ms.max(1));
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                for (id, target) in b.coordinator.timed_out(crate::log::now_ms()) {
                    tracing::info!(transactional_id = %id, producer_id = target.producer_id, "aborting a transaction that timed out");
                    let b2 = b.clone();
                    tokio::spawn(async move {
                        let prepared = target.clone();
                        if b2.write_txn_state(&id, target).await.is_ok() {
                            b2.complete_txn(&id, prepared).await;
                        }
                    });
                }
            }
        });
    }
}
