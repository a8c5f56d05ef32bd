//! Fetch (with long-poll) and ListOffsets.
//!
//! Fetch returns stored batches byte for byte, starting at the batch that contains the fetch
//! offset. It waits up to `max_wait_ms` for `min_bytes`, woken by appends, never by polling.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::RequestContext;
use crate::client_quota::CONSUMER_BYTE_RATE;
use crate::log::zero_copy;
use crate::protocol::ErrorCode;
use crate::replication::fetch_session::{Changes, Session, SessionPartition};
use crate::replication::{quota, FetchResult, FollowerPosition, Partition};
use crate::security::authorizer::{Operation, ResourceType};
use crate::sync::MutexExt;

mod offsets;

pub use offsets::{list_offsets, list_offsets_v0, offset_for_leader_epoch, OldStyleOffsets};
const EARLIEST_TIMESTAMP: i64 = -2;
const LATEST_TIMESTAMP: i64 = -1;
const MAX_TIMESTAMP: i64 = -3;

/// (topic, partition) of a session's partitions.
type PartitionKeys = BTreeSet<(String, i32)>;

struct WantedPartition {
    index: i32,
    offset: i64,
    max_bytes: i32,
    current_leader_epoch: i32,
    last_fetched_epoch: i32,
}

struct Wanted {
    name: String,
    id: Uuid,
    partitions: Vec<WantedPartition>,
}

pub async fn handle(ctx: &RequestContext, req: FetchRequest) -> FetchResponse {
    let version = ctx.version();
    let mut r = FetchResponse::default();
    // A follower names itself (v15+ in replica_state); consumers send -1.
    let replica = if version >= 15 { req.replica_state.replica_id.0 } else { req.replica_id.0 };
    let snapshot = ctx.components.cache.snapshot();
    let topic_of = |name: &TopicName, id: Uuid| -> (String, Uuid) {
        if version >= 13 {
            match snapshot.topic_by_id(id) {
                Some(info) => (info.name.clone(), id),
                None => (String::new(), id),
            }
        } else {
            let name = name.0.to_string();
            let id = snapshot.topics.get(&name).map(|i| i.id).unwrap_or_default();
            (name, id)
        }
    };
    let requested = requested(&req, version, &topic_of);
    let mut s = match use_session(ctx, &req, replica, requested, &topic_of) {
        Ok(s) => s,
        Err(code) => {
            r.error_code = code;
            return r;
        }
    };
    r.session_id = s.session_id;

    // consumer_byte_rate: a consumer over its quota gets no data, after its throttle time.
    let (user, client) = super::quotas::quota_identity(ctx);
    let window = ctx.components.quotas.window();
    if replica < 0 {
        let throttle = ctx.components.quotas.throttle_time(CONSUMER_BYTE_RATE, user, &client, window);
        if !throttle.is_zero() {
            tokio::time::sleep(throttle).await;
            r.throttle_time_ms = throttle.as_millis().min(i32::MAX as u128) as i32;
            r.responses = throttled_answer(&s.wanted);
            // Nothing was read: the session's next fetch must still read what this one would
            // have (every partition of a session this request opened).
            if let Some((c, keys)) = &s.changes {
                for (topic, index) in keys {
                    c.mark(topic, *index);
                }
            }
            return r;
        }
    }
    let rack = if version >= 11 { req.rack_id.as_str() } else { "" };
    let max_wait = Duration::from_millis(req.max_wait_ms.max(0) as u64);
    let deadline = Instant::now() + max_wait;
    let min_bytes = req.min_bytes.max(0) as usize;
    // isolation_level (v4+): 1 is read_committed, which followers never ask for.
    let committed = version >= 4 && replica < 0 && req.isolation_level == 1;
    let max_bytes = if req.max_bytes <= 0 { i32::MAX as usize } else { req.max_bytes as usize };
    // Fetch v4+ only: older versions convert the records, which needs their bytes.
    let sendfile = ctx.sendfile && version >= 4;
    // A follower's session: its reads link the follower's progress to it, and mark what the
    // next fetch owes.
    let session = s.changes.as_ref().filter(|_| replica >= 0).map(|(c, _)| c.clone());
    let params =
        Arc::new(ReadParams { max_bytes, version, replica, rack: rack.to_string(), committed, sendfile, session });
    let until = Until { deadline, min_bytes };
    let responses = read_until_ready(ctx, &params, s.wanted, &mut s.changes, s.session.as_ref(), until).await;
    r.responses = match s.session {
        Some(session) => {
            // A follower's owed partitions were kept by the reads themselves.
            let pending = s.changes.as_ref().filter(|_| replica < 0).map(|(c, _)| (&**c, committed));
            only_news(&mut session.lock_unpoisoned(), responses, s.incremental, pending)
        }
        None => responses,
    };
    count_bytes_out(ctx, &r.responses, replica >= 0);
    if replica < 0 {
        let sent: usize =
            r.responses.iter().flat_map(|t| &t.partitions).map(|p| p.records.as_ref().map_or(0, |b| b.len())).sum();
        let throttle = ctx.components.quotas.record(CONSUMER_BYTE_RATE, user, &client, sent, window);
        r.throttle_time_ms = throttle.as_millis().min(i32::MAX as u128) as i32;
    }
    r
}

