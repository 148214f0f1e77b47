"""listener and reconcile against in-memory fakes of the control service and of Placement:
events applied once whatever their order and repetition, the allocator made equal to Placement."""

import unittest

import fixtures

from lifetime_alloc_openstack import listener, reconcile
from tests.unit.fakes import CAPACITY, FakeControl, FakePlacement

PROJECT = 'p1'


def event(uuid, node='host1', second=0, **over):
    data = {'uuid': uuid, 'tenant_id': PROJECT, 'host': node, 'node': node,
            'launched_at': '2026-12-07T10:00:00Z', 'terminated_at': '2026-12-07T11:00:00Z',
            'metadata': {},
            'flavor': {'nova_object.data': {'name': 'm1.tiny', 'vcpus': 1, 'memory_mb': 512,
                                            'root_gb': 1, 'ephemeral_gb': 0, 'swap': 0}}}
    data.update(over)
    metadata = {'timestamp': '2026-12-07 10:00:%02d.000000' % second, 'message_id': 'm'}
    return {'nova_object.data': data}, metadata


class ListenerTest(unittest.TestCase):

    def setUp(self):
        log = fixtures.FakeLogger(name='lifetime_alloc_openstack')
        log.setUp()
        self.addCleanup(log.cleanUp)
        self.log = log
        self.control = FakeControl({'host1': CAPACITY, 'host2': CAPACITY})
        self.failures = []
        self.endpoint = listener.NotificationEndpoint(
            self.control, on_failure=lambda: self.failures.append(1))

    def send(self, event_type, uuid, node='host1', second=0, priority='info', **over):
        payload, metadata = event(uuid, node, second, **over)
        getattr(self.endpoint, priority)({}, 'nova-compute:%s' % node, event_type, payload, metadata)
        return self.endpoint.counters

    def test_create_end_records_and_delete_end_releases_with_its_end_time(self):
        self.send('instance.create.end', 'vm-1')
        self.assertEqual(self.control.vms['vm-1']['host_id'], 'host1')
        self.assertEqual(self.control.vms['vm-1']['request']['demand'],
                         {'cores': 1.0, 'memory_gib': 0.5, 'ssd_gib': 1.0})
        self.send('instance.delete.end', 'vm-1', second=5)
        self.assertNotIn('vm-1', self.control.vms)
        self.assertEqual(self.control.calls[-1][0], 'release')
        self.assertIsNotNone(self.control.calls[-1][2])  # ended_at_s = terminated_at

    def test_a_replay_dates_the_exit_by_the_servers_ended_at_s_metadata(self):
        self.endpoint.send_times = False
        self.send('instance.create.end', 'vm-1', metadata={'requested_at_s': '864020.5'})
        self.assertEqual(self.control.vms['vm-1']['request']['requested_at_s'], 864020.5)
        self.send('instance.delete.end', 'vm-1', second=5,
                  metadata={'requested_at_s': '864020.5', 'ended_at_s': '864306.537'})
        self.assertEqual(self.control.calls[-1][0], 'release')
        self.assertEqual(self.control.calls[-1][2], 864306.537)
        # Without the key and without event times, the control service dates the exit.
        self.send('instance.create.end', 'vm-2')
        self.send('instance.delete.end', 'vm-2', second=6)
        self.assertIsNone(self.control.calls[-1][2])

    def test_duplicates_change_nothing(self):
        for _ in range(3):
            self.send('instance.create.end', 'vm-1')
        self.assertEqual([c[0] for c in self.control.calls], ['record'])
        self.assertEqual(self.endpoint.counters['duplicate'], 2)
        for _ in range(2):
            self.send('instance.delete.end', 'vm-1', second=3)
        self.assertEqual([c[0] for c in self.control.calls], ['record', 'release'])

    def test_a_create_after_its_delete_is_ignored(self):
        self.send('instance.delete.end', 'vm-1', second=5)
        self.send('instance.create.end', 'vm-1', second=1)
        self.assertNotIn('vm-1', self.control.vms)
        self.assertEqual(self.endpoint.counters['after_release'], 1)

    def test_an_older_move_after_a_newer_one_is_ignored(self):
        self.send('instance.create.end', 'vm-1', 'host1', second=1)
        self.send('instance.live_migration_post_dest.end', 'vm-1', 'host2', second=9)
        self.send('instance.resize_finish.end', 'vm-1', 'host1', second=5)
        self.assertEqual(self.control.vms['vm-1']['host_id'], 'host2')
        self.assertEqual(self.endpoint.counters['stale'], 1)

    def test_a_resize_takes_the_new_flavor(self):
        self.send('instance.create.end', 'vm-1', 'host1', second=1)
        bigger = {'nova_object.data': {'name': 'm1.small', 'vcpus': 2, 'memory_mb': 2048,
                                       'root_gb': 20, 'ephemeral_gb': 0, 'swap': 0}}
        self.send('instance.resize_finish.end', 'vm-1', 'host2', second=5, flavor=bigger)
        vm = self.control.vms['vm-1']
        self.assertEqual(('host2', 2.0), (vm['host_id'], vm['request']['demand']['cores']))
        # A second delivery changes nothing.
        calls = len(self.control.calls)
        self.send('instance.resize_finish.end', 'vm-1', 'host2', second=5, flavor=bigger)
        self.assertEqual(calls, len(self.control.calls))

    def test_a_create_error_releases_a_reservation(self):
        self.control.vms['vm-1'] = {'host_id': 'host1', 'request': {}, 'placed_at_s': 0}
        self.send('instance.create.error', 'vm-1', priority='error', node=None, host=None)
        self.assertNotIn('vm-1', self.control.vms)

    def test_unrelated_events_and_unreadable_payloads_are_skipped(self):
        self.send('instance.power_off.end', 'vm-1')
        self.send('instance.create.end', 'vm-2', tenant_id=None)
        self.send('instance.create.end', 'vm-3', node=None, host=None)
        self.assertEqual(self.control.calls, [])
        self.assertEqual(self.endpoint.counters['skipped'], 2)
        self.assertIn('vm-2 skipped: the notification has no project', self.log.output)

    def test_a_failure_asks_for_a_reconciliation_and_is_not_remembered(self):
        self.control.down = True
        self.send('instance.create.end', 'vm-1')
        self.assertEqual(self.failures, [1])
        self.control.down = False
        self.send('instance.create.end', 'vm-1')  # a redelivery is applied
        self.assertEqual(self.control.vms['vm-1']['host_id'], 'host1')

    def test_memory_is_bounded(self):
        small = listener.NotificationEndpoint(self.control, remember=100)
        for i in range(150):
            payload, metadata = event('vm-%d' % i)
            small.info({}, 'p', 'instance.create.end', payload, metadata)
        self.assertEqual(len(small._seen), 100)


