//! The requests brokers send each other in ZooKeeper mode: LeaderAndIsr, UpdateMetadata and
//! StopReplica from the controller, ControlledShutdown and AlterPartition to it. Their codecs
//! are ours (`protocol::inter_broker`); this decodes, fences and dispatches them.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::Components;
use crate::protocol::inter_broker::{
    self, AlterPartitionRequest, AlterPartitionResponse, ControlledShutdownRequest, ControlledShutdownResponse,
    LeaderAndIsrPartitionError, LeaderAndIsrRequest, LeaderAndIsrResponse, Message, StopReplicaPartitionError,
    StopReplicaRequest, StopReplicaResponse, UpdateMetadataRequest, UpdateMetadataResponse,
};
use crate::protocol::ErrorCode;

pub fn is_inter_broker(api_key: i16) -> bool {
    inter_broker::INTER_BROKER_APIS.iter().any(|(k, _, _)| *k == api_key)
}

/// Decodes, handles and encodes one request body. `Err` closes the connection with the reason
/// (a malformed request; a stale one is answered with its error code instead).
/// The answer to a broker request from a principal without CLUSTER_ACTION on the cluster:
/// CLUSTER_AUTHORIZATION_FAILED, nothing done, as Kafka answers it.
pub fn refuse(api_key: i16, version: i16) -> Result<BytesMut, String> {
    let mut out = BytesMut::new();
    let code = ErrorCode::ClusterAuthorizationFailed.code();
    let encoded = match api_key {
        inter_broker::LEADER_AND_ISR => {
            LeaderAndIsrResponse { error_code: code, ..Default::default() }.encode(&mut out, version)
        }
        inter_broker::UPDATE_METADATA => UpdateMetadataResponse { error_code: code }.encode(&mut out, version),
        inter_broker::STOP_REPLICA => {
            StopReplicaResponse { error_code: code, ..Default::default() }.encode(&mut out, version)
        }
        inter_broker::CONTROLLED_SHUTDOWN => {
            ControlledShutdownResponse { error_code: code, ..Default::default() }.encode(&mut out, version)
        }
        inter_broker::ALTER_PARTITION => {
            AlterPartitionResponse { error_code: code, ..Default::default() }.encode(&mut out, version)
        }
        other => return Err(format!("no handler for inter-broker API key {other}")),
    };
    encoded.map_err(|e| format!("cannot encode inter-broker response (key {api_key} v{version}): {e}"))?;
    Ok(out)
}

pub async fn handle(broker: &Arc<Components>, api_key: i16, version: i16, mut body: Bytes) -> Result<BytesMut, String> {
    let mut out = BytesMut::new();
    let malformed =
        |e: inter_broker::CodecError| format!("malformed inter-broker request (key {api_key} v{version}): {e}");
    let encoded = match api_key {
        inter_broker::LEADER_AND_ISR => {
            let req = LeaderAndIsrRequest::decode(&mut body, version).map_err(malformed)?;
            leader_and_isr(broker, req).await.encode(&mut out, version)
        }
        inter_broker::UPDATE_METADATA => {
            let req = UpdateMetadataRequest::decode(&mut body, version).map_err(malformed)?;
            update_metadata(broker, req).await.encode(&mut out, version)
        }
        inter_broker::STOP_REPLICA => {
            let req = StopReplicaRequest::decode(&mut body, version).map_err(malformed)?;
            stop_replica(broker, req).await.encode(&mut out, version)
        }
        inter_broker::CONTROLLED_SHUTDOWN => {
            let req = ControlledShutdownRequest::decode(&mut body, version).map_err(malformed)?;
            let b = broker.clone();
            blocking(move || b.controller.handle_controlled_shutdown(req.broker_id, req.broker_epoch))
                .await
                .unwrap_or_else(|e| ControlledShutdownResponse { error_code: e.code(), remaining_partitions: vec![] })
                .encode(&mut out, version)
        }
        inter_broker::ALTER_PARTITION => {
            let req = AlterPartitionRequest::decode(&mut body, version).map_err(malformed)?;
            let b = broker.clone();
            blocking(move || b.controller.handle_alter_partition(&req))
                .await
                .unwrap_or_else(|e| AlterPartitionResponse { error_code: e.code(), ..Default::default() })
                .encode(&mut out, version)
        }
        other => return Err(format!("no handler for inter-broker API key {other}")),
    };
    encoded.map_err(|e| format!("cannot encode inter-broker response (key {api_key} v{version}): {e}"))?;
    Ok(out)
}

