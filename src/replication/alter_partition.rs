//! The ISR writer (Kafka's `AlterPartitionManager`): a leader's proposed ISR changes are
//! queued, latest per partition, and sent in batches to the controller in AlterPartition
//! requests (the controller alone writes partition state). The data plane never waits on
//! ZooKeeper: a follower's fetch that brings it back into the ISR is answered at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Partition, ReplicaManager, Role, TopicPartition};
use crate::protocol::inter_broker::{AlterPartitionRequest, AlterPartitionResponse};
use crate::protocol::ErrorCode;
use crate::security::client::BrokerConnection;
use crate::sync::MutexExt;

/// AlterPartition v2: the first that names topics by id.
const ALTER_PARTITION_VERSION: i16 = 2;

/// A leader's proposed ISR for one of its partitions.
type IsrChange = (Arc<Partition>, Vec<i32>);

/// The controller as the ISR writer sees it: where this broker's registration stands, and,
/// when this broker is the controller, the request handled in process.
pub trait ControllerGateway: Send + Sync {
    /// The czxid of this broker's registration (its broker epoch).
    fn broker_epoch(&self) -> i64;
    fn is_controller(&self) -> bool;
    /// Handles the request as the controller (blocking: it writes ZooKeeper).
    fn handle_alter_partition(&self, req: &AlterPartitionRequest) -> AlterPartitionResponse;
}

pub struct AlterPartitionManager {
    /// Without ZooKeeper this broker is the only one: an ISR change applies at once.
    through_controller: bool,
    /// ISR changes proposed by this broker's leaders, waiting to be written (latest wins).
    pending: std::sync::Mutex<HashMap<TopicPartition, IsrChange>>,
    queued: tokio::sync::Notify,
}

impl AlterPartitionManager {
    pub fn new(through_controller: bool) -> AlterPartitionManager {
        AlterPartitionManager {
            through_controller,
            pending: std::sync::Mutex::new(HashMap::new()),
            queued: tokio::sync::Notify::new(),
        }
    }

    /// Queues a leader's ISR change for [`ReplicaManager::spawn_isr_writer`], with others
    /// queued meanwhile.
    pub fn record_isr_change(&self, partition: &Arc<Partition>, isr: Vec<i32>) {
        if !self.through_controller {
            partition.set_isr(isr);
            return;
        }
        let key = (partition.topic.clone(), partition.index);
        self.pending.lock_unpoisoned().insert(key, (partition.clone(), isr));
        self.queued.notify_one();
    }

    fn take_batch(&self) -> Vec<IsrChange> {
        self.pending.lock_unpoisoned().drain().map(|(_, v)| v).collect()
    }
}

impl ReplicaManager {
    /// Queues a leader's ISR change (see [`AlterPartitionManager`]).
    pub fn record_isr_change(&self, partition: &Arc<Partition>, isr: Vec<i32>) {
        self.alter_partition.record_isr_change(partition, isr);
    }

    /// Sends queued ISR changes to the controller in AlterPartition requests, then applies
    /// each one it accepted. A change is skipped if leadership moved meanwhile; one the
    /// controller refused is dropped, and the leader proposes it again if it still holds.
    pub fn spawn_isr_writer(self: &Arc<Self>, controller: Arc<dyn ControllerGateway>) {
        let b = self.clone();
        tokio::spawn(async move {
            let mut conn: Option<(i32, BrokerConnection)> = None;
            let mut correlation_id = 0i32;
            loop {
                b.alter_partition.queued.notified().await;
                loop {
                    let batch = b.alter_partition.take_batch();
                    if batch.is_empty() {
                        break;
                    }
                    correlation_id = correlation_id.wrapping_add(1);
                    match b.send_alter_partition(&controller, batch, &mut conn, correlation_id).await {
                        Ok(()) => {}
                        Err(e) => {
                            tracing::info!(error = %e, "cannot send ISR changes to the controller; the leaders will propose them again");
                            conn = None;
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            break;
                        }
                    }
                }
            }
        });
    }

