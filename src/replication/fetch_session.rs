//! Fetch sessions (KIP-227), leader side, for followers and consumers alike. A full fetch
//! (epoch 0) opens a session holding every partition it fetches and where; the next fetches
//! name only the partitions whose position changed, and the answers only the partitions with
//! something new (records, an error, a moved high watermark, last stable offset or log start).
//! A fetcher of thousands of idle partitions then sends and receives almost nothing each round.
//!
//! The cache holds at most `max.incremental.fetch.session.cache.slots` sessions. When it is
//! full, a newcomer displaces a session as Kafka's `FetchSessionCache` decides: the one unused
//! longest if that is more than [`EVICTION`] ago; otherwise the least valuable (consumer before
//! follower, then fewest partitions) among those it may displace, if the newcomer is worth at
//! least as much. A follower may displace any consumer session and follower sessions older
//! than [`EVICTION`]; a consumer only sessions older than that. With nothing to displace the
//! fetch is answered without a session (id 0), and the client keeps sending full fetches.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::sync::MutexExt;

/// How long a session is protected from displacement after it is created, and after which an
/// unused one goes first (Kafka's `MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS`, not a config).
pub const EVICTION: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct SessionPartition {
    pub topic_id: Uuid,
    pub fetch_offset: i64,
    pub max_bytes: i32,
    pub current_leader_epoch: i32,
    pub last_fetched_epoch: i32,
    /// What the fetcher was last told, to leave unchanged partitions out of answers.
    pub sent_high_watermark: i64,
    pub sent_log_start_offset: i64,
    pub sent_last_stable_offset: i64,
}

pub struct Session {
    /// The follower's broker id, or -1 for a consumer.
    pub replica: i32,
    /// The epoch the next request must carry.
    pub epoch: i32,
    pub partitions: BTreeMap<(String, i32), SessionPartition>,
    /// An incremental fetch reads only the partitions it names, those that changed since, and
    /// those not watched. A follower's fetch also vouches, through `changes`, for the
    /// partitions it does not read: the leader's end has not moved under them since they
    /// were last read (see [`Changes::touch`]).
    pub changes: Arc<Changes>,
    /// Partitions without a replica here to watch when last looked at: read on every fetch
    /// until one appears.
    pub unwatched: BTreeSet<(String, i32)>,
}

/// The partitions of a session that changed (an append, a high-watermark move, a role change)
/// since a fetch last took them, marked by the partitions' own wake-ups.
#[derive(Default)]
pub struct Changes {
    changed: Mutex<BTreeSet<(String, i32)>>,
    /// A parked incremental fetch waits here; a change while no fetch waits leaves a permit.
    pub notify: tokio::sync::Notify,
    /// When the session's follower last fetched (None: a consumer's session, or not yet).
    last_fetch: Mutex<Option<Instant>>,
    follower: bool,
}

impl Changes {
    pub fn mark(&self, topic: &str, index: i32) {
        self.changed.lock_unpoisoned().insert((topic.to_string(), index));
        self.notify.notify_one();
    }

    /// Has the next fetch read the partition again without waking a fetch that waits: for a
    /// partition whose answer is still owed (an error, records held back by the response's
    /// size or a quota, a follower outside the ISR whose expansion must be proposed again).
    pub fn keep(&self, topic: &str, index: i32) {
        self.changed.lock_unpoisoned().insert((topic.to_string(), index));
    }

    pub fn take(&self) -> BTreeSet<(String, i32)> {
        std::mem::take(&mut *self.changed.lock_unpoisoned())
    }

    /// A follower's fetch arrived at `now`. Every partition of the session it does not read
    /// is one whose fetch position and leader log end are unchanged since its last read: a
    /// follower caught up then is caught up at `now` too (Kafka's lastCaughtUpTime), with no
    /// per-partition work.
    pub fn touch(&self, now: Instant) {
        *self.last_fetch.lock_unpoisoned() = Some(now);
    }

    pub fn last_fetch(&self) -> Option<Instant> {
        *self.last_fetch.lock_unpoisoned()
    }

    /// A follower's session (a consumer's otherwise).
    pub fn follower(&self) -> bool {
        self.follower
    }
}

