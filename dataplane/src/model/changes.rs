//! What differs between two tables, so that a publish recompiles only that.

use std::collections::{BTreeSet, HashMap};

use super::{BackendId, HostMatch, RouteTable, VirtualHost};

/// What differs between a table and the one before it: the virtual hosts added, removed or
/// changed, and the backends added, removed or changed. Lets a publish recompile only those.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableChanges {
    /// Hosts whose [`crate::model::VirtualHost`] is new, gone or different.
    pub hosts: BTreeSet<HostMatch>,
    /// Backends that are new, gone or different.
    pub backends: BTreeSet<BackendId>,
}

impl TableChanges {
    /// Everything that differs between `old` and `new` (a full comparison; translation
    /// reports its changes without one).
    pub fn between(old: &RouteTable, new: &RouteTable) -> TableChanges {
        fn hosts(t: &RouteTable) -> HashMap<&HostMatch, &VirtualHost> {
            t.hosts.iter().map(|v| (&v.host, v)).collect()
        }
        let (old_hosts, new_hosts) = (hosts(old), hosts(new));
        let mut changes = TableChanges::default();
        for host in old_hosts.keys().chain(new_hosts.keys()) {
            if old_hosts.get(host) != new_hosts.get(host) {
                changes.hosts.insert((*host).clone());
            }
        }
        for id in old.backends.keys().chain(new.backends.keys()) {
            if old.backends.get(id) != new.backends.get(id) {
                changes.backends.insert(id.clone());
            }
        }
        changes
    }
}
