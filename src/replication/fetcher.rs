//! Follower fetchers (Kafka's `ReplicaFetcherThread`): one task per leader broker, copying the
//! partitions this broker follows from it with ordinary Fetch requests (v12: replica id,
//! last fetched epoch). Batches are appended byte for byte with their offsets and epochs. A
//! `diverging_epoch` in the answer means this log holds records the leader does not have: the
//! follower truncates to where the two agree before fetching again (KIP-101/595).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

use super::{quota, ReplicaManager, Role, TopicPartition};
use crate::metadata::cache::ClusterSnapshot;
use crate::protocol::ErrorCode;
use crate::security::client::BrokerConnection;
use crate::sync::MutexExt;

/// The Fetch version followers send: the first with `last_fetched_epoch` and
/// `diverging_epoch`, and still naming topics rather than ids.
const FETCH_VERSION: i16 = 12;
/// The longest pause between failed connection attempts, whose step is
/// `replica.fetch.backoff.ms`. Kafka has no key for it: its fetcher's client has no
/// reconnect backoff and pauses `replica.fetch.backoff.ms` after any failure. The cap keeps a
/// large `replica.fetch.backoff.ms` from growing five-fold while a leader restarts, and a
/// small one still keeps a leader that refuses this broker's credentials from being asked in
/// a tight loop.
const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(1);
/// Spare room for the first read of a response: the size prefix and a small answer (an
/// empty long poll, a few records) arrive in one read.
const RX_FIRST_READ: usize = 64 * 1024;
/// A response with more than this still to come is waited for whole (SO_RCVLOWAT) rather
/// than read as it trickles in: one loopback segment.
const LOW_WATER_FROM: usize = 64 * 1024;

/// The partitions a fetcher copies, and those whose fetch position may have moved since its
/// last request was built (followed anew, at a new leader epoch, or no longer followed).
#[derive(Default)]
struct Followed {
    all: BTreeSet<TopicPartition>,
    dirty: HashSet<TopicPartition>,
}

impl Followed {
    fn remove(&mut self, tp: &TopicPartition) {
        if self.all.remove(tp) {
            self.dirty.insert(tp.clone());
        }
    }
}

struct Fetcher {
    partitions: Arc<Mutex<Followed>>,
    wake: Arc<Notify>,
    /// Partitions were added since the fetch in flight was sent.
    added: bool,
    /// Ends the fetch in flight, so that the partitions added are fetched now rather than
    /// after the leader's long poll (`replica.fetch.wait.max.ms`) runs out.
    restart: Arc<Notify>,
}

/// What this follower told the leader in its fetch session (KIP-227): an incremental request
/// names only partitions whose fetch position changed, so an idle round costs no partition
/// at all on the wire.
#[derive(Default)]
struct FollowerSession {
    /// 0: no session; the next request is a full one that asks the leader for a session.
    id: i32,
    epoch: i32,
    /// Per partition: (fetch offset, last fetched epoch, current leader epoch) as last sent.
    sent: HashMap<TopicPartition, (i64, i32, i32)>,
}

/// The partitions one request is built from: every followed one (a full request, or a
/// fetcher under a follower quota, whose throttled partitions come and go with the bucket),
/// else only those that may have moved.
struct Candidates {
    full: bool,
    /// Followed, to be checked against what the session was last told.
    check: Vec<TopicPartition>,
    /// No longer followed: forgotten if the session holds them.
    gone: Vec<TopicPartition>,
}

/// One built request, with what it changes in the session once answered.
struct Built {
    request: FetchRequest,
    sent: Vec<(TopicPartition, (i64, i32, i32))>,
    forgotten: Vec<TopicPartition>,
}

#[derive(Default)]
pub struct FetcherManager {
    fetchers: Mutex<HashMap<i32, Fetcher>>,
}

