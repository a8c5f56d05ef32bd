//! The markers that end a transaction (Kafka's `TransactionMarkerChannelManager`): sent to
//! every leader of the transaction's partitions at once, retried until each has one, and on
//! this broker written and answered once the ISR has them.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
use kafka_protocol::messages::{ProducerId, WriteTxnMarkersRequest, WriteTxnMarkersResponse};

use super::{MarkerResult, TransactionService, MARKER_RETRY_MAX};
use crate::protocol::ErrorCode;
use crate::txn::handles::TxnPartition;
use crate::txn::inter_broker::{by_topic, pooled_round_trip};
use crate::txn::state::{TxnMetadata, TxnState};

/// The WriteTxnMarkers version sent to other brokers (the only one Kafka 4 still knows).
const WRITE_TXN_MARKERS_VERSION: i16 = 1;

impl TransactionService {
    /// Writes the markers on every partition of the transaction, retrying (with the leaders
    /// looked up again) until each has it. False if this broker stopped coordinating the id:
    /// its successor sends them.
    pub(super) async fn send_markers(self: &Arc<Self>, id: &str, prepared: &TxnMetadata) -> bool {
        let commit = prepared.state == TxnState::PrepareCommit;
        let mut remaining: BTreeSet<(String, i32)> = prepared.partitions.clone();
        let mut backoff = Duration::from_millis(20);
        loop {
            if remaining.is_empty() {
                return true;
            }
            let Ok(p) = self.check_txn_coordinator(id) else { return false };
            let coordinator_epoch = self.coordinator.coordinator_epoch(p).unwrap_or(0);
            let snapshot = self.cache.snapshot();
            let mut by_leader: HashMap<i32, Vec<(String, i32)>> = HashMap::new();
            for (topic, index) in remaining.clone() {
                let Some(t) = snapshot.topics.get(&topic) else {
                    // Deleted: there is nothing left to mark.
                    remaining.remove(&(topic, index));
                    continue;
                };
                match t.partitions.iter().find(|x| x.index == index) {
                    None => {
                        remaining.remove(&(topic, index));
                    }
                    Some(x) if x.leader >= 0 => by_leader.entry(x.leader).or_default().push((topic, index)),
                    Some(_) => {}
                }
            }
            // Each leader answers once its markers are replicated: the leaders are asked at
            // once, so a transaction waits for its slowest leader, not for their sum.
            let mut sends = tokio::task::JoinSet::new();
            for (leader, tps) in by_leader {
                let (me, prepared) = (self.clone(), prepared.clone());
                sends.spawn(async move {
                    if leader == me.config.broker_id {
                        return me
                            .write_markers(prepared.producer_id, prepared.epoch, commit, coordinator_epoch, tps)
                            .await;
                    }
                    match me.send_remote_markers(leader, &prepared, commit, coordinator_epoch, &tps).await {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::debug!(leader, error = %e, "cannot send transaction markers");
                            Vec::new()
                        }
                    }
                });
            }
            while let Some(results) = sends.join_next().await {
                for (tp, code) in results.unwrap_or_default() {
                    if code == ErrorCode::None.code() {
                        remaining.remove(&tp);
                    } else {
                        tracing::debug!(topic = %tp.0, partition = tp.1, error = code, "transaction marker not written yet");
                    }
                }
            }
            if !remaining.is_empty() {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MARKER_RETRY_MAX);
            }
        }
    }

    /// WriteTxnMarkers on this broker: a marker on each listed partition it leads, answered
    /// once the marker is replicated to the ISR, as Kafka appends markers with acks=all. A
    /// marker acknowledged on the leader alone is lost with a leader change, and the coordinator,
    /// which then completes the transaction, never writes it again: the partition's records of
    /// a committed transaction would be closed by the producer's next ABORT instead. A marker on
    /// a `__consumer_offsets` partition also settles the offsets the transaction committed to
    /// its groups.
    pub async fn write_markers(
        self: &Arc<Self>,
        pid: i64,
        epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        partitions: Vec<(String, i32)>,
    ) -> Vec<MarkerResult> {
        // As for produce: the markers go to the I/O pool in one hop only if one of them may
        // wait on the disk; page-cache writes are done here.
        let may_block = partitions.iter().any(|(topic, index)| {
            self.partitions.leader_partition(topic, *index).is_some_and(|p| p.marker_may_block())
        });
        let appended = if may_block {
            let b = self.clone();
            match self.io.run(move || b.append_markers(pid, epoch, commit, coordinator_epoch, &partitions)).await {
                Ok(a) => a,
                Err(_) => return Vec::new(),
            }
        } else {
            self.append_markers(pid, epoch, commit, coordinator_epoch, &partitions)
        };
        let deadline = Instant::now() + self.config.request_timeout;
        let mut out = Vec::with_capacity(appended.len());
        for (tp, code, written) in appended {
            let code = match written {
                Some((partition, offset)) if code == ErrorCode::None.code() => {
                    wait_replicated(partition.as_ref(), offset, deadline).await
                }
                _ => code,
            };
            out.push((tp, code));
        }
        out
    }

    /// Appends the markers: each partition's error code and,
    /// when appended, the partition and the marker's offset.
    #[allow(clippy::type_complexity)]
    fn append_markers(
        &self,
        pid: i64,
        epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        partitions: &[(String, i32)],
    ) -> Vec<((String, i32), i16, Option<(Arc<dyn TxnPartition>, i64)>)> {
        let mut out = Vec::with_capacity(partitions.len());
        for (topic, index) in partitions {
            let tp = (topic.clone(), *index);
            let Some(p) = self.partitions.leader_partition(topic, *index) else {
                out.push((tp, self.partitions.not_led_error(topic, *index), None));
                continue;
            };
            // Kafka refuses an acks=all append, markers included, to an ISR below the minimum
            // before writing anything; the coordinator retries.
            if p.isr_len() < self.min_insync_replicas(topic) {
                out.push((tp, ErrorCode::NotEnoughReplicas.code(), None));
                continue;
            }
            self.coordinator.forget_verified(&tp, pid);
            let (code, offset) = p.write_marker(pid, epoch, commit, coordinator_epoch);
            if code == ErrorCode::None.code() {
                self.markers.on_marker_written(topic, *index, pid, commit);
                out.push((tp, code, Some((p, offset))));
            } else {
                out.push((tp, code, None));
            }
        }
        out
    }

    fn min_insync_replicas(&self, topic: &str) -> usize {
        let configured = self
            .cache
            .topic(topic)
            .and_then(|t| t.configs.get("min.insync.replicas").and_then(|v| v.parse::<usize>().ok()));
        configured.unwrap_or(self.config.min_insync_replicas.max(1) as usize)
    }

    async fn send_remote_markers(
        &self,
        leader: i32,
        prepared: &TxnMetadata,
        commit: bool,
        coordinator_epoch: i32,
        tps: &[(String, i32)],
    ) -> anyhow::Result<Vec<MarkerResult>> {
        let snapshot = self.cache.snapshot();
        let b = snapshot.brokers.iter().find(|b| b.id == leader).ok_or_else(|| anyhow::anyhow!("unknown broker"))?;
        let topics = by_topic(tps)
            .into_iter()
            .map(|(name, partition_indexes)| {
                let mut x = WritableTxnMarkerTopic::default();
                x.name = name;
                x.partition_indexes = partition_indexes;
                x
            })
            .collect();
        let mut marker = WritableTxnMarker::default();
        marker.producer_id = ProducerId(prepared.producer_id);
        marker.producer_epoch = prepared.epoch;
        marker.transaction_result = commit;
        marker.topics = topics;
        marker.coordinator_epoch = coordinator_epoch;
        let mut req = WriteTxnMarkersRequest::default();
        req.markers = vec![marker];
        let (host, port) = (b.host.clone(), b.port);
        let client_id = format!("gregor-txn-coordinator-{}", self.config.broker_id);
        let max = self.config.socket_request_max_bytes;
        // The inter-broker listener's protocol (TLS, SASL), as every broker-to-broker request.
        let connector = &self.inter_broker;
        let key = kafka_protocol::messages::ApiKey::WriteTxnMarkers;
        let resp = tokio::time::timeout(
            connector.request_timeout,
            pooled_round_trip::<_, WriteTxnMarkersResponse>(
                connector,
                &host,
                port,
                &client_id,
                key,
                WRITE_TXN_MARKERS_VERSION,
                &req,
                max,
            ),
        )
        .await??;
        let mut out = Vec::new();
        for m in resp.markers {
            for t in m.topics {
                for p in t.partitions {
                    out.push(((t.name.0.to_string(), p.partition_index), p.error_code));
                }
            }
        }
        Ok(out)
    }
}

/// Waits until the marker at `offset` is below the partition's high watermark: NOT_LEADER_OR_FOLLOWER
/// if the partition stops being led here first, REQUEST_TIMED_OUT at `deadline`.
async fn wait_replicated(partition: &dyn TxnPartition, offset: i64, deadline: Instant) -> i16 {
    // Woken by the partition's high-watermark moves and role changes; registered before each
    // check, so a move in between leaves a permit.
    let waiter = Arc::new(tokio::sync::Notify::new());
    loop {
        partition.watch(&waiter);
        if partition.high_watermark() > offset {
            return ErrorCode::None.code();
        }
        if !partition.is_leader() {
            return ErrorCode::NotLeaderOrFollower.code();
        }
        let now = Instant::now();
        if now >= deadline || tokio::time::timeout(deadline - now, waiter.notified()).await.is_err() {
            return if partition.high_watermark() > offset {
                ErrorCode::None.code()
            } else {
                ErrorCode::RequestTimedOut.code()
            };
        }
    }
}
