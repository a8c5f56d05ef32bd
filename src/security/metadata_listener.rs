//! SCRAM credentials and ACLs follow their znodes: the ZooKeeper sync names the users and the
//! ACL change notifications a pass saw, and this subscriber reads just those again.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::Security;
use crate::metadata::{MetadataListener, StoreError, ZnodeStore};

/// The credential cache and the authorizer of a broker, with the store they are read from.
pub struct SecurityListener {
    pub security: Arc<Security>,
    pub store: Arc<ZnodeStore>,
}

impl MetadataListener for SecurityListener {
    fn on_credentials_changed(&self, users: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        match users {
            None => self.security.scram.load_all(&self.store),
            Some(users) => users.iter().try_for_each(|user| self.security.scram.reload(&self.store, user)),
        }
    }

    fn on_acl_changes(&self, notifications: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        let Some(authorizer) = &self.security.authorizer else { return Ok(()) };
        match notifications {
            None => authorizer.load_all(&self.store),
            Some(paths) => paths.iter().try_for_each(|path| authorizer.process_notification(&self.store, path)),
        }
    }
}