impl FetcherManager {
    /// Makes the fetcher for `leader` copy `tp` (and no other fetcher).
    pub fn follow(&self, broker: &Arc<ReplicaManager>, leader: i32, tp: TopicPartition) {
        let mut fetchers = self.fetchers.lock_unpoisoned();
        for (id, f) in fetchers.iter() {
            if *id != leader {
                f.partitions.lock_unpoisoned().remove(&tp);
            }
        }
        let f = fetchers.entry(leader).or_insert_with(|| {
            let partitions = Arc::new(Mutex::new(Followed::default()));
            let wake = Arc::new(Notify::new());
            let restart = Arc::new(Notify::new());
            tokio::spawn(run(broker.clone(), leader, partitions.clone(), wake.clone(), restart.clone()));
            Fetcher { partitions, wake, added: false, restart }
        });
        let mut followed = f.partitions.lock_unpoisoned();
        // Called at each LeaderAndIsr: the leader epoch in the position may have moved.
        followed.dirty.insert(tp.clone());
        if followed.all.insert(tp) {
            f.added = true;
            f.wake.notify_one();
        }
    }

    /// After a batch of [`FetcherManager::follow`] calls: fetchers that were given new
    /// partitions start a new fetch at once.
    pub fn start_added(&self) {
        let mut fetchers = self.fetchers.lock_unpoisoned();
        for f in fetchers.values_mut().filter(|f| f.added) {
            f.added = false;
            f.restart.notify_one();
        }
    }

    /// Stops every fetcher's work (controlled shutdown: a departing broker must not look like
    /// a caught-up follower).
    pub fn stop_all(&self) {
        let fetchers = self.fetchers.lock_unpoisoned();
        for f in fetchers.values() {
            let mut followed = f.partitions.lock_unpoisoned();
            let all = std::mem::take(&mut followed.all);
            followed.dirty.extend(all);
        }
    }

    /// The leader whose fetcher copies `tp`, if any.
    pub fn leader_of(&self, tp: &TopicPartition) -> Option<i32> {
        let fetchers = self.fetchers.lock_unpoisoned();
        fetchers.iter().find(|(_, f)| f.partitions.lock_unpoisoned().all.contains(tp)).map(|(id, _)| *id)
    }

    /// Stops fetching `tp` from anyone (this broker leads it now, or no longer hosts it).
    pub fn unfollow(&self, tp: &TopicPartition) {
        let fetchers = self.fetchers.lock_unpoisoned();
        for f in fetchers.values() {
            f.partitions.lock_unpoisoned().remove(tp);
        }
    }
}

/// The partitions the next request is built from, taking the followed set's marks; None
/// when nothing is followed.
fn candidates(
    broker: &ReplicaManager,
    followed: &Mutex<Followed>,
    session: &FollowerSession,
    moved: &mut HashSet<TopicPartition>,
) -> Option<Candidates> {
    let mut f = followed.lock_unpoisoned();
    if f.all.is_empty() {
        return None;
    }
    moved.extend(f.dirty.drain());
    let throttling = broker.handles.effective_config().follower_replication_throttled_rate < quota::UNLIMITED;
    if session.id == 0 || throttling {
        moved.clear();
        return Some(Candidates { full: true, check: f.all.iter().cloned().collect(), gone: Vec::new() });
    }
    let (check, gone) = moved.drain().partition(|tp| f.all.contains(tp));
    Some(Candidates { full: false, check, gone })
}