/// A topic's name and id as the request names it: by id from v13 (an empty name when the id
/// is unknown), by name before (a nil id when the name is unknown).
type TopicOf<'a> = &'a dyn Fn(&TopicName, Uuid) -> (String, Uuid);

/// The partitions the request names, and where in them it reads.
fn requested(req: &FetchRequest, version: i16, topic_of: TopicOf<'_>) -> Vec<Wanted> {
    req.topics
        .iter()
        .map(|t| {
            let (name, id) = topic_of(&t.topic, t.topic_id);
            let partitions = t
                .partitions
                .iter()
                .map(|p| WantedPartition {
                    index: p.partition,
                    offset: p.fetch_offset,
                    max_bytes: p.partition_max_bytes,
                    current_leader_epoch: p.current_leader_epoch,
                    last_fetched_epoch: if version >= 12 { p.last_fetched_epoch } else { -1 },
                })
                .collect();
            Wanted { name, id, partitions }
        })
        .collect()
}

/// What a fetch reads, and the fetch session (v7+) it reads through.
struct SessionRead {
    /// The request's partitions, or a continued session's.
    wanted: Vec<Wanted>,
    session: Option<Arc<Mutex<Session>>>,
    /// The request continued a session: the answer holds only what changed.
    incremental: bool,
    /// The session's change marks, and the partitions this fetch reads.
    changes: Option<(Arc<Changes>, PartitionKeys)>,
    /// The session id the answer names (0: none).
    session_id: i32,
}

/// Fetch sessions (v7+): epoch 0 or -1 is a full fetch, which closes the session it names;
/// epoch 0 opens a new one. Any other epoch continues the named session. `Err` is the error
/// code the whole request is answered with.
fn use_session(
    ctx: &RequestContext,
    req: &FetchRequest,
    replica: i32,
    requested: Vec<Wanted>,
    topic_of: TopicOf<'_>,
) -> Result<SessionRead, i16> {
    let sessions = &ctx.components.replicas.fetch_sessions;
    let now = Instant::now();
    let full = req.session_epoch == 0 || req.session_epoch == -1;
    if full && req.session_id != 0 {
        sessions.remove(req.session_id);
    }
    if !full {
        return continue_session(ctx, req, replica, &requested, topic_of, now);
    }
    let mut read = SessionRead { wanted: Vec::new(), session: None, incremental: false, changes: None, session_id: 0 };
    if req.session_epoch == 0 && ctx.version() >= 7 {
        let partitions = requested
            .iter()
            .flat_map(|w| {
                w.partitions.iter().map(move |p| ((w.name.clone(), p.index), session_partition(w.id, p, None)))
            })
            .collect();
        // A full cache of sessions worth keeping: answered without one (id 0).
        if let Some((id, s)) = sessions.create(replica, partitions, now) {
            let mut g = s.lock_unpoisoned();
            let keys: PartitionKeys = g.partitions.keys().cloned().collect();
            watch_session_partitions(ctx, &mut g, &keys);
            if replica >= 0 {
                g.changes.touch(now);
            }
            read.changes = Some((g.changes.clone(), keys));
            drop(g);
            read.session = Some(s);
            read.session_id = id;
        }
    }
    read.wanted = requested;
    Ok(read)
}

