//! The durable allocator's unit tests: batches, failed commits, restarts, rejections that stand.

use super::*;
use domain::ResourceKind;
use domain::{AllocationDecision, AllocationOutcome, AllocationRequest, HostState, Resources, VmRequest};

fn spec() -> InventorySpec {
    InventorySpec::homogeneous("z", 4, 2, Resources::from_whole(8.0, 32.0, 0.0).unwrap())
}

fn vm(id: &str, cores: f64) -> VmRequest {
    VmRequest::new(id, "t", "D", Resources::from_whole(cores, 4.0, 0.0).unwrap())
}

/// The durable allocator over the SQLite store at `path`, default policy, opened at `now_s`.
fn open(path: &std::path::Path, now_s: f64) -> DurableAllocator {
    DurableAllocator::open(&spec(), &AllocatorConfig::default(), &Registry::standard(), path, now_s).unwrap()
}

fn allocate(id: &str, cores: f64) -> Allocate {
    Allocate(AllocationRequest::Vm(vm(id, cores)))
}

fn placed(reply: &Result<AllocationDecision, CommandError>) -> bool {
    reply.as_ref().is_ok_and(AllocationDecision::is_placed)
}

#[test]
fn a_batch_commits_once_and_reads_see_earlier_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut durable = open(&path, 100.0);
    let (placed_a, a) = job(allocate("a", 2.0));
    let (get_a, where_a) = job(GetAllocation(VmId::from("a")));
    let (too_big, big) = job(allocate("b", 64.0));
    let (again_a, replay) = job(allocate("a", 2.0));
    let (release_nope, nope) = job(Release::vm(VmId::from("nope")));
    let (fail_h3, failed) = job(SetHostState { host: HostId::from("z-h3"), state: HostState::Failed });
    durable.execute(vec![placed_a, get_a, too_big, again_a, release_nope, fail_h3], 101.0);
    assert!(placed(&a.ready()));
    assert_eq!(where_a.ready().unwrap().vm_id.as_str(), "a");
    assert!(!big.ready().unwrap().is_placed(), "64 cores fit nowhere");
    assert!(replay.ready().unwrap().replayed);
    assert_eq!(nope.ready(), Err(CommandError::UnknownVm(VmId::from("nope"))));
    assert_eq!(failed.ready().unwrap().previous, HostState::Available);
    let stored = crate::store::SqliteStore::open(&path).unwrap().load().unwrap();
    assert_eq!(stored.vms.len(), 1, "the rejection and the replay wrote nothing");
    assert_eq!(stored.host_states, [(HostId::from("z-h3"), HostState::Failed)]);
}

#[test]
fn a_write_whose_caller_gave_up_is_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut durable = open(&path, 0.0);
    let (gone, answer) = job(allocate("gone", 1.0));
    drop(answer);
    let (kept, still_waiting) = job(allocate("kept", 1.0));
    durable.execute(vec![gone, kept], 1.0);
    assert!(placed(&still_waiting.ready()));
    let stored = crate::store::SqliteStore::open(&path).unwrap().load().unwrap();
    let ids: Vec<&str> = stored.vms.iter().map(|vm| vm.vm.id.as_str()).collect();
    assert_eq!(ids, ["kept"], "the abandoned allocation placed nothing");
}

#[test]
fn a_failed_commit_undoes_the_batch_and_answers_503() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut durable = open(&path, 0.0);
    assert!(placed(&durable.execute_one(allocate("kept", 1.0), 1.0)));
    // Another connection holds the write lock: the batch's commit times out and fails.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (place_lost, lost) = job(allocate("lost", 1.0));
    let (get_lost, where_lost) = job(GetAllocation(VmId::from("lost")));
    let (get_kept, where_kept) = job(GetAllocation(VmId::from("kept")));
    durable.execute(vec![place_lost, get_lost, get_kept], 2.0);
    let lost = lost.ready();
    assert!(matches!(&lost, Err(CommandError::NotDurable(_))), "{lost:?}");
    // Reads are answered from the rebuilt state.
    assert_eq!(where_lost.ready(), Err(CommandError::UnknownVm(VmId::from("lost"))));
    assert_eq!(where_kept.ready().unwrap().vm_id.as_str(), "kept");
    blocker.execute_batch("ROLLBACK").unwrap();
    drop(blocker);
    assert!(matches!(durable.execute_one(GetAllocation(VmId::from("lost")), 3.0), Err(CommandError::UnknownVm(_))));
    assert!(durable.execute_one(GetAllocation(VmId::from("kept")), 3.0).is_ok());
    assert!(placed(&durable.execute_one(allocate("lost", 1.0), 4.0)), "a retry goes through");
    let used: u64 = durable.allocator().unwrap().state().hosts().iter().map(|h| h.used.base(ResourceKind::Cores)).sum();
    assert_eq!(used, 2000);
}