async fn run(
    broker: Arc<ReplicaManager>,
    leader: i32,
    partitions: Arc<Mutex<Followed>>,
    wake: Arc<Notify>,
    restart: Arc<Notify>,
) {
    let mut conn: Option<BrokerConnection> = None;
    let mut session = FollowerSession::default();
    let mut correlation_id = 0i32;
    let mut connect_failures = 0u32;
    let mut rx = BytesMut::new();
    // Partitions whose position may have moved since the last request: those the leader's
    // answers touched, and the followed set's marks. An idle round checks none.
    let mut moved: HashSet<TopicPartition> = HashSet::new();
    loop {
        if partitions.lock_unpoisoned().all.is_empty() {
            conn = None;
            wake.notified().await;
            continue;
        }
        if conn.as_ref().is_some_and(BrokerConnection::session_expiring) {
            conn = None;
        }
        if conn.is_none() {
            // A session belongs to what the leader saw on the old connection: start afresh.
            session = FollowerSession::default();
            conn = connect(&broker, leader).await;
            if conn.is_none() {
                connect_failures = connect_failures.saturating_add(1);
                tokio::time::sleep(
                    (broker.handles.config.replica_fetch_backoff * connect_failures.min(5)).min(MAX_CONNECT_BACKOFF),
                )
                .await;
                continue;
            }
            connect_failures = 0;
        }
        let Some(stream) = conn.as_mut() else { continue };
        let Some(c) = candidates(&broker, &partitions, &session, &mut moved) else { continue };
        let Some(built) = build_request(&broker, leader, c, &session) else {
            tokio::time::sleep(broker.handles.config.replica_fetch_backoff).await;
            continue;
        };
        let request = &built.request;
        correlation_id = correlation_id.wrapping_add(1);
        // A leader that stopped answering (a dropped connection, or an answer lost with TCP
        // retransmitting at ever longer intervals after a network cut) is asked again on a new
        // connection after replica.socket.timeout.ms, as Kafka's fetcher does.
        let wait = broker.handles.config.replica_socket_timeout;
        let answer = tokio::select! {
            a = tokio::time::timeout(wait, exchange(stream, &broker, correlation_id, request, &mut rx)) => a,
            _ = restart.notified() => {
                // The leader would hold this fetch for its long poll; a new connection asks
                // for the new partitions too (the old one is dropped mid-answer).
                conn = None;
                continue;
            }
        };
        match answer {
            Ok(Ok(response)) => {
                // Whatever the answer names may have moved (appended, truncated, reset).
                moved.extend(
                    response
                        .responses
                        .iter()
                        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic.0.to_string(), p.partition_index))),
                );
                if matches!(
                    ErrorCode::from_code(response.error_code),
                    Some(ErrorCode::FetchSessionIdNotFound | ErrorCode::InvalidFetchSessionEpoch)
                ) {
                    tracing::debug!(leader, error = response.error_code, "fetch session lost; starting a new one");
                    session = FollowerSession::default();
                    continue;
                }
                if session.id == 0 {
                    // A full request: the leader answers with a new session, or with 0 if it
                    // keeps none (then every request stays a full one).
                    session.sent.clear();
                    session.id = response.session_id;
                    session.epoch = 0;
                }
                if session.id != 0 {
                    session.epoch = if session.epoch == i32::MAX { 1 } else { session.epoch + 1 };
                    for tp in built.forgotten {
                        session.sent.remove(&tp);
                    }
                    session.sent.extend(built.sent);
                }
                if !apply(&broker, leader, response) {
                    tokio::time::sleep(broker.handles.config.replica_fetch_backoff).await;
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(leader, error = %e, "replica fetch failed; reconnecting");
                conn = None;
                tokio::time::sleep(broker.handles.config.replica_fetch_backoff).await;
            }
            Err(_) => {
                tracing::warn!(leader, "replica fetch timed out; reconnecting");
                conn = None;
            }
        }
    }
}

async fn connect(broker: &ReplicaManager, leader: i32) -> Option<BrokerConnection> {
    let snapshot = broker.handles.cache.snapshot();
    let b = snapshot.brokers.iter().find(|b| b.id == leader)?;
    let client_id = format!("gregor-replica-fetcher-{}", broker.broker_id);
    match broker.handles.inter_broker.connect(&b.host, b.port, &client_id).await {
        Ok(c) => Some(c),
        Err(e) if e.is_authentication() => {
            tracing::warn!(leader, listener = broker.handles.inter_broker.listener(), error = %e, "cannot authenticate to leader");
            None
        }
        Err(e) => {
            tracing::debug!(leader, error = %e, "cannot connect to leader");
            None
        }
    }
}

