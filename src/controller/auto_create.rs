//! Topics created on first use (Kafka's `AutoTopicCreationManager`): by Metadata for a topic
//! that does not exist (when `auto.create.topics.enable` and the client allow it) and by
//! FindCoordinator for the coordinators' own topics.
//!
//! Whatever asks, an internal topic gets the shape its coordinator relies on: the group
//! coordinator spreads groups over the partitions of `__consumer_offsets` and compaction keeps
//! only the last offset of each group, so a Metadata request that happens to name the topic
//! first must not leave behind a one-partition `delete`-policy topic.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Controller;
use super::TopicRequest;
use crate::config::InternalTopicConfig;
use crate::metadata::TopicInfo;
use crate::protocol::internal_topics::{OFFSETS_TOPIC, SHARE_GROUP_STATE_TOPIC, TRANSACTION_STATE_TOPIC};
use crate::protocol::ApiError;

impl Controller {
    /// What auto-creation asks for `name`: Kafka's coordinator settings for the internal
    /// topics, the broker defaults (-1) for any other.
    pub fn auto_topic_request(&self, name: &str) -> TopicRequest {
        let internal = |shape: &InternalTopicConfig, configs: BTreeMap<String, String>| TopicRequest {
            name: name.to_string(),
            num_partitions: shape.num_partitions,
            replication_factor: self.internal_replication_factor(shape.replication_factor),
            assignment: Default::default(),
            configs,
        };
        let pairs = |p: &[(&str, String)]| p.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        match name {
            OFFSETS_TOPIC => {
                let t = &self.config.offsets_topic;
                internal(
                    t,
                    pairs(&[
                        ("cleanup.policy", "compact".into()),
                        ("segment.bytes", t.segment_bytes.to_string()),
                        ("compression.type", "producer".into()),
                    ]),
                )
            }
            TRANSACTION_STATE_TOPIC => {
                let t = &self.config.transaction_state_log;
                let mut configs: BTreeMap<String, String> = pairs(&[
                    ("cleanup.policy", "compact".into()),
                    ("segment.bytes", t.segment_bytes.to_string()),
                    ("compression.type", "uncompressed".into()),
                    ("unclean.leader.election.enable", "false".into()),
                ]);
                if let Some(min_isr) = t.min_isr {
                    configs.insert("min.insync.replicas".into(), min_isr.to_string());
                }
                internal(t, configs)
            }
            SHARE_GROUP_STATE_TOPIC => {
                // As Kafka's share coordinator creates it: compaction would keep only the last
                // ShareUpdate after a snapshot, and loading needs every one of them.
                let t = &self.config.share_state_topic;
                let mut configs: BTreeMap<String, String> = pairs(&[
                    ("cleanup.policy", "delete".into()),
                    ("retention.ms", "-1".into()),
                    ("segment.bytes", t.segment_bytes.to_string()),
                    ("compression.type", "producer".into()),
                ]);
                if let Some(min_isr) = t.min_isr {
                    configs.insert("min.insync.replicas".into(), min_isr.to_string());
                }
                internal(t, configs)
            }
            _ => TopicRequest {
                name: name.to_string(),
                num_partitions: -1,
                replication_factor: -1,
                assignment: Default::default(),
                configs: Default::default(),
            },
        }
    }

    /// In a cluster the configured factor stands, and creation fails (INVALID_REPLICATION_FACTOR,
    /// so COORDINATOR_NOT_AVAILABLE for FindCoordinator) until that many brokers are alive, as
    /// with Kafka. Standalone there will never be a second broker, so the factor is capped at
    /// one rather than making groups unusable with Kafka's default of 3.
    fn internal_replication_factor(&self, configured: i16) -> i16 {
        if self.store.is_zookeeper() {
            configured
        } else {
            configured.min(1)
        }
    }

    /// Creates `name` as auto-creation does. `Ok(None)`: created, not yet led (another broker
    /// wrote the znodes; the controller elects leaders on its next pass).
    pub fn auto_create(&self, name: &str) -> Result<Option<Arc<TopicInfo>>, ApiError> {
        let plan = self.plan_topic(self.auto_topic_request(name))?;
        self.auto_create_topic(plan)
    }
}
