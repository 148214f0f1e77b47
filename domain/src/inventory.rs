//! The physical inventory: zone > cluster (homogeneous hardware) > rack (fault domain) > host.
//!
//! These are the declarative specs an allocator is configured with; the allocator keeps the live
//! state (VMs on each host) itself.

use crate::ids::{ClusterId, HostId, RackId, ZoneId};
use crate::resources::Resources;
use serde::{Deserialize, Serialize};

/// Whether a host may receive VMs.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    /// Healthy and open for placement.
    #[default]
    Available,
    /// Taken out for maintenance or defragmentation; its VMs keep running.
    Unavailable,
    /// Broken; nothing is placed on it.
    Failed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub id: HostId,
    /// Capacity when it differs from the cluster's host capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Resources>,
    #[serde(default)]
    pub state: HostState,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RackSpec {
    pub id: RackId,
    pub hosts: Vec<HostSpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub id: ClusterId,
    /// Hardware generation; VM types are compatible with some generations only.
    pub hardware: String,
    /// Capacity of each host unless the host says otherwise.
    pub host_capacity: Resources,
    pub racks: Vec<RackSpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneSpec {
    pub id: ZoneId,
    pub clusters: Vec<ClusterSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventorySpec {
    pub zones: Vec<ZoneSpec>,
}

/// One host with where it sits, as the allocator indexes it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostPlacement<'a> {
    pub zone: &'a ZoneId,
    pub cluster: &'a ClusterId,
    pub hardware: &'a str,
    pub rack: &'a RackId,
    pub host: &'a HostId,
    pub capacity: Resources,
    pub state: HostState,
}

impl InventorySpec {
    /// A zone of `hosts` identical hosts in one cluster, `hosts_per_rack` to a rack: the usual test
    /// and simulation inventory.
    pub fn homogeneous(zone: &str, hosts: usize, hosts_per_rack: usize, capacity: Resources) -> Self {
        let hosts_per_rack = hosts_per_rack.max(1);
        let racks = (0..hosts.div_ceil(hosts_per_rack))
            .map(|r| RackSpec {
                id: RackId(format!("{zone}-r{r}")),
                hosts: (r * hosts_per_rack..((r + 1) * hosts_per_rack).min(hosts))
                    .map(|h| HostSpec {
                        id: HostId(format!("{zone}-h{h}")),
                        capacity: None,
                        state: HostState::Available,
                    })
                    .collect(),
            })
            .collect();
        InventorySpec {
            zones: vec![ZoneSpec {
                id: ZoneId(zone.to_owned()),
                clusters: vec![ClusterSpec {
                    id: ClusterId(format!("{zone}-c0")),
                    hardware: "default".to_owned(),
                    host_capacity: capacity,
                    racks,
                }],
            }],
        }
    }

    /// Every host with its location, in declaration order.
    pub fn hosts(&self) -> impl Iterator<Item = HostPlacement<'_>> {
        self.zones.iter().flat_map(|zone| {
            zone.clusters.iter().flat_map(move |cluster| {
                cluster.racks.iter().flat_map(move |rack| {
                    rack.hosts.iter().map(move |host| HostPlacement {
                        zone: &zone.id,
                        cluster: &cluster.id,
                        hardware: &cluster.hardware,
                        rack: &rack.id,
                        host: &host.id,
                        capacity: host.capacity.unwrap_or(cluster.host_capacity),
                        state: host.state,
                    })
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homogeneous_zone_has_the_asked_hosts_in_full_racks() {
        let cap = Resources::from_whole(48.0, 384.0, 0.0).unwrap();
        let inv = InventorySpec::homogeneous("z1", 10, 4, cap);
        let hosts: Vec<_> = inv.hosts().collect();
        assert_eq!(hosts.len(), 10);
        assert_eq!(inv.zones[0].clusters[0].racks.len(), 3);
        assert_eq!(hosts[9].host.as_str(), "z1-h9");
        assert_eq!(hosts[9].rack.as_str(), "z1-r2");
        assert!(hosts.iter().all(|h| h.capacity == cap && h.state == HostState::Available));
    }
}