/// A full request when there is no session, else an incremental one: the partitions whose
/// fetch position changed since they were last sent, and those no longer followed. Costs the
/// candidates, not the partitions followed.
fn build_request(
    broker: &ReplicaManager,
    leader: i32,
    candidates: Candidates,
    session: &FollowerSession,
) -> Option<Built> {
    let Candidates { full, check, gone } = candidates;
    let mut by_topic: Vec<FetchTopic> = Vec::new();
    // Where each topic sits in `by_topic`: building a request costs the partitions in it.
    let mut slot: HashMap<&str, usize> = HashMap::new();
    let mut sent = Vec::new();
    let mut following = std::collections::HashSet::new();
    let rate = broker.handles.effective_config().follower_replication_throttled_rate;
    let snapshot = (rate < quota::UNLIMITED).then(|| broker.handles.cache.snapshot());
    let over_quota = snapshot.is_some() && broker.follower_quota.exceeded(rate);
    let mut not_following = gone;
    for tp in &check {
        let (topic, index) = tp;
        let Some(p) = broker.hosted(topic, *index) else {
            not_following.push(tp.clone());
            continue;
        };
        let (role, epoch) = p.role();
        if role != (Role::Follower { leader }) {
            not_following.push(tp.clone());
            continue;
        }
        if over_quota && snapshot.as_ref().is_some_and(|s| follower_throttled(broker, s, topic, *index)) {
            // Left out of this request and of the session (as Kafka leaves it out), so the
            // leader sends nothing for it until the bucket has refilled.
            not_following.push(tp.clone());
            continue;
        }
        following.insert(tp);
        let position = (p.log_end_offset(), p.latest_epoch(), epoch);
        if session.id != 0 && session.sent.get(tp) == Some(&position) {
            continue;
        }
        let mut fp = FetchPartition::default();
        fp.partition = *index;
        fp.current_leader_epoch = epoch;
        fp.fetch_offset = position.0;
        fp.last_fetched_epoch = position.1;
        fp.log_start_offset = p.log_start_offset();
        fp.partition_max_bytes = broker.handles.config.replica_fetch_max_bytes;
        sent.push((tp.clone(), position));
        match slot.get(topic.as_str()) {
            Some(&i) => by_topic[i].partitions.push(fp),
            None => {
                let mut t = FetchTopic::default();
                t.topic = TopicName(StrBytes::from_string(topic.clone()));
                t.partitions.push(fp);
                slot.insert(topic, by_topic.len());
                by_topic.push(t);
            }
        }
    }
    let forgotten: Vec<TopicPartition> = if full {
        session.sent.keys().filter(|tp| !following.contains(tp)).cloned().collect()
    } else {
        not_following.into_iter().filter(|tp| session.sent.contains_key(tp)).collect()
    };
    if full && following.is_empty() {
        return None;
    }
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(broker.broker_id);
    r.max_wait_ms = broker.handles.config.replica_fetch_wait_max_ms as i32;
    r.min_bytes = 1;
    r.max_bytes = broker.handles.config.replica_fetch_response_max_bytes;
    r.session_id = session.id;
    r.session_epoch = session.epoch;
    r.topics = by_topic;
    let mut gone: Vec<ForgottenTopic> = Vec::new();
    for (topic, index) in &forgotten {
        match gone.iter_mut().find(|f| f.topic.0.as_str() == topic.as_str()) {
            Some(f) => f.partitions.push(*index),
            None => {
                let mut f = ForgottenTopic::default();
                f.topic = TopicName(StrBytes::from_string(topic.clone()));
                f.partitions.push(*index);
                gone.push(f);
            }
        }
    }
    r.forgotten_topics_data = gone;
    Some(Built { request: r, sent, forgotten })
}

