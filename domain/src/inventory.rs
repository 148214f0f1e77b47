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

/// A host added or changed while the allocator runs (its admin API, a cloud's inventory): where it
/// sits and what it offers. It takes the place of the configured host of its id, if any.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub cluster_id: ClusterId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub rack_id: RackId,
    /// The hardware generation of its cluster (used when the cluster is new).
    pub hardware: String,
    pub capacity: Resources,
}

impl InventorySpec {
    /// This inventory with the hosts added, changed (`Some`) or removed (`None`) while the
    /// allocator ran, in order. A changed host keeps its configured state and moves to the
    /// entry's cluster and rack (made in the first zone when new); clusters and racks left empty
    /// stay, harmlessly.
    pub fn with_changes<'a>(&self, changes: impl IntoIterator<Item = (&'a HostId, Option<&'a HostEntry>)>) -> Self {
        let mut spec = self.clone();
        for (id, entry) in changes {
            let mut state = HostState::Available;
            for rack in spec.zones.iter_mut().flat_map(|z| &mut z.clusters).flat_map(|c| &mut c.racks) {
                if let Some(at) = rack.hosts.iter().position(|h| h.id == *id) {
                    state = rack.hosts.remove(at).state;
                }
            }
            let (Some(entry), Some(zone)) = (entry, spec.zones.first_mut()) else { continue };
            let cluster = match zone.clusters.iter().position(|c| c.id == entry.cluster_id) {
                Some(at) => &mut zone.clusters[at],
                None => {
                    zone.clusters.push(ClusterSpec {
                        id: entry.cluster_id.clone(),
                        hardware: entry.hardware.clone(),
                        host_capacity: entry.capacity,
                        racks: Vec::new(),
                    });
                    zone.clusters.last_mut().expect("just pushed")
                }
            };
            let rack = match cluster.racks.iter().position(|r| r.id == entry.rack_id) {
                Some(at) => &mut cluster.racks[at],
                None => {
                    cluster.racks.push(RackSpec { id: entry.rack_id.clone(), hosts: Vec::new() });
                    cluster.racks.last_mut().expect("just pushed")
                }
            };
            rack.hosts.push(HostSpec { id: id.clone(), capacity: Some(entry.capacity), state });
        }
        spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_add_move_resize_and_remove_hosts() {
        let cap = Resources::from_whole(8.0, 32.0, 0.0).unwrap();
        let big = Resources::from_whole(16.0, 64.0, 0.0).unwrap();
        let mut inv = InventorySpec::homogeneous("z1", 3, 2, cap);
        inv.zones[0].clusters[0].racks[0].hosts[1].state = HostState::Unavailable;
        let entry = |cluster: &str, rack: &str, capacity| HostEntry {
            cluster_id: ClusterId(cluster.to_owned()),
            rack_id: RackId(rack.to_owned()),
            hardware: "gen9".to_owned(),
            capacity,
        };
        let (h0, h1, new) = (HostId::from("z1-h0"), HostId::from("z1-h1"), HostId::from("n1"));
        let (resized, added) = (entry("z1-c0", "z1-r0", big), entry("nova", "nova", cap));
        let changed = inv.with_changes([(&h1, Some(&resized)), (&new, Some(&added)), (&h0, None)]);
        let hosts: Vec<_> = changed.hosts().map(|h| (h.host.as_str(), h.capacity, h.state, h.hardware)).collect();
        assert_eq!(
            hosts,
            [
                ("z1-h1", big, HostState::Unavailable, "default"),
                ("z1-h2", cap, HostState::Available, "default"),
                ("n1", cap, HostState::Available, "gen9")
            ]
        );
        // Removing what is not there, or twice, changes nothing more.
        assert_eq!(changed.with_changes([(&h0, None)]), changed);
    }

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
