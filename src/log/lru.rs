//! The least-recently-used bookkeeping behind the process-wide caches of segment resources
//! (`fd_cache`'s open files, `index_cache`'s index mappings): entries keyed by an id that is
//! never reused, values handed out as clones (an `Arc`), so a holder outlives an eviction.

use std::collections::{BTreeMap, HashMap};

pub(super) struct Lru<V> {
    by_id: HashMap<u64, (V, u64)>,
    /// Last use (a tick) to id: the first entry is the least recently used.
    by_use: BTreeMap<u64, u64>,
    tick: u64,
}

impl<V> Default for Lru<V> {
    fn default() -> Self {
        Lru { by_id: HashMap::new(), by_use: BTreeMap::new(), tick: 0 }
    }
}

impl<V: Clone> Lru<V> {
    /// The value of `id`, now the most recently used.
    pub(super) fn touch(&mut self, id: u64) -> Option<V> {
        self.tick += 1;
        let tick = self.tick;
        let (value, used) = self.by_id.get_mut(&id)?;
        self.by_use.remove(used);
        *used = tick;
        self.by_use.insert(tick, id);
        Some(value.clone())
    }

    /// The value of `id` without counting it as a use.
    pub(super) fn peek(&self, id: u64) -> Option<V> {
        self.by_id.get(&id).map(|(v, _)| v.clone())
    }

    /// Puts `value` in as the most recently used (replacing any value of `id`); returns the
    /// entries beyond `capacity`, least recently used first, for the caller to drop outside
    /// its lock.
    pub(super) fn insert(&mut self, id: u64, value: V, capacity: usize) -> Vec<V> {
        let mut out: Vec<V> = self.remove(id).into_iter().collect();
        self.tick += 1;
        let tick = self.tick;
        self.by_id.insert(id, (value, tick));
        self.by_use.insert(tick, id);
        out.extend(self.shed(capacity));
        out
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<V> {
        let (value, used) = self.by_id.remove(&id)?;
        self.by_use.remove(&used);
        Some(value)
    }

    /// Entries beyond `capacity`, least recently used first, taken out for the caller to drop.
    pub(super) fn shed(&mut self, capacity: usize) -> Vec<V> {
        let mut out = Vec::new();
        while self.by_id.len() > capacity {
            let Some((_, id)) = self.by_use.pop_first() else { break };
            if let Some((v, _)) = self.by_id.remove(&id) {
                out.push(v);
            }
        }
        out
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }
}