async fn exchange(
    stream: &mut BrokerConnection,
    broker: &ReplicaManager,
    correlation_id: i32,
    request: &FetchRequest,
    rx: &mut BytesMut,
) -> anyhow::Result<FetchResponse> {
    let mut header = RequestHeader::default();
    header.request_api_key = ApiKey::Fetch as i16;
    header.request_api_version = FETCH_VERSION;
    header.correlation_id = correlation_id;
    header.client_id = Some(StrBytes::from_string(format!("gregor-replica-fetcher-{}", broker.broker_id)));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header.encode(&mut buf, ApiKey::Fetch.request_header_version(FETCH_VERSION))?;
    request.encode(&mut buf, FETCH_VERSION)?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    stream.write_all(&buf).await?;
    // TLS holds written bytes in its session buffer until flushed.
    stream.flush().await?;
    let mut body = read_response(stream, broker, rx).await?;
    let rh = ResponseHeader::decode(&mut body, ApiKey::Fetch.response_header_version(FETCH_VERSION))?;
    if rh.correlation_id != correlation_id {
        anyhow::bail!("correlation id {} does not match {correlation_id}", rh.correlation_id);
    }
    FetchResponse::decode(&mut body, FETCH_VERSION)
}

/// Reads one response frame into `rx` and returns its body (without the size prefix).
///
/// `rx` is the fetcher's own buffer, kept from one fetch to the next: the body's records are
/// slices of it until applied, after which the allocation is free to take the next response.
/// A fresh buffer per response of megabytes cost a page fault per 4 KiB on every fetch, plus
/// the allocator returning the pages, which together cost the follower about as much as
/// writing the records to its log. The size prefix and a small body come in one read.
async fn read_response(
    stream: &mut BrokerConnection,
    broker: &ReplicaManager,
    rx: &mut BytesMut,
) -> anyhow::Result<Bytes> {
    rx.clear();
    rx.reserve(RX_FIRST_READ);
    while rx.len() < 4 {
        if stream.read_buf(rx).await? == 0 {
            anyhow::bail!("connection closed before a response");
        }
    }
    let size = i32::from_be_bytes([rx[0], rx[1], rx[2], rx[3]]);
    if size < 0 || size as usize > broker.handles.config.socket_request_max_bytes {
        anyhow::bail!("response of {size} bytes");
    }
    let total = 4 + size as usize;
    if rx.len() > total {
        // One request is in flight at a time: nothing may follow its answer.
        anyhow::bail!("{} bytes after a response of {size} bytes", rx.len() - total);
    }
    rx.reserve(total - rx.len());
    // The low-water mark must never exceed the bytes still to come, or the last wake-up never
    // happens: it follows every partial read down.
    let mut low_water = 0usize;
    while rx.len() < total {
        let want = total - rx.len();
        if (want > LOW_WATER_FROM || low_water > 0) && low_water != want {
            if stream.set_recv_low_water(want) {
                low_water = want;
            } else if low_water > 0 {
                anyhow::bail!("cannot lower the receive low-water mark");
            }
        }
        if stream.read_buf(&mut (&mut *rx).limit(want)).await? == 0 {
            anyhow::bail!("connection closed after {} of {size} response bytes", rx.len() - 4);
        }
    }
    if low_water > 1 && !stream.set_recv_low_water(1) {
        anyhow::bail!("cannot reset the receive low-water mark");
    }
    let mut frame = rx.split_to(total).freeze();
    let asked = broker.handles.config.replica_fetch_response_max_bytes as usize
        + broker.handles.config.replica_fetch_max_bytes as usize;
    if total > asked {
        // An answer larger than this follower asks for (one oversized batch): not worth
        // keeping the allocation for.
        *rx = BytesMut::new();
    }
    frame.advance(4);
    Ok(frame)
}

/// A partition this follower copies under `follower.replication.throttled.rate`: listed for
/// this broker in its topic's `follower.replication.throttled.replicas` and not in the ISR.
fn follower_throttled(broker: &ReplicaManager, snapshot: &ClusterSnapshot, topic: &str, index: i32) -> bool {
    let me = broker.broker_id;
    let Some(t) = snapshot.topics.get(topic) else { return false };
    quota::is_throttled(t.configs.get("follower.replication.throttled.replicas"), index, me)
        && !t.partitions.iter().any(|p| p.index == index && p.isr.contains(&me))
}