/// An incremental fetch: the named session at the expected epoch takes the request's
/// partitions and forgets those it lists, and the fetch reads the session's partitions.
fn continue_session(
    ctx: &RequestContext,
    req: &FetchRequest,
    replica: i32,
    requested: &[Wanted],
    topic_of: TopicOf<'_>,
    now: Instant,
) -> Result<SessionRead, i16> {
    let sessions = &ctx.components.replicas.fetch_sessions;
    let s = sessions.get(req.session_id, now).ok_or(ErrorCode::FetchSessionIdNotFound.code())?;
    let mut g = s.lock_unpoisoned();
    if req.session_epoch != g.epoch || g.replica != replica {
        return Err(ErrorCode::InvalidFetchSessionEpoch.code());
    }
    g.epoch = if g.epoch == i32::MAX { 1 } else { g.epoch + 1 };
    for w in requested {
        for p in &w.partitions {
            let sent = g
                .partitions
                .get(&(w.name.clone(), p.index))
                .map(|x| (x.sent_high_watermark, x.sent_log_start_offset, x.sent_last_stable_offset));
            g.partitions.insert((w.name.clone(), p.index), session_partition(w.id, p, sent));
        }
    }
    for f in &req.forgotten_topics_data {
        let (name, _) = topic_of(&f.topic, f.topic_id);
        for index in &f.partitions {
            g.partitions.remove(&(name.clone(), *index));
            if replica >= 0 {
                if let Some(p) = ctx.components.replicas.hosted(&name, *index) {
                    p.forget_follower_session(replica);
                }
            }
        }
    }
    if replica >= 0 {
        g.changes.touch(now);
    }
    let keys = g.to_read(requested.iter().flat_map(|w| w.partitions.iter().map(|p| (w.name.clone(), p.index))));
    watch_session_partitions(ctx, &mut g, &keys);
    let wanted = session_wanted(&g, &keys);
    let changes = Some((g.changes.clone(), keys));
    let size = g.partitions.len();
    drop(g);
    sessions.resize(req.session_id, size);
    Ok(SessionRead { wanted, session: Some(s), incremental: true, changes, session_id: req.session_id })
}

/// When a fetch may answer: once it has `min_bytes`, or at `deadline` with what there is.
struct Until {
    deadline: Instant,
    min_bytes: usize,
}

/// Reads until the fetch may answer (or a partition answers with an error), waiting in
/// between for the partitions' appends with the request's slot given back. Leaves the file
/// ranges behind the answer's placeholders for the response writer.
async fn read_until_ready(
    ctx: &RequestContext,
    params: &Arc<ReadParams>,
    wanted: Vec<Wanted>,
    changes: &mut Option<(Arc<Changes>, PartitionKeys)>,
    session: Option<&Arc<Mutex<Session>>>,
    Until { deadline, min_bytes }: Until,
) -> Vec<FetchableTopicResponse> {
    let mut parked = None;
    // Woken only by the partitions this fetch reads: each read with `watch` registers it.
    let waiter = Arc::new(Notify::new());
    let mut watch = None;
    let mut wanted = Arc::new(wanted);
    let (responses, files) = loop {
        let ((responses, total, any_error), files) = read(ctx, &wanted, params, watch).await;
        let now = Instant::now();
        if total >= min_bytes || any_error || now >= deadline || total > 0 && min_bytes == 0 {
            break (responses, files);
        }
        if let (Some((c, keys)), Some(s)) = (changes.as_mut(), session) {
            // A session is told of its partitions' changes: wait for one, then read what
            // changed as well. A change since the marks were taken has left a permit.
            parked.get_or_insert_with(|| {
                ctx.park();
                ctx.components.metrics.park_fetch()
            });
            let woken = tokio::time::timeout(deadline - now, c.notify.notified()).await.is_ok();
            let marked = c.take();
            {
                let mut g = s.lock_unpoisoned();
                // A partition hosted again since (a new replica object) is watched from now on.
                watch_session_partitions(ctx, &mut g, &marked);
                keys.extend(marked);
                wanted = Arc::new(session_wanted(&g, keys));
            }
            if !woken {
                let ((responses, _, _), files) = read(ctx, &wanted, params, None).await;
                break (responses, files);
            }
            continue;
        }
        if watch.is_none() {
            // Read again, registered before each partition's read, so an append between a
            // read and the wait still wakes this fetch. Fetches answered at once (the common
            // case under load) never register.
            watch = Some(&waiter);
            continue;
        }
        parked.get_or_insert_with(|| {
            ctx.park();
            ctx.components.metrics.park_fetch()
        });
        if tokio::time::timeout(deadline - now, waiter.notified()).await.is_err() {
            // Timed out: one last read so data that arrived at the very end is not missed.
            let ((responses, _, _), files) = read(ctx, &wanted, params, None).await;
            break (responses, files);
        }
    };
    *ctx.file_ranges.lock_unpoisoned() = files;
    drop(parked);
    responses
}

