//! What a cloud's control plane tells the allocator (issue 57), on both stores: hosts added,
//! resized, moved and removed while it runs (durable across a restart, followed by the other agents
//! of a PostgreSQL zone, never under a host's VMs), VMs recorded where the cloud put them (placed,
//! moved, resized, unchanged: idempotent), and a request narrowed to the cloud scheduler's
//! candidates.

use allocator::durable::{
    Allocate, CommandError, DurableAllocator, GetAllocation, GetHost, RecordAt, Release, RemoveHost, UpdateHost,
};
use allocator::store::{self, StoreLocation};
use domain::{
    AllocationOutcome, AllocationRequest, HostId, HostState, HostUpdate, InventorySpec, RecordOutcome, Resources, VmId,
    VmRequest,
};
use placement::allocator::AllocatorConfig;
use placement::Registry;
use test_support::postgres::Postgres;

fn spec() -> InventorySpec {
    InventorySpec::homogeneous("z", 2, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap())
}

fn cores(n: f64) -> Resources {
    Resources::from_whole(n, n * 4.0, 0.0).unwrap()
}

fn update(capacity: f64) -> UpdateHost {
    UpdateHost {
        host: HostId::from("n1"),
        update: HostUpdate { capacity: cores(capacity), state: None, cluster_id: None, rack_id: None, hardware: None },
    }
}

fn open(location: &StoreLocation, spec: &InventorySpec) -> DurableAllocator {
    DurableAllocator::open(spec, &AllocatorConfig::default(), &Registry::standard(), location.clone(), 0.0).unwrap()
}

fn vm(id: &str, n: f64) -> VmRequest {
    VmRequest::new(id, "t", "D", cores(n))
}

/// Where `id` is placed by `request` narrowed to `candidates`.
fn place_among(durable: &mut DurableAllocator, id: &str, candidates: &[&str], at: f64) -> Option<String> {
    let mut request = vm(id, 2.0);
    request.candidates = Some(candidates.iter().map(|c| HostId::from(*c)).collect());
    match durable.execute_one(Allocate(AllocationRequest::Vm(request)), at).unwrap().outcome {
        AllocationOutcome::Placed { placements } => Some(placements[0].host_id.to_string()),
        AllocationOutcome::Rejected { .. } => None,
    }
}

/// The hosts with their capacity and state, in inventory order.
fn inventory(durable: &DurableAllocator) -> Vec<(String, Resources, HostState)> {
    let state = durable.allocator().unwrap().state();
    state.hosts().iter().map(|h| (h.id.to_string(), h.capacity, h.state)).collect()
}

/// The inventory's changes, the candidates and the records on one store, then what a restart
/// rebuilds from it.
fn inventory_follows_the_cloud(location: &StoreLocation) {
    let mut durable = open(location, &spec());
    // A host the configuration never named joins, with a capacity of its own.
    let added = durable.execute_one(update(8.0), 1.0).unwrap();
    assert!(added.added && added.state == HostState::Available, "{location}: {added:?}");
    assert!(!durable.execute_one(update(8.0), 1.5).unwrap().added, "{location}: repeating it adds nothing");
    assert_eq!(inventory(&durable).last().unwrap().0, "n1");
    // The policy chooses among the candidates alone; ids it does not know are passed over.
    assert_eq!(place_among(&mut durable, "a", &["n1", "gone"], 2.0).as_deref(), Some("n1"));
    assert_eq!(place_among(&mut durable, "b", &["gone"], 2.5), None, "{location}: no known candidate");
    // Never below what the VMs use, and never removed under them: refused, nothing changed.
    let shrunk = durable.execute_one(update(1.0), 3.0).unwrap_err();
    assert!(matches!(shrunk, CommandError::HostInUse(_)), "{location}: {shrunk:?}");
    let removed = durable.execute_one(RemoveHost(HostId::from("n1")), 3.0).unwrap_err();
    assert!(matches!(removed, CommandError::HostInUse(_)), "{location}: {removed:?}");
    assert_eq!(inventory(&durable).last().unwrap().1, cores(8.0));
    // The cloud put `c` on z-h1 and moved `a` to z-h0, whatever was decided: recorded, once.
    let record = |id: &str, host: &str| RecordAt { vm: vm(id, 2.0), host: HostId::from(host) };
    let outcomes: Vec<_> = [record("c", "z-h1"), record("c", "z-h1"), record("a", "z-h0")]
        .into_iter()
        .map(|command| durable.execute_one(command, 4.0).unwrap())
        .map(|recorded| (recorded.recorded, recorded.from_host_id.map(|h| h.to_string())))
        .collect();
    assert_eq!(
        outcomes,
        [
            (RecordOutcome::Placed, None),
            (RecordOutcome::Unchanged, None),
            (RecordOutcome::Moved, Some("n1".to_owned()))
        ],
        "{location}"
    );
    // Resized where it is: its new demand, no exit; one that no longer fits is refused.
    let resized = durable.execute_one(RecordAt { vm: vm("a", 4.0), host: HostId::from("z-h0") }, 4.2).unwrap();
    assert_eq!(resized.recorded, RecordOutcome::Resized, "{location}");
    let huge = durable.execute_one(RecordAt { vm: vm("a", 17.0), host: HostId::from("z-h0") }, 4.3).unwrap_err();
    assert!(matches!(huge, CommandError::DoesNotFit(_)), "{location}: {huge:?}");
    let unknown = durable.execute_one(record("d", "nowhere"), 4.5).unwrap_err();
    assert_eq!(unknown, CommandError::UnknownHost(HostId::from("nowhere")));
    let too_big = durable.execute_one(RecordAt { vm: vm("e", 9.0), host: HostId::from("n1") }, 4.5).unwrap_err();
    assert!(matches!(too_big, CommandError::DoesNotFit(_)), "{location}: {too_big:?}");
    // Empty now: resized, then a configured host removed and a disabled one added.
    durable.execute_one(update(12.0), 5.0).unwrap();
    durable.execute_one(Release::vm(VmId::from("c")), 5.5).unwrap();
    durable.execute_one(RemoveHost(HostId::from("z-h1")), 6.0).unwrap();
    let disabled = UpdateHost {
        host: HostId::from("n2"),
        update: HostUpdate { state: Some(HostState::Unavailable), ..update(4.0).update },
    };
    durable.execute_one(disabled, 6.5).unwrap();
    let expected = vec![
        ("z-h0".to_owned(), cores(16.0), HostState::Available),
        ("n1".to_owned(), cores(12.0), HostState::Available),
        ("n2".to_owned(), cores(4.0), HostState::Unavailable),
    ];
    assert_eq!(inventory(&durable), expected, "{location}");
    drop(durable);
    // A restart on the same configuration rebuilds the cloud's inventory, and its VMs on it.
    let mut reopened = open(location, &spec());
    assert_eq!(inventory(&reopened), expected, "{location}: the restart");
    let a = reopened.execute_one(GetAllocation(VmId::from("a")), 7.0).unwrap();
    assert_eq!((a.host_id, a.demand), (HostId::from("z-h0"), cores(4.0)), "{location}: moved and resized");
    assert_eq!(
        reopened.execute_one(GetHost(HostId::from("z-h1")), 7.0).unwrap_err(),
        CommandError::UnknownHost(HostId::from("z-h1"))
    );
    let stored = store::open(location, &spec()).unwrap().load().unwrap();
    assert_eq!(stored.inventory.len(), 3, "{location}: n1, z-h1 (removed), n2");
}