impl Session {
    /// The partitions an incremental fetch reads: those it names (their position moved),
    /// those changed since the last fetch took the marks or still owed an answer, and those
    /// with no replica here to watch. Never the partitions that are as they were, however
    /// many the session holds.
    pub fn to_read(&self, named: impl IntoIterator<Item = (String, i32)>) -> BTreeSet<(String, i32)> {
        let mut keys = self.changes.take();
        keys.extend(named);
        keys.extend(self.unwatched.iter().cloned());
        keys
    }
}

pub struct FetchSessions {
    slots: usize,
    inner: Mutex<Inner>,
}

struct Entry {
    session: Arc<Mutex<Session>>,
    /// A follower's session (Kafka's "privileged").
    follower: bool,
    /// Partitions, as of the last use.
    size: usize,
    created: Instant,
    last_used: Instant,
}

#[derive(Default)]
struct Inner {
    next_id: i32,
    sessions: HashMap<i32, Entry>,
}

impl Default for FetchSessions {
    fn default() -> FetchSessions {
        FetchSessions::new(1000)
    }
}

impl FetchSessions {
    pub fn new(slots: usize) -> FetchSessions {
        FetchSessions { slots, inner: Mutex::new(Inner::default()) }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_unpoisoned()
    }

    /// A new session for `replica` (negative: a consumer), or None when the cache is full of
    /// sessions this one may not displace. A follower's earlier session is replaced: it has
    /// one fetcher per leader, and a full request means it started over.
    pub fn create(
        &self,
        replica: i32,
        partitions: BTreeMap<(String, i32), SessionPartition>,
        now: Instant,
    ) -> Option<(i32, Arc<Mutex<Session>>)> {
        let mut inner = self.inner();
        let follower = replica >= 0;
        if follower {
            inner.sessions.retain(|_, e| !e.follower || e.session.lock_unpoisoned().replica != replica);
        }
        let size = partitions.len();
        if inner.sessions.len() >= self.slots && !inner.evict_one(follower, size, now) {
            return None;
        }
        let id = loop {
            inner.next_id = if inner.next_id == i32::MAX { 1 } else { inner.next_id + 1 };
            if !inner.sessions.contains_key(&inner.next_id) {
                break inner.next_id;
            }
        };
        let session = Arc::new(Mutex::new(Session {
            replica,
            epoch: 1,
            partitions,
            changes: Arc::new(Changes { follower, ..Changes::default() }),
            unwatched: BTreeSet::new(),
        }));
        let entry = Entry { session: session.clone(), follower, size, created: now, last_used: now };
        inner.sessions.insert(id, entry);
        Some((id, session))
    }

    /// The session, marked used now.
    pub fn get(&self, id: i32, now: Instant) -> Option<Arc<Mutex<Session>>> {
        let mut inner = self.inner();
        let e = inner.sessions.get_mut(&id)?;
        e.last_used = now;
        Some(e.session.clone())
    }

    /// Records a session's partition count after an incremental fetch changed it.
    pub fn resize(&self, id: i32, size: usize) {
        if let Some(e) = self.inner().sessions.get_mut(&id) {
            e.size = size;
        }
    }

    pub fn remove(&self, id: i32) {
        self.inner().sessions.remove(&id);
    }