/// What a throttled consumer is told: every partition it asked for, without data (offsets
/// and watermarks unknown, no error), as Kafka's throttled fetch response.
fn throttled_answer(wanted: &[Wanted]) -> Vec<FetchableTopicResponse> {
    wanted
        .iter()
        .map(|w| {
            let mut t = FetchableTopicResponse::default();
            t.topic = TopicName(StrBytes::from_string(w.name.clone()));
            t.topic_id = w.id;
            t.partitions = w
                .partitions
                .iter()
                .map(|wp| {
                    let mut pd = PartitionData::default();
                    pd.partition_index = wp.index;
                    pd.high_watermark = -1;
                    pd.last_stable_offset = -1;
                    pd.log_start_offset = -1;
                    pd.preferred_read_replica = BrokerId(-1);
                    pd
                })
                .collect();
            t
        })
        .collect()
}

/// Counts what this answer sends, once: a long-poll may read several times before it answers.
/// Per topic, since a topic's partitions share their counters; one lookup finds them.
fn count_bytes_out(ctx: &RequestContext, responses: &[FetchableTopicResponse], to_follower: bool) {
    for t in responses {
        let sent = |p: &PartitionData| p.records.as_ref().map_or(0, |r| r.len());
        let bytes: usize = t.partitions.iter().map(sent).sum();
        let Some(with_records) = t.partitions.iter().find(|p| sent(p) > 0) else { continue };
        let Some(p) = ctx.components.replicas.hosted(t.topic.0.as_str(), with_records.partition_index) else {
            continue;
        };
        if to_follower {
            p.metrics().record_follower_fetch(bytes as u64);
        } else {
            p.metrics().record_consumer_fetch(bytes as u64);
        }
    }
}

/// The session's partitions in `keys`, grouped by topic.
fn session_wanted(g: &Session, keys: &PartitionKeys) -> Vec<Wanted> {
    let mut all: Vec<Wanted> = Vec::new();
    let mut add = |name: &String, index: i32, sp: &SessionPartition| {
        if all.last().is_none_or(|w| w.name != *name) {
            all.push(Wanted { name: name.clone(), id: sp.topic_id, partitions: Vec::new() });
        }
        if let Some(w) = all.last_mut() {
            w.partitions.push(WantedPartition {
                index,
                offset: sp.fetch_offset,
                max_bytes: sp.max_bytes,
                current_leader_epoch: sp.current_leader_epoch,
                last_fetched_epoch: sp.last_fetched_epoch,
            });
        }
    };
    for key in keys {
        if let Some(sp) = g.partitions.get(key) {
            add(&key.0, key.1, sp);
        }
    }
    all
}