class ReconcileTest(unittest.TestCase):

    def setUp(self):
        log = fixtures.FakeLogger(name='lifetime_alloc_openstack')
        log.setUp()
        self.addCleanup(log.cleanUp)
        self.placement = FakePlacement()
        for name in ('host1', 'host2'):
            self.placement.add(name)
        self.control = FakeControl({'host1': CAPACITY, 'host2': CAPACITY})

    def diffs(self):
        want, _ = reconcile.read_placement(self.placement)
        return reconcile.differences(want, reconcile.read_allocator(self.control))

    def test_equal_sides_have_no_difference_and_nothing_changes(self):
        self.placement.allocate('host1', 'vm-1')
        self.control.record('vm-1', 'host1', {'vm_id': 'vm-1', 'tenant_id': 'p1', 'vm_type': 't',
                                              'demand': {'cores': 1.0, 'memory_gib': 0.5, 'ssd_gib': 1.0}})
        self.assertEqual(self.diffs(), [])
        report = reconcile.reconcile(self.control, self.placement, now=1000.0)
        self.assertEqual(report.changed, 0)
        self.assertEqual(report.differences_before, 0)

    def test_missing_moved_and_gone_vms_are_healed(self):
        self.placement.allocate('host1', 'vm-missing')
        self.placement.allocate('host2', 'vm-moved')
        self.placement.allocate('host1', 'mig-1', consumer_type='MIGRATION')
        demand = {'cores': 1.0, 'memory_gib': 0.5, 'ssd_gib': 1.0}
        self.control.record('vm-moved', 'host1', {'vm_id': 'vm-moved', 'tenant_id': 'p1',
                                                  'vm_type': 'm1.tiny', 'demand': demand})
        self.control.record('vm-gone', 'host2', {'vm_id': 'vm-gone', 'tenant_id': 'p1',
                                                 'vm_type': 'm1.tiny', 'demand': demand})
        self.control.now = 0.0
        self.control.record('vm-fresh', 'host2', {'vm_id': 'vm-fresh', 'tenant_id': 'p1',
                                                  'vm_type': 'm1.tiny', 'demand': demand})
        self.control.vms['vm-fresh']['placed_at_s'] = 990.0
        self.control.vms['vm-gone']['placed_at_s'] = 100.0
        self.assertEqual(len(self.diffs()), 7)  # 5 VMs, the used of both hosts
        report = reconcile.reconcile(self.control, self.placement, grace_s=60, now=1000.0)
        self.assertEqual(report.vms_recorded, ['mig-1', 'vm-missing'])
        self.assertEqual(report.vms_moved, ['vm-moved'])
        self.assertEqual(report.vms_released, ['vm-gone'])
        self.assertEqual(report.vms_in_flight, ['vm-fresh'])
        self.assertEqual(self.control.vms['mig-1']['request']['vm_type'], 'nova-migration')
        self.assertEqual(self.control.vms['vm-moved']['request']['vm_type'], 'm1.tiny')
        self.assertEqual(self.diffs(), ['host host2: used {\'cores\': 2.0, \'memory_gib\': 1.0, \'ssd_gib\': 2.0} '
                                        'in the allocator, [1000, 512, 1024] (base units) in Placement',
                                        'vm vm-fresh: on host2 in the allocator, on None in Placement'])
        self.placement.allocate('host2', 'vm-fresh')
        self.assertEqual(self.diffs(), [])

    def test_hosts_follow_providers_capacity_and_the_disabled_trait(self):
        inv = dict(self.placement.rps['host2']['inv'])
        inv['VCPU'] = {'total': 4, 'reserved': 0, 'allocation_ratio': 3.0}
        self.placement.rps['host2']['inv'] = inv
        self.placement.add('host3', traits=['COMPUTE_STATUS_DISABLED'])
        self.control.put_host('old', CAPACITY)
        self.control.put_host('busy', CAPACITY)
        self.control.record('vm-x', 'busy', {'vm_id': 'vm-x', 'tenant_id': 'p', 'vm_type': 't',
                                             'demand': {'cores': 1.0, 'memory_gib': 1.0}})
        self.control.vms['vm-x']['placed_at_s'] = 1000.0  # in flight: not released, host kept
        report = reconcile.reconcile(self.control, self.placement, grace_s=60, now=1000.0)
        self.assertEqual(report.hosts_added, ['host3'])
        self.assertEqual(report.hosts_updated, ['host2'])
        self.assertEqual(report.hosts_removed, ['old'])
        self.assertEqual(report.hosts_kept, ['busy'])
        self.assertEqual(self.control.hosts_['host3']['state'], 'unavailable')
        self.assertEqual(self.control.hosts_['host2']['capacity']['cores'], 12.0)
        # enabled again
        self.placement.rps['host3']['traits'] = []
        report = reconcile.reconcile(self.control, self.placement, grace_s=60, now=1000.0)
        self.assertEqual(report.hosts_updated, ['host3'])
        self.assertEqual(self.control.hosts_['host3']['state'], 'available')

    def test_a_resized_server_gets_its_new_demand(self):
        self.placement.allocate('host1', 'vm-1', {'VCPU': 2, 'MEMORY_MB': 2048, 'DISK_GB': 20})
        self.control.record('vm-1', 'host1', {'vm_id': 'vm-1', 'tenant_id': 'p1', 'vm_type': 'm1.tiny',
                                              'demand': {'cores': 1.0, 'memory_gib': 0.5, 'ssd_gib': 1.0}})
        self.assertEqual(1, len(self.diffs()))  # the used of host1
        report = reconcile.reconcile(self.control, self.placement, now=1000.0)
        self.assertEqual(['vm-1'], report.vms_resized)
        self.assertEqual('m1.tiny', self.control.vms['vm-1']['request']['vm_type'])
        self.assertEqual([], self.diffs())
        self.assertEqual(0, reconcile.reconcile(self.control, self.placement, now=1000.0).changed)

    def test_a_failed_host_stays_failed(self):
        self.control.hosts_['host1']['state'] = 'failed'
        report = reconcile.reconcile(self.control, self.placement, now=1000.0)
        self.assertEqual(report.changed, 0)
        self.assertEqual(self.diffs(), [])

    def test_vms_the_listener_released_are_not_recorded_again(self):
        self.placement.allocate('host1', 'vm-1')
        report = reconcile.reconcile(self.control, self.placement, now=1000.0,
                                     released_by_listener=lambda vm: vm == 'vm-1')
        self.assertEqual(report.vms_recorded, [])

    def test_errors_are_reported_not_raised(self):
        self.placement.allocate('host1', 'vm-1', project=None)
        self.placement.add('bad name')
        report = reconcile.reconcile(self.control, self.placement, now=1000.0)
        self.assertEqual(len(report.errors), 2)
        self.assertIn('no project', ' '.join(report.errors))
        self.assertIn('summary', dir(report))
        self.assertIn('errors 2', report.summary())


if __name__ == '__main__':
    unittest.main()
