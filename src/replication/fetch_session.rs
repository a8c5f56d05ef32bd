//! Fetch sessions for follower fetches (KIP-227), leader side. A follower's full fetch opens a
//! session holding every partition it fetches and where; its next fetches name only the
//! partitions whose position changed, and the answers only the partitions with something new
//! (records, an error, a moved high watermark or log start). Followers of thousands of idle
//! partitions then send and receive almost nothing each round. Consumers are answered without
//! sessions, as a broker may choose.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use uuid::Uuid;

/// Sessions kept at most (Kafka's `max.incremental.fetch.session.cache.slots` default); each
/// follower broker holds one per leader, so this is far more than a cluster uses.
const MAX_SESSIONS: usize = 1000;

#[derive(Debug, Clone)]
pub struct SessionPartition {
    pub topic_id: Uuid,
    pub fetch_offset: i64,
    pub max_bytes: i32,
    pub current_leader_epoch: i32,
    pub last_fetched_epoch: i32,
    /// What the follower was last told, to leave unchanged partitions out of answers.
    pub sent_high_watermark: i64,
    pub sent_log_start_offset: i64,
}

pub struct Session {
    pub replica: i32,
    /// The epoch the next request must carry.
    pub epoch: i32,
    pub partitions: BTreeMap<(String, i32), SessionPartition>,
}

#[derive(Default)]
pub struct FetchSessions {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: i32,
    sessions: HashMap<i32, Arc<Mutex<Session>>>,
}

impl FetchSessions {
    /// A new session for `replica`, replacing any it had: a follower has one fetcher per
    /// leader, and a full request means it started over.
    pub fn create(
        &self,
        replica: i32,
        partitions: BTreeMap<(String, i32), SessionPartition>,
    ) -> (i32, Arc<Mutex<Session>>) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.sessions.retain(|_, s| s.lock().unwrap_or_else(|p| p.into_inner()).replica != replica);
        if inner.sessions.len() >= MAX_SESSIONS {
            // Only a misbehaving peer gets here; dropping the lot costs the others one full
            // request each.
            inner.sessions.clear();
        }
        let id = loop {
            inner.next_id = if inner.next_id == i32::MAX { 1 } else { inner.next_id + 1 };
            if !inner.sessions.contains_key(&inner.next_id) {
                break inner.next_id;
            }
        };
        let session = Arc::new(Mutex::new(Session { replica, epoch: 1, partitions }));
        inner.sessions.insert(id, session.clone());
        (id, session)
    }

    pub fn get(&self, id: i32) -> Option<Arc<Mutex<Session>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).sessions.get(&id).cloned()
    }

    pub fn remove(&self, id: i32) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).sessions.remove(&id);
    }
}