/// Has each of `keys` mark the session at its changes; those with no replica here (yet, or
/// any more) are read on every fetch instead. Costs one lookup per key: called with every
/// partition only when the session opens.
fn watch_session_partitions(ctx: &RequestContext, g: &mut Session, keys: &PartitionKeys) {
    for key in keys {
        if !g.partitions.contains_key(key) {
            g.unwatched.remove(key);
            continue;
        }
        match ctx.components.replicas.hosted(&key.0, key.1) {
            Some(p) => {
                p.watch_changes(&g.changes);
                g.unwatched.remove(key);
            }
            None => {
                g.unwatched.insert(key.clone());
            }
        }
    }
}

fn session_partition(topic_id: Uuid, p: &WantedPartition, sent: Option<(i64, i64, i64)>) -> SessionPartition {
    let (sent_high_watermark, sent_log_start_offset, sent_last_stable_offset) = sent.unwrap_or((-1, -1, -1));
    SessionPartition {
        topic_id,
        fetch_offset: p.offset,
        max_bytes: p.max_bytes,
        current_leader_epoch: p.current_leader_epoch,
        last_fetched_epoch: p.last_fetched_epoch,
        sent_high_watermark,
        sent_log_start_offset,
        sent_last_stable_offset,
    }
}

/// Records what the fetcher is told and, for an incremental answer, leaves out the
/// partitions that have nothing new for it. With `pending` (a consumer's session and whether
/// it reads committed only), a partition that has records for the consumer but sent none
/// (the response was full) stays marked changed, to be read at the next fetch although the
/// consumer will not name it.
fn only_news(
    session: &mut Session,
    responses: Vec<FetchableTopicResponse>,
    incremental: bool,
    pending: Option<(&Changes, bool)>,
) -> Vec<FetchableTopicResponse> {
    let mut out = Vec::new();
    for mut topic in responses {
        let name = topic.topic.0.to_string();
        topic.partitions.retain(|pd| {
            let Some(sp) = session.partitions.get_mut(&(name.clone(), pd.partition_index)) else { return true };
            if let Some((changes, committed)) = pending {
                let readable = if committed { pd.last_stable_offset } else { pd.high_watermark };
                let sent_nothing = pd.records.as_ref().is_none_or(|r| r.is_empty());
                if pd.error_code == 0 && sent_nothing && sp.fetch_offset < readable {
                    changes.mark(&name, pd.partition_index);
                }
            }
            let news = !incremental
                || pd.error_code != 0
                || pd.records.as_ref().is_some_and(|r| !r.is_empty())
                || pd.diverging_epoch.epoch >= 0
                || pd.preferred_read_replica.0 >= 0
                || pd.high_watermark != sp.sent_high_watermark
                || pd.last_stable_offset != sp.sent_last_stable_offset
                || pd.log_start_offset != sp.sent_log_start_offset;
            if news {
                sp.sent_high_watermark = pd.high_watermark;
                sp.sent_last_stable_offset = pd.last_stable_offset;
                sp.sent_log_start_offset = pd.log_start_offset;
            }
            news
        });
        if !topic.partitions.is_empty() || !incremental {
            out.push(topic);
        }
    }
    out
}

/// What a Fetch asks of every partition it reads.
struct ReadParams {
    max_bytes: usize,
    version: i16,
    /// The follower's broker id, or negative for a consumer.
    replica: i32,
    rack: String,
    /// read_committed: records up to the last stable offset only.
    committed: bool,
    /// Large record sets may stay in their files, for the response writer to sendfile.
    sendfile: bool,
    /// A follower's fetch session.
    session: Option<Arc<Changes>>,
}

type ReadOutcome = ((Vec<FetchableTopicResponse>, usize, bool), zero_copy::FileRanges);