    pub(super) async fn send_alter_partition(
        self: &Arc<Self>,
        controller: &Arc<dyn ControllerGateway>,
        batch: Vec<IsrChange>,
        conn: &mut Option<(i32, BrokerConnection)>,
        correlation_id: i32,
    ) -> anyhow::Result<()> {
        use crate::protocol::inter_broker::{AlterPartitionPartitionData, AlterPartitionTopicData, BrokerState};
        let me = self.broker_id;
        let snapshot = self.handles.cache.snapshot();
        let mut topics: Vec<AlterPartitionTopicData> = Vec::new();
        let mut sent: HashMap<(uuid::Uuid, i32), (Arc<Partition>, i32)> = Default::default();
        for (partition, isr) in batch {
            let (role, epoch) = partition.role();
            let Some(topic) = snapshot.topics.get(&partition.topic) else { continue };
            if role != Role::Leader {
                continue;
            }
            let data = AlterPartitionPartitionData {
                partition_index: partition.index,
                leader_epoch: epoch,
                new_isr_with_epochs: isr.iter().map(|&broker_id| BrokerState { broker_id, broker_epoch: -1 }).collect(),
                leader_recovery_state: 0,
                partition_epoch: partition.partition_epoch(),
            };
            match topics.iter_mut().find(|t| t.topic_id == topic.id) {
                Some(t) => t.partitions.push(data),
                None => topics.push(AlterPartitionTopicData {
                    topic_name: topic.name.clone(),
                    topic_id: topic.id,
                    partitions: vec![data],
                }),
            }
            sent.insert((topic.id, partition.index), (partition, epoch));
        }
        if topics.is_empty() {
            return Ok(());
        }
        let req = AlterPartitionRequest { broker_id: me, broker_epoch: controller.broker_epoch(), topics };
        let resp: AlterPartitionResponse = if controller.is_controller() {
            let c = controller.clone();
            tokio::task::spawn_blocking(move || c.handle_alter_partition(&req)).await?
        } else {
            let controller = snapshot.controller_id;
            if conn.as_ref().is_none_or(|(id, c)| *id != controller || c.session_expiring()) {
                let target = snapshot
                    .brokers
                    .iter()
                    .find(|b| b.id == controller)
                    .ok_or_else(|| anyhow::anyhow!("no controller known"))?;
                let stream = self
                    .handles
                    .inter_broker
                    .connect(&target.host, target.port, &format!("gregor-broker-{me}"))
                    .await?;
                *conn = Some((controller, stream));
            }
            let Some((_, stream)) = conn.as_mut() else { anyhow::bail!("no connection to the controller") };
            let client_id = format!("gregor-broker-{me}");
            let max = self.handles.config.socket_request_max_bytes;
            let call = crate::protocol::inter_broker::round_trip(
                stream,
                correlation_id,
                &client_id,
                &req,
                ALTER_PARTITION_VERSION,
                max,
            );
            tokio::time::timeout(self.handles.inter_broker.request_timeout, call).await??
        };
        if resp.error_code != 0 {
            anyhow::bail!("AlterPartition refused with error {}", resp.error_code);
        }
        let mut changed = Vec::new();
        for t in resp.topics {
            for p in t.partitions {
                let Some((partition, epoch)) = sent.get(&(t.topic_id, p.partition_index)) else { continue };
                if p.error_code == ErrorCode::InvalidUpdateVersion.code()
                    && partition.role() == (Role::Leader, *epoch)
                    && p.leader_epoch == *epoch
                    && p.partition_epoch > partition.partition_epoch()
                {
                    // This leader missed a state the controller committed for its epoch: the
                    // answer carries it, as a LeaderAndIsr would. Adopted, the next proposal
                    // is made against it instead of being refused again and again.
                    tracing::info!(topic = %partition.topic, partition = p.partition_index, partition_epoch = p.partition_epoch, isr = ?p.isr, "ISR change refused as stale; adopting the controller's state");
                    partition.set_partition_epoch(p.partition_epoch);
                    partition.set_isr(p.isr);
                    changed.push(partition.clone());
                    continue;
                }
                if p.error_code != 0 {
                    tracing::info!(topic = %partition.topic, partition = p.partition_index, error = p.error_code, "ISR change refused by the controller");
                    continue;
                }
                // Applied only if this broker still leads at the epoch it proposed for.
                if partition.role() == (Role::Leader, *epoch) && p.leader_epoch == *epoch {
                    partition.set_partition_epoch(p.partition_epoch);
                    partition.set_isr(p.isr);
                    changed.push(partition.clone());
                }
            }
        }
        // Only the partitions whose ISR changed have waiters to tell (an acks=all write that
        // may now complete or fail): waking every partition would have each follower's fetch
        // session read them all again.
        self.notify_metadata_changed();
        for p in changed {
            p.wake();
        }
        Ok(())
    }

    /// Drops followers that stopped keeping up (checked every replica.lag.time.max.ms / 2).
    pub fn spawn_isr_expiry(self: &Arc<Self>) {
        let b = self.clone();
        let lag = Duration::from_millis(self.handles.config.replica_lag_time_max_ms);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval((lag / 2).max(Duration::from_millis(100)));
            loop {
                tick.tick().await;
                for p in b.all_partitions() {
                    if let Some(isr) = p.isr_to_shrink(lag) {
                        // Logged as Kafka's leader does: the proposal is the step an operator
                        // looks for when acks=all writes wait on a follower that stopped.
                        tracing::info!(topic = %p.topic, partition = p.index, from = ?p.isr(), to = ?isr,
                            high_watermark = p.high_watermark(), log_end_offset = p.log_end_offset(),
                            "shrinking the ISR: followers behind for longer than replica.lag.time.max.ms");
                        b.record_isr_change(&p, isr);
                    }
                }
            }
        });
    }
}