    pub fn len(&self) -> usize {
        self.inner().sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// Makes room for a newcomer, by Kafka's rules (see the module comment). Only runs when
    /// the cache is full, over at most its slot count.
    fn evict_one(&mut self, follower: bool, size: usize, now: Instant) -> bool {
        let stale = self
            .sessions
            .iter()
            .min_by_key(|(id, e)| (e.last_used, **id))
            .filter(|(_, e)| now.saturating_duration_since(e.last_used) > EVICTION)
            .map(|(id, _)| *id);
        if let Some(id) = stale {
            self.sessions.remove(&id);
            return true;
        }
        let old = |e: &Entry| now.saturating_duration_since(e.created) > EVICTION;
        let victim = self
            .sessions
            .iter()
            .filter(|(_, e)| if follower { !e.follower || old(e) } else { old(e) })
            .map(|(id, e)| ((e.follower, e.size, *id), *id))
            .min();
        match victim {
            Some((key, id)) if (follower, size, 0) >= key => {
                self.sessions.remove(&id);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(n: usize) -> BTreeMap<(String, i32), SessionPartition> {
        (0..n)
            .map(|i| {
                let p = SessionPartition {
                    topic_id: Uuid::nil(),
                    fetch_offset: 0,
                    max_bytes: 1,
                    current_leader_epoch: -1,
                    last_fetched_epoch: -1,
                    sent_high_watermark: -1,
                    sent_log_start_offset: -1,
                    sent_last_stable_offset: -1,
                };
                (("t".to_string(), i as i32), p)
            })
            .collect()
    }

    mod follower {
        //! A follower's session over real partitions led here (broker 1, follower 2): what
        //! its incremental fetches read, and what its fetches vouch for.
        use std::collections::BTreeMap;

        use bytes::Bytes;

        use super::super::*;
        use crate::log::batch::simple_batch;
        use crate::log::{Log, LogConfig};
        use crate::metrics::{IsrMetrics, TopicMetrics};
        use crate::replication::{FollowerPosition, Partition};

        const FOLLOWER: i32 = 2;

        struct Leader {
            _dir: tempfile::TempDir,
            partitions: BTreeMap<(String, i32), Arc<Partition>>,
        }

        fn leader(n: i32) -> Leader {
            let dir = tempfile::tempdir().unwrap();
            let config = LogConfig { segment_bytes: 1 << 20, max_index_size: 4096, ..LogConfig::default() };
            let partitions = (0..n)
                .map(|i| {
                    let log = Log::open(dir.path().join(format!("t-{i}")), config.clone(), 0, 0, true).unwrap();
                    let log = Arc::new(Mutex::new(log));
                    let p = Partition::open("t", i, 1, log, None, TopicMetrics::detached(), IsrMetrics::detached());
                    p.become_leader(0, &[1, FOLLOWER], &[1, FOLLOWER]);
                    append(&p);
                    (("t".to_string(), i), Arc::new(p))
                })
                .collect();
            Leader { _dir: dir, partitions }
        }

        fn append(p: &Partition) {
            assert_eq!(p.append(Bytes::from(simple_batch(2, 10, 1)), 1 << 20).error_code, 0);
        }

        /// What the follower's fetch positions are: where it has copied to.
        type Positions = BTreeMap<(String, i32), i64>;

        /// One fetch through the session: reads `keys` as the handler does, and copies what
        /// it gets (the follower names those partitions at their new position next time).
        /// Returns the partitions read.
        fn fetch(l: &Leader, s: &Session, keys: BTreeSet<(String, i32)>, at: &mut Positions) -> Vec<i32> {
            s.changes.touch(Instant::now());
            for key in &keys {
                let position =
                    FollowerPosition { fetch_offset: at[key], last_fetched_epoch: -1, current_leader_epoch: 0 };
                let (r, _, _) =
                    l.partitions[key].follower_fetch_in_session(FOLLOWER, position, 1 << 20, Some(&s.changes));
                assert_eq!(r.error_code, 0);
                if !r.records.is_empty() {
                    at.insert(key.clone(), l.partitions[key].log_end_offset());
                }
            }
            keys.iter().map(|k| k.1).collect()
        }

        /// A session opened by a full fetch of every partition, then fetched until idle.
        fn open_session(l: &Leader, at: &mut Positions) -> Arc<Mutex<Session>> {
            let cache = FetchSessions::new(10);
            let (_, s) = cache.create(FOLLOWER, super::parts(l.partitions.len()), Instant::now()).unwrap();
            let g = s.lock().unwrap();
            for p in l.partitions.values() {
                p.watch_changes(&g.changes);
            }
            fetch(l, &g, l.partitions.keys().cloned().collect(), at);
            // The follower names every partition at its new position; that moves every high
            // watermark, which the next fetch reads to send.
            let named: Vec<_> = at.keys().cloned().collect();
            assert_eq!(fetch(l, &g, g.to_read(named), at).len(), l.partitions.len());
            assert_eq!(fetch(l, &g, g.to_read([]), at).len(), l.partitions.len());
            drop(g);
            s
        }

        #[test]
        fn an_idle_session_reads_nothing_and_an_append_reads_only_its_partition() {
            let l = leader(50);
            let mut at: Positions = l.partitions.keys().map(|k| (k.clone(), 0)).collect();
            let s = open_session(&l, &mut at);
            let g = s.lock().unwrap();
            for _ in 0..3 {
                assert_eq!(fetch(&l, &g, g.to_read([]), &mut at), Vec::<i32>::new(), "idle: nothing read");
            }
            append(&l.partitions[&("t".to_string(), 7)]);
            assert_eq!(fetch(&l, &g, g.to_read([]), &mut at), vec![7], "the append marks its partition only");
            // The follower names it at its new position; that read moves the high watermark,
            // which the next fetch reads and sends; then the session is idle again.
            assert_eq!(at[&("t".to_string(), 7)], 4);
            assert_eq!(fetch(&l, &g, g.to_read([("t".to_string(), 7)]), &mut at), vec![7]);
            assert_eq!(fetch(&l, &g, g.to_read([]), &mut at), vec![7]);
            assert_eq!(fetch(&l, &g, g.to_read([]), &mut at), Vec::<i32>::new());
            assert!(l.partitions.values().all(|p| p.high_watermark() == p.log_end_offset()));
        }

        #[test]
        fn the_sessions_fetches_keep_a_caught_up_follower_in_the_isr_until_they_stop() {
            let l = leader(2);
            let mut at: Positions = l.partitions.keys().map(|k| (k.clone(), 0)).collect();
            let s = open_session(&l, &mut at);
            let lag = Duration::from_millis(20);
            // Longer than the lag without a read of partition 0, but with fetches.
            std::thread::sleep(lag * 2);
            let g = s.lock().unwrap();
            assert!(fetch(&l, &g, g.to_read([]), &mut at).is_empty());
            let p = &l.partitions[&("t".to_string(), 0)];
            append(p);
            assert_eq!(p.isr_to_shrink(lag), None, "caught up at its last fetch, a moment ago");
            drop(g);
            // The follower stops fetching: after the lag it is behind the append and out.
            std::thread::sleep(lag * 2);
            assert_eq!(p.isr_to_shrink(lag), Some(vec![1]));
            // A session gone vouches for nothing, even for a follower caught up at its last
            // read: it is out once behind an append for longer than the lag.
            let q = &l.partitions[&("t".to_string(), 1)];
            drop(s);
            append(q);
            assert_eq!(q.isr_to_shrink(lag), Some(vec![1]));
        }
    }

    #[test]
    fn a_full_cache_displaces_stale_then_less_valuable_sessions_only() {
        let t0 = Instant::now();
        let cache = FetchSessions::new(2);
        let (small, _) = cache.create(-1, parts(1), t0).unwrap();
        let (big, _) = cache.create(-1, parts(5), t0).unwrap();
        // Young sessions are safe from consumers, however large the newcomer.
        assert!(cache.create(-1, parts(100), t0 + Duration::from_secs(1)).is_none());
        // A follower displaces the smallest consumer session at once.
        let (f, _) = cache.create(1, parts(1), t0 + Duration::from_secs(1)).unwrap();
        assert!(cache.get(small, t0).is_none() && cache.get(big, t0 + Duration::from_secs(2)).is_some());
        // Past the protection, a consumer displaces a smaller consumer session, never a larger
        // one, and a follower session only if it is worth less (never: consumers rank below).
        let later = t0 + EVICTION + Duration::from_secs(3);
        cache.get(f, later);
        cache.get(big, later);
        assert!(cache.create(-1, parts(4), later).is_none());
        let (c, _) = cache.create(-1, parts(6), later).unwrap();
        assert!(cache.get(big, later).is_none() && cache.get(f, later).is_some());
        // Unused for longer than the protection: displaced by anyone.
        let much_later = later + EVICTION + Duration::from_secs(1);
        cache.get(f, much_later);
        assert!(cache.create(-1, parts(0), much_later).is_some());
        assert!(cache.get(c, much_later).is_none());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn a_follower_has_one_session_and_no_slots_means_no_sessions() {
        let now = Instant::now();
        let cache = FetchSessions::new(10);
        let (a, _) = cache.create(2, parts(3), now).unwrap();
        let (b, _) = cache.create(2, parts(3), now).unwrap();
        assert!(cache.get(a, now).is_none() && cache.get(b, now).is_some());
        assert!(FetchSessions::new(0).create(2, parts(1), now).is_none());
    }
}