/// Reads the wanted partitions once. When some partition is read from below its active
/// segment, where pages are the likeliest to have left the page cache, the whole read (index
/// lookups, header scans, preads) is one hop to the I/O pool. Reads of the active segment,
/// just written, and fetches that find nothing new stay on the network worker: a hop costs
/// two thread switches, more than such a read. The sendfile placeholders are collected on
/// the thread that reads (they are thread-local).
async fn read(
    ctx: &RequestContext,
    wanted: &Arc<Vec<Wanted>>,
    params: &Arc<ReadParams>,
    watch: Option<&Arc<Notify>>,
) -> ReadOutcome {
    let partitions = resolve(ctx, wanted, params);
    let reads_cold = wanted.iter().flat_map(|w| &w.partitions).zip(&partitions).any(|(wp, p)| {
        // The published log bounds: a look that never waits for the log's lock, which an
        // append holds while it writes.
        p.as_ref().is_some_and(|p| {
            let stats = p.log_stats();
            wp.offset < stats.active_segment_base().min(stats.log_end_offset()) && wp.offset >= stats.log_start_offset()
        })
    });
    if !reads_cold {
        return zero_copy::collect(params.sendfile, || read_all(ctx, wanted, &partitions, params, watch));
    }
    let dirs = ctx.components.replicas.log_dirs_of(partitions.iter().flatten().map(|p| &**p));
    let (c, w, p, watch) = (ctx.clone(), wanted.clone(), params.clone(), watch.cloned());
    let job = move || zero_copy::collect(p.sendfile, || read_all(&c, &w, &partitions, &p, watch.as_ref()));
    match ctx.components.io.run_on(dirs, job).await {
        Ok(outcome) => outcome,
        Err(e) => {
            tracing::error!(error = %e, "fetch read failed");
            let mut responses = throttled_answer(wanted);
            for pd in responses.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
                pd.error_code = ErrorCode::UnknownServerError.code();
            }
            ((responses, 0, true), zero_copy::FileRanges::default())
        }
    }
}

/// The replica each wanted partition is read from, in order (None: not here, or no topic).
fn resolve(ctx: &RequestContext, wanted: &[Wanted], params: &ReadParams) -> Vec<Option<Arc<Partition>>> {
    let replicas = &ctx.components.replicas;
    // A consumer with Fetch v11+ may read from a follower (KIP-392).
    let any_replica = params.replica < 0 && params.version >= 11;
    wanted
        .iter()
        .flat_map(|w| {
            w.partitions.iter().map(move |wp| match (w.name.is_empty(), any_replica) {
                (true, _) => None,
                (false, true) => replicas.hosted(&w.name, wp.index),
                (false, false) => replicas.partition(&w.name, wp.index),
            })
        })
        .collect()
}