/// Fencing of a controller request, as Kafka checks it: an older controller epoch than one
/// already seen, or a broker epoch from before this broker's current registration.
fn check_controller_request(broker: &Components, controller_epoch: i32, broker_epoch: i64) -> Result<(), ErrorCode> {
    broker.replicas.check_controller_request(controller_epoch, broker_epoch, broker.broker_epoch())
}

/// Controller requests change logs and znodes: off the async workers, as admin requests are.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ErrorCode> {
    tokio::task::spawn_blocking(f).await.map_err(|_| ErrorCode::UnknownServerError)
}

async fn leader_and_isr(broker: &Arc<Components>, req: LeaderAndIsrRequest) -> LeaderAndIsrResponse {
    let refuse = |code: ErrorCode, req: &LeaderAndIsrRequest| LeaderAndIsrResponse {
        error_code: code.code(),
        partition_errors: req
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| LeaderAndIsrPartitionError {
                    topic_name: t.topic_name.clone(),
                    topic_id: t.topic_id,
                    partition_index: p.partition_index,
                    error_code: code.code(),
                })
            })
            .collect(),
    };
    if let Err(code) = check_controller_request(broker, req.controller_epoch, req.broker_epoch) {
        tracing::warn!(controller = req.controller_id, epoch = req.controller_epoch, ?code, "LeaderAndIsr fenced");
        return refuse(code, &req);
    }
    let b = broker.clone();
    let req2 = req.clone();
    match blocking(move || b.replicas.become_leader_or_follower(&req2)).await {
        Ok(r) => r,
        Err(code) => refuse(code, &req),
    }
}

async fn update_metadata(broker: &Arc<Components>, req: UpdateMetadataRequest) -> UpdateMetadataResponse {
    if let Err(code) = check_controller_request(broker, req.controller_epoch, req.broker_epoch) {
        tracing::warn!(controller = req.controller_id, epoch = req.controller_epoch, ?code, "UpdateMetadata fenced");
        return UpdateMetadataResponse { error_code: code.code() };
    }
    if broker.controller.is_controller() {
        // The controller's image comes from ZooKeeper. Only a newer controller's word counts,
        // and it means this one was replaced without noticing.
        if req.controller_epoch <= broker.controller.controller_epoch() {
            return UpdateMetadataResponse { error_code: ErrorCode::StaleControllerEpoch.code() };
        }
        tracing::warn!(
            controller = req.controller_id,
            epoch = req.controller_epoch,
            "a newer controller exists; resigning"
        );
        broker.controller.resign_controller();
    }
    let b = broker.clone();
    blocking(move || b.zk_sync.update_metadata(&req))
        .await
        .unwrap_or_else(|code| UpdateMetadataResponse { error_code: code.code() })
}

async fn stop_replica(broker: &Arc<Components>, req: StopReplicaRequest) -> StopReplicaResponse {
    let refuse = |code: ErrorCode, req: &StopReplicaRequest| StopReplicaResponse {
        error_code: code.code(),
        partition_errors: req
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| StopReplicaPartitionError {
                    topic_name: t.topic_name.clone(),
                    partition_index: p.partition_index,
                    error_code: code.code(),
                })
            })
            .collect(),
    };
    if let Err(code) = check_controller_request(broker, req.controller_epoch, req.broker_epoch) {
        tracing::warn!(controller = req.controller_id, epoch = req.controller_epoch, ?code, "StopReplica fenced");
        return refuse(code, &req);
    }
    let b = broker.clone();
    let req2 = req.clone();
    blocking(move || b.replicas.stop_replicas(&req2)).await.unwrap_or_else(|code| refuse(code, &req))
}
