//! The share-partition persister's view of `__share_group_state`: its leaders from the
//! metadata image, and its creation by the controller on first use.

use std::sync::Arc;

use crate::controller::Controller;
use crate::metadata::MetadataCache;
use crate::protocol::internal_topics::SHARE_GROUP_STATE_TOPIC;
use crate::share::StateTopic;

pub(super) struct ShareStateTopicLink {
    pub(super) controller: Arc<Controller>,
    pub(super) cache: Arc<MetadataCache>,
}

impl StateTopic for ShareStateTopicLink {
    fn leaders(&self) -> Option<Vec<i32>> {
        let topic = self.cache.topic(SHARE_GROUP_STATE_TOPIC)?;
        let mut leaders = vec![-1; topic.partitions.len()];
        for p in &topic.partitions {
            if let Some(l) = usize::try_from(p.index).ok().and_then(|i| leaders.get_mut(i)) {
                *l = p.leader;
            }
        }
        Some(leaders)
    }

    fn address(&self, id: i32) -> Option<(String, u16)> {
        let snapshot = self.cache.snapshot();
        snapshot.brokers.iter().find(|b| b.id == id).map(|b| (b.host.clone(), b.port))
    }

    fn create(&self) -> Result<(), i16> {
        self.controller.auto_create(SHARE_GROUP_STATE_TOPIC).map(|_| ()).map_err(|e| e.code)
    }
}
