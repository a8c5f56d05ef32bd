//! The replica manager as a subscriber of metadata changes: a topic's new overrides reach the
//! logs of its partitions hosted here, and waiters on the metadata image check again when the
//! controller's UpdateMetadata lands.

use std::sync::Arc;

use super::ReplicaManager;
use crate::metadata::{MetadataListener, TopicInfo};

impl MetadataListener for ReplicaManager {
    fn on_topic_configs_changed(&self, topics: &[Arc<TopicInfo>]) {
        for t in topics {
            let effective = (self.handles.effective)();
            let log_config = match effective.log_config_for(&t.configs) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(topic = %t.name, error = %e, "invalid topic config; using broker defaults");
                    effective.log.clone()
                }
            };
            for p in &t.partitions {
                if let Some(part) = self.hosted(&t.name, p.index) {
                    part.set_config(log_config.clone());
                }
            }
        }
    }

    fn on_metadata_updated(&self) {
        // DeleteTopics answers once the topic is gone from this image.
        self.notify_metadata_changed();
    }
}