#[test]
fn the_inventory_follows_the_cloud_in_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    inventory_follows_the_cloud(&StoreLocation::Sqlite(dir.path().join("s.db")));
}

#[test]
fn the_inventory_follows_the_cloud_in_postgres_and_every_agent_sees_it() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    inventory_follows_the_cloud(&location);
    // Two more agents of the zone: one changes the inventory, the other follows it.
    let mut a = open(&location, &spec());
    let mut b = open(&location, &spec());
    let n3 = UpdateHost { host: HostId::from("n3"), update: update(6.0).update };
    a.execute_one(n3, 10.0).unwrap();
    assert_eq!(place_among(&mut b, "f", &["n3"], 11.0).as_deref(), Some("n3"), "B follows A's new host");
    let resized = a.execute_one(RecordAt { vm: vm("f", 3.0), host: HostId::from("n3") }, 11.5).unwrap();
    assert_eq!(resized.recorded, RecordOutcome::Resized, "A follows B's placement, then resizes it");
    let f = b.execute_one(GetAllocation(VmId::from("f")), 11.7).unwrap();
    assert_eq!(f.demand, cores(3.0), "B follows A's resize");
    b.execute_one(update(20.0), 12.0).unwrap();
    let Ok(n1) = a.execute_one(GetHost(HostId::from("n1")), 13.0) else { panic!("A lost n1") };
    assert_eq!(n1.host.capacity, cores(20.0), "A follows B's resize");
    // A cold resize: moved and resized at once.
    let moved = a.execute_one(RecordAt { vm: vm("f", 1.0), host: HostId::from("n1") }, 13.5).unwrap();
    assert_eq!((moved.recorded, moved.from_host_id), (RecordOutcome::Moved, Some(HostId::from("n3"))));
    let f = b.execute_one(GetAllocation(VmId::from("f")), 13.7).unwrap();
    assert_eq!((f.host_id, f.demand), (HostId::from("n1"), cores(1.0)), "B follows the cold resize");
    a.execute_one(RecordAt { vm: vm("f", 3.0), host: HostId::from("n3") }, 13.8).unwrap();
    // The database refuses by itself what an agent's stale view would allow: removing a host with
    // a VM on it.
    let err = a.execute_one(RemoveHost(HostId::from("n3")), 14.0).unwrap_err();
    assert!(matches!(err, CommandError::HostInUse(_)), "{err:?}");
    // An empty zone at start: every host comes from the cloud.
    let empty = InventorySpec::homogeneous("z", 0, 1, cores(1.0));
    let dir = tempfile::tempdir().unwrap();
    let mut cloud = open(&StoreLocation::Sqlite(dir.path().join("empty.db")), &empty);
    assert_eq!(place_among(&mut cloud, "g", &["n1"], 1.0), None, "no host yet");
    cloud.execute_one(update(4.0), 2.0).unwrap();
    assert_eq!(place_among(&mut cloud, "h", &["n1"], 3.0).as_deref(), Some("n1"));
}
