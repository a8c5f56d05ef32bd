//! The controller's connections to brokers (Kafka's `ControllerChannelManager`): one task per
//! live broker, sending LeaderAndIsr, UpdateMetadata and StopReplica in the order the
//! controller decided them. The queue is bounded; a broker that falls behind, or whose
//! connection breaks, is sent the whole state again instead of what it missed, which is both
//! simpler and never more than one request per kind.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use super::Controller;
use crate::protocol::inter_broker::{
    round_trip, LeaderAndIsrPartitionError, LeaderAndIsrRequest, LeaderAndIsrResponse, StopReplicaRequest,
    StopReplicaResponse, UpdateMetadataRequest, UpdateMetadataResponse,
};
use crate::protocol::ErrorCode;
use crate::security::client::BrokerConnection;
use crate::sync::MutexExt;

/// The versions the controller sends: the newest ZooKeeper-mode ones that name topics by id
/// as well as by name.
pub const LEADER_AND_ISR_VERSION: i16 = 6;
pub const UPDATE_METADATA_VERSION: i16 = 7;
pub const STOP_REPLICA_VERSION: i16 = 3;

/// Requests waiting for one broker before the controller gives up on increments and sends
/// that broker the whole state once it catches up.
const QUEUE_CAPACITY: usize = 64;
/// The pause after a failed request, and the step of the pause between failed connection
/// attempts. Kafka has no key for it: its RequestSendThread sleeps a fixed 100 ms, and its
/// controller channels connect with no reconnect backoff. A little longer here spares a
/// broker that is restarting a reconnect storm from every controller channel.
const RETRY_BACKOFF: Duration = Duration::from_millis(300);
/// The longest pause between failed connection attempts. No Kafka key either (see above); a
/// broker that comes back is reached within it.
const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub enum ControlRequest {
    LeaderAndIsr(LeaderAndIsrRequest),
    UpdateMetadata(UpdateMetadataRequest),
    StopReplica(StopReplicaRequest),
}

struct BrokerChannel {
    epoch: i64,
    queue: mpsc::Sender<ControlRequest>,
    /// Set when a request could not be queued: the task sends the whole state next.
    resync: Arc<AtomicBool>,
    wake: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BrokerChannel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Channels to the live brokers other than this one, owned by the controller.
#[derive(Default)]
pub struct ControllerChannels {
    channels: Mutex<HashMap<i32, BrokerChannel>>,
}

impl ControllerChannels {
    /// Keeps exactly one channel per broker in `live` (id, broker epoch): a broker that
    /// re-registered gets a new channel, one that left loses its own.
    pub fn retain(&self, broker: &Arc<Controller>, live: &[(i32, i64)]) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        let mut channels = self.channels.lock_unpoisoned();
        // A task that ended (it found this broker no longer controller, in the instant between
        // a resignation and the next election) must be replaced, or what is queued for its
        // broker would wait forever.
        // A task that ended (a pass that began before a resignation and queued after the next
        // election's reset started it while this broker was briefly not controller) must be
        // replaced, or what is queued for its broker would wait forever.
        channels.retain(|id, c| !c.task.is_finished() && live.iter().any(|(l, e)| l == id && *e == c.epoch));
        for &(id, epoch) in live {
            if id == broker.config.broker_id || channels.contains_key(&id) {
                continue;
            }
            let (queue, rx) = mpsc::channel(QUEUE_CAPACITY);
            let resync = Arc::new(AtomicBool::new(false));
            let wake = Arc::new(Notify::new());
            let task = handle.spawn(run(Arc::downgrade(broker), id, rx, resync.clone(), wake.clone()));
            channels.insert(id, BrokerChannel { epoch, queue, resync, wake, task });
        }
    }

    /// Queues a request for a broker; if its queue is full the broker is marked for a full
    /// resend instead.
    pub fn send(&self, broker_id: i32, request: ControlRequest) {
        let channels = self.channels.lock_unpoisoned();
        let Some(c) = channels.get(&broker_id) else { return };
        if c.queue.try_send(request).is_err() {
            c.resync.store(true, Ordering::Release);
            c.wake.notify_one();
        }
    }

    /// Has the broker's channel send it the whole state again (a LeaderAndIsr for every
    /// replica it holds), as after a reconnection.
    pub fn resync(&self, broker_id: i32) {
        let channels = self.channels.lock_unpoisoned();
        if let Some(c) = channels.get(&broker_id) {
            c.resync.store(true, Ordering::Release);
            c.wake.notify_one();
        }
    }

    pub fn clear(&self) {
        self.channels.lock_unpoisoned().clear();
    }
}