#[test]
fn a_store_that_contradicts_the_inventory_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut durable = open(&path, 0.0);
    let reply = durable.execute_one(allocate("big", 6.0), 1.0);
    let host = match reply {
        Ok(AllocationDecision { outcome: AllocationOutcome::Placed { placements }, .. }) => {
            placements[0].host_id.clone()
        }
        other => panic!("{other:?}"),
    };
    drop(durable);
    let smaller = InventorySpec::homogeneous("z", 4, 2, Resources::from_whole(4.0, 32.0, 0.0).unwrap());
    let err = DurableAllocator::open(&smaller, &AllocatorConfig::default(), &Registry::standard(), &path, 2.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`big`") && err.contains(&format!("`{host}`")), "{err}");
    let other_zone = InventorySpec::homogeneous("y", 4, 2, Resources::from_whole(8.0, 32.0, 0.0).unwrap());
    let err = DurableAllocator::open(&other_zone, &AllocatorConfig::default(), &Registry::standard(), &path, 2.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`big`") && err.contains("not in the inventory"), "{err}");
}

#[test]
fn a_rejection_stands_in_its_batch_after_it_and_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut durable = open(&path, 0.0);
    for i in 0..4 {
        assert!(placed(&durable.execute_one(allocate(&format!("full-{i}"), 8.0), 1.0)));
    }
    // The same request twice in one batch, a release between them that makes room: one answer.
    let (first, rejected) = job(allocate("x", 8.0));
    let (release, released) = job(Release::vm(VmId::from("full-0")));
    let (second, again) = job(allocate("x", 8.0));
    durable.execute(vec![first, release, second], 2.0);
    assert!(released.ready().is_ok());
    let rejected = rejected.ready().unwrap();
    assert!(!rejected.is_placed() && !rejected.replayed, "{rejected:?}");
    let again = again.ready().unwrap();
    assert!(!again.is_placed() && again.replayed, "the first answer, replayed: {again:?}");
    assert_eq!(again.outcome, rejected.outcome);
    // In a later batch, and after a restart, while it stands: the same answer, though room is free.
    let later = durable.execute_one(allocate("x", 8.0), 3.0).unwrap();
    assert_eq!((later.outcome.clone(), later.replayed), (rejected.outcome.clone(), true));
    drop(durable);
    let mut reopened = open(&path, 4.0);
    let restarted = reopened.execute_one(allocate("x", 8.0), 4.0).unwrap();
    assert_eq!((restarted.outcome, restarted.replayed), (rejected.outcome, true));
    assert!(placed(&reopened.execute_one(allocate("y", 8.0), 5.0)), "the room was free all along");
}

mod policy_state_restart {
    use super::*;
    use domain::{AllocationRequest, Resources, VmRequest};

    #[test]
    fn a_deadline_that_passed_unrecorded_applies_again_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let spec = InventorySpec::homogeneous("z", 4, 2, Resources::from_whole(8.0, 32.0, 0.0).unwrap());
        let config = AllocatorConfig { policy: placement::PolicyConfig::preset("lava"), ..Default::default() };
        let mut durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, 1e6).unwrap();
        let vm = VmRequest::new("a", "t", "D", Resources::from_whole(1.0, 2.0, 0.0).unwrap());
        durable.execute_one(Allocate(AllocationRequest::Vm(vm)), 1e6 + 1.0).unwrap();
        // Only a rejection after the deadline: the class rises, and the restart agrees with it whether
        // or not the change was written (a deadline replays at its own time).
        let huge = VmRequest::new("huge", "t", "D", Resources::from_whole(64.0, 2.0, 0.0).unwrap());
        durable.execute_one(Allocate(AllocationRequest::Vm(huge)), 1e6 + 5_000.0).unwrap();
        let live = durable.allocator().unwrap();
        let host = live.state().vm(&VmId::from("a")).unwrap().host;
        let before = live.host_state().unwrap().snapshot(host).unwrap();
        let lava: placement::lava::LavaHost = serde_json::from_str(&before).unwrap();
        assert_eq!(lava.class, 1);
        drop(durable);
        let reopened = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, 1e6 + 5_000.0).unwrap();
        assert_eq!(reopened.allocator().unwrap().host_state().unwrap().snapshot(host).unwrap(), before);
    }
}
