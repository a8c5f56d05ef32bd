//! Cluster-unique producer ids, handed out in blocks claimed in `/latest_producer_id_block`
//! as Kafka does, so a restarted broker never reuses an id it gave out before.

use std::sync::{Arc, Mutex};

use crate::metadata::{store::StoreError, zk_data, ZnodeStore};
use crate::sync::MutexExt;

/// How many ids one claim in the znode reserves (Kafka's block size).
const BLOCK_SIZE: i64 = 1000;

pub struct ProducerIdManager {
    broker_id: i32,
    store: Arc<ZnodeStore>,
    /// (next id to hand out, last id of the claimed block): taken briefly, never across a
    /// ZooKeeper call, so ids from a claimed block never wait for another's claim.
    block: Mutex<(i64, i64)>,
    /// Held while one caller claims a block in ZooKeeper; only callers that need the next
    /// block wait for it.
    claiming: Mutex<()>,
}

impl ProducerIdManager {
    pub fn new(broker_id: i32, store: Arc<ZnodeStore>) -> ProducerIdManager {
        ProducerIdManager { broker_id, store, block: Mutex::new((0, -1)), claiming: Mutex::new(()) }
    }

    /// The next id. Blocks on ZooKeeper when the current block is used up: call it off the
    /// async workers.
    pub fn next_id(&self) -> Result<i64, StoreError> {
        loop {
            if let Some(id) = self.take() {
                return Ok(id);
            }
            let _claim = self.claiming.lock_unpoisoned();
            // Another caller may have claimed a block while this one waited.
            if let Some(id) = self.take() {
                return Ok(id);
            }
            let claimed = self.claim_block()?;
            *self.block.lock_unpoisoned() = claimed;
        }
    }

    fn take(&self) -> Option<i64> {
        let mut block = self.block.lock_unpoisoned();
        if block.0 > block.1 {
            return None;
        }
        let id = block.0;
        block.0 += 1;
        Some(id)
    }

    /// Claims the block after the last one any broker claimed: (first, last).
    fn claim_block(&self) -> Result<(i64, i64), StoreError> {
        loop {
            // Brokers race for the next block; the version check makes exactly one win.
            let current = self.store.get_versioned(zk_data::PRODUCER_ID_BLOCK)?;
            let prev_end = current.as_ref().and_then(|(d, _)| zk_data::parse_producer_id_block_end(d)).unwrap_or(-1);
            let start = prev_end + 1;
            let end = start + BLOCK_SIZE - 1;
            let data = zk_data::producer_id_block_json(self.broker_id, start, end);
            let written = match current {
                Some((_, version)) => self.store.set_if_version(zk_data::PRODUCER_ID_BLOCK, &data, version),
                None => self.store.create(zk_data::PRODUCER_ID_BLOCK, &data, false),
            };
            match written {
                Ok(()) => return Ok((start, end)),
                Err(StoreError::BadVersion(_)) | Err(StoreError::NodeExists(_)) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.json");
        let a = ProducerIdManager::new(
            0,
            Arc::new(ZnodeStore::Embedded(crate::metadata::EmbeddedStore::open(file.clone()).unwrap())),
        );
        assert_eq!(a.next_id().unwrap(), 0);
        assert_eq!(a.next_id().unwrap(), 1);
        drop(a);
        let b = ProducerIdManager::new(
            0,
            Arc::new(ZnodeStore::Embedded(crate::metadata::EmbeddedStore::open(file).unwrap())),
        );
        assert_eq!(b.next_id().unwrap(), BLOCK_SIZE);
    }
}