async fn run(
    broker: Weak<Controller>,
    target: i32,
    mut rx: mpsc::Receiver<ControlRequest>,
    resync: Arc<AtomicBool>,
    wake: Arc<Notify>,
) {
    let mut conn: Option<BrokerConnection> = None;
    let mut correlation_id = 0i32;
    let mut connect_failures = 0u32;
    // A new channel starts with the whole state: the broker may have missed anything.
    resync.store(true, Ordering::Release);
    loop {
        let batch: Vec<ControlRequest> = if resync.swap(false, Ordering::AcqRel) {
            // Everything queued is contained in the whole state built now.
            while rx.try_recv().is_ok() {}
            let Some(b) = broker.upgrade() else { return };
            if !b.is_controller() {
                return;
            }
            b.full_state_for(target)
        } else {
            tokio::select! {
                r = rx.recv() => match r {
                    Some(r) => vec![r],
                    None => return,
                },
                _ = wake.notified() => continue,
            }
        };
        for request in batch {
            loop {
                let Some(b) = broker.upgrade() else { return };
                if !b.is_controller() {
                    return;
                }
                if conn.as_ref().is_some_and(BrokerConnection::session_expiring) {
                    conn = None;
                }
                if conn.is_none() {
                    conn = connect(&b, target).await;
                    connect_failures = if conn.is_some() { 0 } else { connect_failures.saturating_add(1) };
                }
                let Some(stream) = conn.as_mut() else {
                    drop(b);
                    tokio::time::sleep((RETRY_BACKOFF * connect_failures.min(4)).min(MAX_CONNECT_BACKOFF)).await;
                    continue;
                };
                correlation_id = correlation_id.wrapping_add(1);
                let client_id = format!("gregor-controller-{}", b.config.broker_id);
                let max = b.config.socket_request_max_bytes;
                // request.timeout.ms: a broker that does not answer in this time is reconnected.
                let request_timeout = b.inter_broker.request_timeout;
                drop(b);
                let sent =
                    tokio::time::timeout(request_timeout, exchange(stream, correlation_id, &client_id, &request, max))
                        .await;
                match sent {
                    Ok(Ok(Answer { error, offline, stale_epoch })) => {
                        if let Some(e) = error {
                            tracing::warn!(broker = target, error = %e, "broker refused a controller request");
                        }
                        if stale_epoch {
                            // The broker registered again and this controller still addresses its
                            // old registration: re-read it, which replaces this channel, rather
                            // than repeat what the broker will keep refusing.
                            if let Some(b) = broker.upgrade() {
                                b.store.mark_dirty(&crate::metadata::zk_data::broker_path(target));
                            }
                        }
                        if !offline.is_empty() {
                            if let Some(b) = broker.upgrade() {
                                // Store reads and writes wait for the next pass, off this task.
                                b.on_replicas_offline(target, offline);
                            }
                        }
                        break;
                    }
                    Ok(Err(e)) => {
                        tracing::info!(broker = target, error = %e, "controller request failed; reconnecting")
                    }
                    Err(_) => tracing::warn!(broker = target, "controller request timed out; reconnecting"),
                }
                // What was lost with the connection is unknown: send the whole state again.
                conn = None;
                resync.store(true, Ordering::Release);
                tokio::time::sleep(RETRY_BACKOFF).await;
                break;
            }
            if resync.load(Ordering::Acquire) {
                break;
            }
        }
    }
}

async fn connect(broker: &Controller, target: i32) -> Option<BrokerConnection> {
    let snapshot = broker.cache.snapshot();
    let b = snapshot.brokers.iter().find(|b| b.id == target)?;
    let client_id = format!("gregor-controller-{}", broker.config.broker_id);
    // Kafka's RequestSendThread waits `controller.socket.timeout.ms` for the broker to be
    // ready; the inter-broker client's own set-up timeout applies within it.
    let within = broker.config.controller_socket_timeout;
    let connected = tokio::time::timeout(within, broker.inter_broker.connect(&b.host, b.port, &client_id)).await;
    let Ok(connected) = connected else {
        tracing::debug!(broker = target, "cannot connect to broker within controller.socket.timeout.ms");
        return None;
    };
    match connected {
        Ok(c) => Some(c),
        Err(e) if e.is_authentication() => {
            tracing::warn!(broker = target, listener = broker.inter_broker.listener(), error = %e, "cannot authenticate to broker");
            None
        }
        Err(e) => {
            tracing::debug!(broker = target, error = %e, "cannot connect to broker");
            None
        }
    }
}

/// What a broker answered to one controller request.
struct Answer {
    /// The error it reports, if any.
    error: Option<String>,
    /// The partitions a LeaderAndIsr answer names KAFKA_STORAGE_ERROR (replicas in an offline dir).
    offline: Vec<LeaderAndIsrPartitionError>,
    /// The broker refused the request's broker epoch as older than its registration.
    stale_epoch: bool,
}

/// Sends one request and reads its answer.
async fn exchange(
    stream: &mut BrokerConnection,
    correlation_id: i32,
    client_id: &str,
    request: &ControlRequest,
    max: usize,
) -> anyhow::Result<Answer> {
    let stale = |code: i16| code == ErrorCode::StaleBrokerEpoch.code();
    Ok(match request {
        ControlRequest::LeaderAndIsr(r) => {
            let resp: LeaderAndIsrResponse =
                round_trip(stream, correlation_id, client_id, r, LEADER_AND_ISR_VERSION, max).await?;
            let failed = resp.partition_errors.iter().filter(|p| p.error_code != 0).count();
            let storage = ErrorCode::KafkaStorageError.code();
            let offline = resp.partition_errors.iter().filter(|p| p.error_code == storage).cloned().collect();
            let error = (resp.error_code != 0 || failed > 0)
                .then(|| format!("LeaderAndIsr: error {} and {failed} partition errors", resp.error_code));
            Answer { error, offline, stale_epoch: stale(resp.error_code) }
        }
        ControlRequest::UpdateMetadata(r) => {
            let resp: UpdateMetadataResponse =
                round_trip(stream, correlation_id, client_id, r, UPDATE_METADATA_VERSION, max).await?;
            let error = (resp.error_code != 0).then(|| format!("UpdateMetadata: error {}", resp.error_code));
            Answer { error, offline: Vec::new(), stale_epoch: stale(resp.error_code) }
        }
        ControlRequest::StopReplica(r) => {
            let resp: StopReplicaResponse =
                round_trip(stream, correlation_id, client_id, r, STOP_REPLICA_VERSION, max).await?;
            let failed = resp.partition_errors.iter().filter(|p| p.error_code != 0).count();
            let error = (resp.error_code != 0 || failed > 0)
                .then(|| format!("StopReplica: error {} and {failed} partition errors", resp.error_code));
            Answer { error, offline: Vec::new(), stale_epoch: stale(resp.error_code) }
        }
    })
}