fn read_all(
    ctx: &RequestContext,
    wanted: &[Wanted],
    partitions: &[Option<Arc<Partition>>],
    params: &ReadParams,
    watch: Option<&Arc<Notify>>,
) -> (Vec<FetchableTopicResponse>, usize, bool) {
    let (max_bytes, version, replica, committed) = (params.max_bytes, params.version, params.replica, params.committed);
    let rack = params.rack.as_str();
    let mut partitions = partitions.iter();
    let broker = &ctx.components;
    let mut remaining = max_bytes;
    let mut total = 0usize;
    let mut any_error = false;
    let mut out = Vec::with_capacity(wanted.len());
    let throttle_rate = broker.effective_config().leader_replication_throttled_rate;
    // A follower needs CLUSTER_ACTION on the cluster, a consumer READ on each topic.
    let follower_allowed = replica >= 0 && ctx.authorized_cluster(Operation::ClusterAction);
    for w in wanted {
        let may_read = if replica >= 0 {
            follower_allowed
        } else {
            w.name.is_empty() || ctx.authorized(Operation::Read, ResourceType::Topic, &w.name)
        };
        // This leader's throttled replicas of the topic, for a follower's fetch (KIP-73).
        let throttled = (replica >= 0 && throttle_rate < quota::UNLIMITED)
            .then(|| broker.cache.topic(&w.name))
            .flatten()
            .and_then(|t| t.configs.get("leader.replication.throttled.replicas").cloned());
        let mut topic = FetchableTopicResponse::default();
        topic.topic = TopicName(StrBytes::from_string(w.name.clone()));
        topic.topic_id = w.id;
        // Kafka refuses every partition of a topic that forbids down-conversion to a consumer
        // whose Fetch version needs it, whatever the stored batches hold; followers never
        // convert.
        let conversion_refused = version < 4 && replica < 0 && !down_conversion_enabled(broker, &w.name);
        for wp in &w.partitions {
            let mut pd = PartitionData::default();
            pd.partition_index = wp.index;
            pd.high_watermark = -1;
            pd.last_stable_offset = -1;
            pd.log_start_offset = -1;
            pd.preferred_read_replica = BrokerId(-1);
            let partition = partitions.next().cloned().flatten();
            if !may_read {
                pd.error_code = ErrorCode::TopicAuthorizationFailed.code();
                any_error = true;
                topic.partitions.push(pd);
                continue;
            }
            match partition {
                Some(_) if conversion_refused => {
                    pd.error_code = ErrorCode::UnsupportedVersion.code();
                    any_error = true;
                }
                None => {
                    pd.error_code = if version >= 13 && w.name.is_empty() {
                        ErrorCode::UnknownTopicId.code()
                    } else {
                        super::not_led_error(broker, &w.name, wp.index)
                    };
                    any_error = true;
                }
                Some(p) => {
                    match watch {
                        Some(w) if replica >= 0 => p.watch_log_end(w),
                        Some(w) => p.watch(w),
                        None => {}
                    }
                    let limit = (wp.max_bytes.max(0) as usize).min(remaining);
                    let result = if limit == 0 && total > 0 {
                        // Budget spent: report offsets only, no records (a follower's session
                        // reads it again next time, its position unchanged).
                        if let Some(c) = &params.session {
                            c.keep(&w.name, wp.index);
                        }
                        FetchResult {
                            error_code: 0,
                            high_watermark: p.high_watermark(),
                            log_start_offset: p.log_start_offset(),
                            records: Bytes::new(),
                            diverging: None,
                            last_stable_offset: p.last_stable_offset(),
                            aborted: None,
                        }
                    } else if replica >= 0 {
                        follower_read(
                            broker,
                            &p,
                            wp,
                            replica,
                            limit,
                            params,
                            (throttled.as_ref(), throttle_rate),
                            &w.name,
                        )
                    } else if !p.is_leader() {
                        p.read_as_follower(wp.offset, limit.max(1), wp.current_leader_epoch, committed)
                    } else if let Some(preferred) = preferred_read_replica(broker, &p, rack, wp.offset) {
                        // Sent at once (as Kafka does): the client fetches from there instead.
                        pd.preferred_read_replica = BrokerId(preferred);
                        any_error = true;
                        FetchResult {
                            error_code: 0,
                            high_watermark: p.high_watermark(),
                            log_start_offset: p.log_start_offset(),
                            records: Bytes::new(),
                            diverging: None,
                            last_stable_offset: p.last_stable_offset(),
                            aborted: None,
                        }
                    } else {
                        p.read(wp.offset, limit.max(1), wp.current_leader_epoch, committed)
                    };
                    pd.error_code = result.error_code;
                    pd.high_watermark = result.high_watermark;
                    pd.last_stable_offset = result.last_stable_offset;
                    if version >= 4 && committed {
                        pd.aborted_transactions = result.aborted.map(|list| {
                            list.into_iter()
                                .map(|(producer_id, first_offset)| {
                                    let mut a = AbortedTransaction::default();
                                    a.producer_id = ProducerId(producer_id);
                                    a.first_offset = first_offset;
                                    a
                                })
                                .collect()
                        });
                    }
                    pd.log_start_offset = result.log_start_offset;
                    if let Some((epoch, end_offset)) = result.diverging {
                        pd.diverging_epoch.epoch = epoch;
                        pd.diverging_epoch.end_offset = end_offset;
                        // Answer at once: the follower must truncate before anything else.
                        any_error = true;
                    }
                    if result.error_code != 0 {
                        any_error = true;
                    }
                    let records = if version < 4 && !result.records.is_empty() {
                        match down_convert(ctx, &result.records, version, wp.offset, limit) {
                            Ok(r) => r,
                            Err(code) => {
                                pd.error_code = code;
                                any_error = true;
                                Bytes::new()
                            }
                        }
                    } else {
                        result.records
                    };
                    let n = records.len();
                    total += n;
                    remaining = remaining.saturating_sub(n);
                    pd.records = Some(records);
                }
            }
            topic.partitions.push(pd);
        }
        out.push(topic);
    }
    (out, total, any_error)
}

