//! Feature versioning (KIP-584) as a ZooKeeper-mode Kafka 3.9 cluster has it. Its brokers
//! support no features (KafkaServer builds `BrokerFeatures.createEmpty()`; `metadata.version`
//! and the other features are KRaft-only), so the controller finalizes none: when elected it
//! makes sure `/feature` exists, enabled, and leaves its features alone. Every broker reports
//! the znode's version as the finalized-features epoch in ApiVersions (-1 while it has not read
//! an enabled one), and the finalized features, which stay empty.

use std::collections::BTreeMap;

use super::Controller;
use crate::metadata::store::StoreError;
use crate::metadata::zk_data::{self, FeatureZnode};

/// What the controller writes to `/feature`, given what is there (Kafka's
/// `enableFeatureVersioning`): a new enabled node if there is none; an enabled node in the
/// current JSON version, keeping the features of an enabled one and dropping those of a
/// disabled one; nothing if the node already is that. An unreadable node is left to the
/// operator, as Kafka's controller would fail on it.
pub fn feature_znode_update(current: Option<&str>) -> Option<String> {
    let Some(data) = current else {
        return Some(zk_data::feature_znode_json(&BTreeMap::new()));
    };
    let node = zk_data::parse_feature_znode(data)?;
    let features = if node.enabled { node.features.clone() } else { BTreeMap::new() };
    let wanted = FeatureZnode { version: 2, enabled: true, features };
    (wanted != node).then(|| zk_data::feature_znode_json(&wanted.features))
}

/// The finalized-features epoch a broker reports for `/feature` read as `read` (data and
/// znode version): None (reported as -1) when there is no node, it is unreadable or disabled,
/// or it finalizes a feature this broker does not support (any but `metadata.version`, which
/// a ZooKeeper-mode broker never counts), as Kafka's feature cache refuses such an update.
pub fn finalized_features_epoch(read: Option<&(String, i32)>) -> Option<i64> {
    let (data, version) = read?;
    let node = zk_data::parse_feature_znode(data)?;
    let unsupported = node.features.keys().any(|f| f != "metadata.version");
    (node.enabled && !unsupported).then_some(i64::from(*version))
}

impl Controller {
    /// At election: `/feature` enabled, as Kafka's controller sets it up in onControllerFailover.
    pub fn setup_feature_versioning(&self) -> Result<(), StoreError> {
        let current = self.store.get_versioned(zk_data::FEATURE)?;
        if let Some(json) = feature_znode_update(current.as_ref().map(|(d, _)| d.as_str())) {
            match current {
                None => match self.store.create(zk_data::FEATURE, &json, false) {
                    // Another controller wrote it meanwhile; what it wrote is what we would.
                    Ok(()) | Err(StoreError::NodeExists(_)) => {}
                    Err(e) => return Err(e),
                },
                Some((_, version)) => self.store.set_if_version(zk_data::FEATURE, &json, version)?,
            }
        } else if let Some((data, _)) = &current {
            if zk_data::parse_feature_znode(data).is_none() {
                tracing::warn!(data = %data, "cannot parse /feature; leaving it as it is");
            }
        }
        self.load_finalized_features()
    }

    /// Reads `/feature` into the metadata cache (Kafka's FinalizedFeatureChangeListener).
    pub fn load_finalized_features(&self) -> Result<(), StoreError> {
        let read = self.store.get_versioned(zk_data::FEATURE)?;
        let epoch = finalized_features_epoch(read.as_ref());
        if let (Some((data, _)), None) = (&read, epoch) {
            tracing::warn!(data = %data, "/feature is disabled, unreadable or finalizes unsupported features");
        }
        self.cache.update(|c| c.finalized_features_epoch = epoch);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_creates_or_enables_feature_znode_as_kafka_does() {
        let empty = r#"{"features":{},"version":2,"status":1}"#;
        let created = feature_znode_update(None).unwrap();
        assert_eq!(zk_data::parse_feature_znode(&created), zk_data::parse_feature_znode(empty));
        assert_eq!(feature_znode_update(Some(empty)), None, "already as wanted: left alone");
        let disabled = r#"{"features":{"x":{"max_version_level":2}},"version":2,"status":0}"#;
        let enabled = feature_znode_update(Some(disabled)).unwrap();
        assert_eq!(zk_data::parse_feature_znode(&enabled), zk_data::parse_feature_znode(empty));
        let v1 = r#"{"features":{"x":{"min_version_level":1,"max_version_level":2}},"version":1,"status":1}"#;
        let v2 = zk_data::parse_feature_znode(&feature_znode_update(Some(v1)).unwrap()).unwrap();
        assert_eq!((v2.version, v2.enabled, v2.features.get("x")), (2, true, Some(&2)));
        assert_eq!(feature_znode_update(Some("garbage")), None);
    }

    #[test]
    fn the_epoch_is_the_znode_version_of_an_enabled_node() {
        let at = |d: &str, v: i32| finalized_features_epoch(Some(&(d.to_string(), v)));
        assert_eq!(finalized_features_epoch(None), None);
        assert_eq!(at(r#"{"features":{},"version":2,"status":1}"#, 0), Some(0));
        assert_eq!(at(r#"{"features":{},"version":2,"status":1}"#, 3), Some(3));
        assert_eq!(at(r#"{"features":{},"version":2,"status":0}"#, 3), None);
        assert_eq!(
            at(r#"{"features":{"metadata.version":{"max_version_level":7}},"version":2,"status":1}"#, 1),
            Some(1)
        );
        assert_eq!(at(r#"{"features":{"group.version":{"max_version_level":1}},"version":2,"status":1}"#, 1), None);
    }
}
