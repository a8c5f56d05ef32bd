//! The controller as a subscriber of the ZooKeeper sync: elected through `/controller`, it
//! does its share of each pass once the metadata cache holds what the pass read, and it keeps
//! the finalized features every broker reports.

use std::collections::BTreeSet;

use super::Controller;
use crate::metadata::zk_sync::Changes;
use crate::metadata::{ControllerRole, MetadataListener, StoreError};

impl ControllerRole for Controller {
    fn is_active(&self) -> bool {
        self.is_controller()
    }

    fn try_elect(&self) -> Result<bool, StoreError> {
        self.try_become_controller()
    }

    fn resign(&self) {
        self.resign_controller();
    }

    fn on_live_brokers(&self, live: &BTreeSet<i32>) {
        // A broker in controlled shutdown stays out of leadership and ISRs until it is gone.
        self.retain_shutting_down(live);
    }

    fn on_metadata_read(
        &self,
        live: &BTreeSet<i32>,
        brokers_read: bool,
        scope: Option<&Changes>,
    ) -> Result<(), StoreError> {
        let eligible: BTreeSet<i32> = self.eligible_of(live);
        if brokers_read {
            self.forget_offline_replicas_of_gone_brokers();
        }
        if scope.is_none_or(|c| c.log_dir_events) {
            self.process_log_dir_events()?;
        }
        self.controller_duties(&eligible, scope)?;
        let touched: Option<BTreeSet<String>> =
            scope.map(|c| c.topics.iter().chain(c.partitions.keys()).cloned().collect());
        self.propagate(touched.as_ref());
        Ok(())
    }

    fn request_preferred_election(&self) {
        Controller::request_preferred_election(self);
    }

    fn take_preferred_election(&self) -> bool {
        Controller::take_preferred_election(self)
    }

    fn preferred_elections(&self) -> Result<(), StoreError> {
        Controller::preferred_elections(self)
    }
}

impl MetadataListener for Controller {
    fn on_features_changed(&self) -> Result<(), StoreError> {
        self.load_finalized_features()
    }
}
