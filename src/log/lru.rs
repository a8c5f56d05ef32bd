//! The least-recently-used bookkeeping behind the process-wide caches of segment resources
//! (`fd_cache`'s open files, `index_cache`'s index mappings): entries keyed by an id that is
//! never reused, values handed out as clones (an `Arc`), so a holder outlives an eviction.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::fd_cache::SegmentFileStats;

/// An [`Lru`] behind its lock with the bound and the counters the metrics show: what both
/// process-wide caches hold.
pub(super) struct BoundedLru<V> {
    inner: Mutex<Lru<V>>,
    capacity: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl<V: Clone> BoundedLru<V> {
    pub(super) fn new(capacity: usize) -> Self {
        BoundedLru {
            inner: Mutex::new(Lru::default()),
            capacity: AtomicUsize::new(capacity.max(1)),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Lru<V>> {
        // The map stays consistent whatever a panicking holder did (no step leaves it half
        // updated across a call that can panic), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Sets the bound, dropping what no longer fits.
    pub(super) fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity.max(1), Ordering::Relaxed);
        let shed = self.lock().shed(capacity.max(1));
        self.evicted(shed.len());
    }

    pub(super) fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn evicted(&self, n: usize) {
        self.evictions.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(super) fn stats(&self) -> SegmentFileStats {
        SegmentFileStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            open: self.lock().len() as u64,
            capacity: self.capacity() as u64,
        }
    }
}

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
