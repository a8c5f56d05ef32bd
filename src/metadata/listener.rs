//! Who hears of metadata changes. The ZooKeeper sync ([`super::zk_sync::ZkSync`]) and the
//! application of UpdateMetadata update the metadata cache first and tell the components that
//! subscribed afterwards, with no lock held, so a subscriber may read the cache, the store or
//! its own state freely. The components implement these traits in their own modules and the
//! broker registers them: `metadata` knows none of them.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::cache::TopicInfo;
use super::store::StoreError;
use super::zk_sync::Changes;

/// A component that follows what the ZooKeeper tree and the controller say. Every method has
/// a default that ignores the event, so a subscriber implements only what it follows. An error
/// fails the pass, which is then run again from the top (nothing is lost, only delayed).
pub trait MetadataListener: Send + Sync {
    /// `/config/brokers/*` changed or a config change notification arrived: the dynamic
    /// broker configs are read again.
    fn on_broker_configs_changed(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// `/config/users`, `/config/clients` changed or a notification arrived: client quotas.
    fn on_client_quotas_changed(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// `/config/client-metrics` changed or a notification arrived: client-metrics
    /// subscriptions (KIP-714).
    fn on_client_metrics_changed(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// `/feature` changed: the finalized features are read again.
    fn on_features_changed(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// These groups' configs (`/config/groups/<group>`, sanitized names) changed; None: any
    /// group's may have, every one is read again.
    fn on_group_configs_changed(&self, _groups: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        Ok(())
    }

    /// A config change notification arrived (expired ones may be purged). Failures are the
    /// subscriber's to log: old notifications cost space, never correctness.
    fn on_config_change_notification(&self) {}

    /// The SCRAM credentials of these users (sanitized znode names) changed; None: any user's
    /// may have (a new session or the first pass), every one is read again.
    fn on_credentials_changed(&self, _users: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        Ok(())
    }

    /// ACL change notifications, by znode path; None: notifications may have been missed,
    /// every ACL is read again.
    fn on_acl_changes(&self, _notifications: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        Ok(())
    }

    /// These topics' overrides (`/config/topics/<t>`) changed; the cache already holds them.
    fn on_topic_configs_changed(&self, _topics: &[Arc<TopicInfo>]) {}

    /// The controller's image (UpdateMetadata) was published to the cache.
    fn on_metadata_updated(&self) {}

    /// UpdateMetadata named these partitions deleted (they are gone from the cache).
    fn on_partitions_deleted(&self, _deleted: &[(String, i32)]) {}
}

/// The controller as the ZooKeeper sync sees it. Whoever creates `/controller` is elected; the
/// elected controller's sync reads the topic and partition tree into the cache (other brokers
/// learn it from UpdateMetadata), and after each pass the controller does its share, decided
/// from the cache just brought up to date.
pub trait ControllerRole: Send + Sync {
    /// Whether this broker is the controller now.
    fn is_active(&self) -> bool;
    /// Tries to become controller (nobody holds `/controller`); true if it did.
    fn try_elect(&self) -> Result<bool, StoreError>;
    /// Stops acting as controller (another was elected, or the session ended).
    fn resign(&self);
    /// The registered brokers, read in this pass, before the cache is updated.
    fn on_live_brokers(&self, live: &BTreeSet<i32>);
    /// The controller's share of a pass, once the cache holds what the pass read. `scope` is
    /// what changed (None: everything); `brokers_read`: the broker list was read again.
    fn on_metadata_read(
        &self,
        live: &BTreeSet<i32>,
        brokers_read: bool,
        scope: Option<&Changes>,
    ) -> Result<(), StoreError>;
    /// The leader-imbalance timer fired: a preferred election is due at the next pass.
    fn request_preferred_election(&self);
    /// Whether a preferred election is due (and enabled); clears the request.
    fn take_preferred_election(&self) -> bool;
    /// Moves leadership back to preferred replicas, where it is not there.
    fn preferred_elections(&self) -> Result<(), StoreError>;
}

/// The subscribers of one pass, told in the order they subscribed. Each event stops at the
/// first subscriber that fails, as the pass then does.
#[derive(Clone, Default)]
pub struct Subscribers(pub Vec<Arc<dyn MetadataListener>>);

impl MetadataListener for Subscribers {
    fn on_broker_configs_changed(&self) -> Result<(), StoreError> {
        self.0.iter().try_for_each(|s| s.on_broker_configs_changed())
    }

    fn on_client_quotas_changed(&self) -> Result<(), StoreError> {
        self.0.iter().try_for_each(|s| s.on_client_quotas_changed())
    }

    fn on_client_metrics_changed(&self) -> Result<(), StoreError> {
        self.0.iter().try_for_each(|s| s.on_client_metrics_changed())
    }

    fn on_features_changed(&self) -> Result<(), StoreError> {
        self.0.iter().try_for_each(|s| s.on_features_changed())
    }

    fn on_group_configs_changed(&self, groups: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        self.0.iter().try_for_each(|s| s.on_group_configs_changed(groups))
    }

    fn on_config_change_notification(&self) {
        self.0.iter().for_each(|s| s.on_config_change_notification())
    }

    fn on_credentials_changed(&self, users: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        self.0.iter().try_for_each(|s| s.on_credentials_changed(users))
    }

    fn on_acl_changes(&self, notifications: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        self.0.iter().try_for_each(|s| s.on_acl_changes(notifications))
    }

    fn on_topic_configs_changed(&self, topics: &[Arc<TopicInfo>]) {
        self.0.iter().for_each(|s| s.on_topic_configs_changed(topics))
    }

    fn on_metadata_updated(&self) {
        self.0.iter().for_each(|s| s.on_metadata_updated())
    }

    fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        self.0.iter().for_each(|s| s.on_partitions_deleted(deleted))
    }
}