/// A follower's read of a partition this broker leads: its progress recorded, the ISR grown
/// if it caught up, the copy held back while over a leader replication quota. In a session,
/// what the read leaves owed (an error, records held back, an ISR expansion still to
/// propose) makes the next fetch read the partition again.
#[allow(clippy::too_many_arguments)]
fn follower_read(
    broker: &crate::api::Components,
    p: &Arc<Partition>,
    wp: &WantedPartition,
    replica: i32,
    limit: usize,
    params: &ReadParams,
    (throttled, rate): (Option<&String>, u64),
    topic: &str,
) -> FetchResult {
    let position = FollowerPosition {
        fetch_offset: wp.offset,
        last_fetched_epoch: wp.last_fetched_epoch,
        current_leader_epoch: wp.current_leader_epoch,
    };
    let (mut result, expand, _hw_moved) =
        p.follower_fetch_in_session(replica, position, limit.max(1), params.session.as_ref());
    if let Some(isr) = expand {
        broker.replicas.record_isr_change(p, isr);
    }
    let in_isr = p.in_isr(replica);
    let mut held_back = false;
    if !in_isr && quota::is_throttled(throttled, wp.index, broker.config.broker_id) {
        // Its progress is recorded; only the copy waits for the bucket.
        if broker.replicas.leader_quota.exceeded(rate) {
            held_back = !result.records.is_empty();
            result.records = Bytes::new();
        } else {
            broker.replicas.leader_quota.record(rate, result.records.len());
        }
    }
    if let Some(c) = &params.session {
        if result.error_code != 0 || result.diverging.is_some() || held_back || !in_isr {
            c.keep(topic, wp.index);
        }
    }
    result
}

/// Kafka's `RackAwareReplicaSelector`: for a consumer in another rack than this leader, the
/// most caught-up in-sync follower in the consumer's rack that holds the offset; None: read
/// here.
fn preferred_read_replica(
    broker: &crate::api::Components,
    p: &crate::replication::Partition,
    rack: &str,
    offset: i64,
) -> Option<i32> {
    if !broker.config.rack_aware_selector || rack.is_empty() || broker.config.rack.as_deref() == Some(rack) {
        return None;
    }
    let candidates = p.in_sync_followers_at(offset);
    if candidates.is_empty() {
        return None;
    }
    let snapshot = broker.cache.snapshot();
    let in_rack = |id: i32| snapshot.brokers.iter().any(|b| b.id == id && b.rack.as_deref() == Some(rack));
    candidates.into_iter().filter(|(id, _)| in_rack(*id)).max_by_key(|(_, leo)| *leo).map(|(id, _)| id)
}

/// `message.downconversion.enable` of the topic, else the broker's
/// `log.message.downconversion.enable`.
fn down_conversion_enabled(broker: &crate::api::Components, topic: &str) -> bool {
    broker
        .cache
        .topic(topic)
        .and_then(|t| t.configs.get("message.downconversion.enable").map(|v| v.trim() != "false"))
        .unwrap_or(broker.config.log.message_downconversion_enable)
}

/// Fetch v0-v3 readers get message sets: format v0 for Fetch v0/v1, v1 for v2/v3 (Kafka's
/// down-conversion; the log holds v2 batches only). The conversion is bounded by what the
/// partition may return, beyond the first batch.
fn down_convert(ctx: &RequestContext, stored: &[u8], version: i16, offset: i64, limit: usize) -> Result<Bytes, i16> {
    let magic = if version <= 1 { 0 } else { 1 };
    crate::log::legacy::to_message_set_counted(
        stored,
        magic,
        offset,
        limit,
        ctx.components.config.socket_request_max_bytes,
    )
    .map(|(set, records)| {
        ctx.components.metrics.conversions.fetch.inc_by(records);
        Bytes::from(set)
    })
    .map_err(|e| {
        tracing::debug!(error = %e, "cannot down-convert for an old fetch");
        e.kafka_code()
    })
}