/// Applies one response. Returns false if any partition reported an error worth backing off
/// for (leadership in flux).
fn apply(broker: &ReplicaManager, leader: i32, response: FetchResponse) -> bool {
    let mut healthy = response.error_code == 0;
    let rate = broker.handles.effective_config().follower_replication_throttled_rate;
    let snapshot = (rate < quota::UNLIMITED).then(|| broker.handles.cache.snapshot());
    for t in response.responses {
        let topic = t.topic.0.to_string();
        for pd in t.partitions {
            if let Some(s) = &snapshot {
                let bytes = pd.records.as_ref().map_or(0, |r| r.len());
                if bytes > 0 && follower_throttled(broker, s, &topic, pd.partition_index) {
                    broker.follower_quota.record(rate, bytes);
                }
            }
            let Some(p) = broker.hosted(&topic, pd.partition_index) else { continue };
            if p.role().0 != (Role::Follower { leader }) {
                continue;
            }
            let result = match pd.error_code {
                0 if pd.diverging_epoch.epoch >= 0 || pd.diverging_epoch.end_offset >= 0 => {
                    let local = p.end_offset_for_epoch(pd.diverging_epoch.epoch);
                    let target = truncation_offset(
                        (pd.diverging_epoch.epoch, pd.diverging_epoch.end_offset),
                        local,
                        p.log_end_offset(),
                        pd.log_start_offset,
                    );
                    tracing::info!(%topic, partition = pd.partition_index, target, "log diverged from leader; truncating");
                    p.truncate_to(target)
                }
                0 => p.append_as_follower(leader, pd.records.as_deref().unwrap_or(&[]), pd.high_watermark),
                code if code == ErrorCode::OffsetOutOfRange.code() => {
                    let leo = p.log_end_offset();
                    if leo < pd.log_start_offset {
                        p.reset_to(pd.log_start_offset)
                    } else {
                        p.truncate_to(pd.high_watermark.max(0))
                    }
                }
                code => {
                    tracing::debug!(%topic, partition = pd.partition_index, code, "replica fetch error");
                    healthy = false;
                    Ok(())
                }
            };
            if let Err(e) = result {
                tracing::warn!(%topic, partition = pd.partition_index, error = %e, "cannot apply fetched data");
                healthy = false;
            }
        }
    }
    healthy
}

/// Where a follower cuts its log when the leader reports a diverging epoch (KIP-595): at the
/// leader's end of that epoch, or earlier where this log's own end of it is earlier, never
/// past this log's end nor below the leader's log start.
fn truncation_offset(leader: (i32, i64), local: (i32, i64), log_end: i64, leader_log_start: i64) -> i64 {
    let (epoch, leader_end) = leader;
    let (local_epoch, local_end) = local;
    let mut target = leader_end.min(log_end);
    if local_epoch == epoch {
        target = target.min(local_end);
    }
    target.max(leader_log_start).max(0)
}

#[cfg(test)]
mod tests {
    use super::truncation_offset;

    #[test]
    fn divergence_truncates_to_where_the_logs_agree() {
        // The leader's epoch 3 ended at 40; this log has 55 records, its epoch 3 ends at 50.
        assert_eq!(truncation_offset((3, 40), (3, 50), 55, 0), 40);
        // This log's epoch 3 ends first: keep only what both hold.
        assert_eq!(truncation_offset((3, 40), (3, 30), 55, 0), 30);
        // This log knows an older epoch only: the leader's end governs, bounded by our end.
        assert_eq!(truncation_offset((3, 40), (2, 20), 35, 0), 35);
        // A deposed leader with records in an epoch the new leader never had (its first
        // epoch starts at 0): everything goes.
        assert_eq!(truncation_offset((1, 0), (1, 7), 7, 0), 0);
        // Never below the leader's log start.
        assert_eq!(truncation_offset((1, 0), (1, 7), 7, 5), 5);
    }
}
