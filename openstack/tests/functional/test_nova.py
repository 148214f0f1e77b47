"""Nova places its servers through the allocator, in Nova's own functional harness, with the
project's three binaries: a piece of the synthetic trace booted and deleted in its order, the
faults (the control service killed or frozen, the listener down, notifications duplicated and
reordered), an inventory that follows the cloud, and bad input."""

import os
import signal
import time

from testtools import content

from lifetime_alloc_openstack import weigher
from nova import context as nova_context
from nova import objects
from nova.scheduler import weights as nova_weights
from tests.functional import base
from tests.functional import trace

TINY = '1'  # Nova's m1.tiny: 1 VCPU, 512 MB, 1 GB


class TraceReplayTest(base.NovaTestBase):
    """48 servers of the seeded synthetic trace (day 0 from 10:00, every 40th request, shapes
    scaled to the fake nodes) booted and deleted in the order of their arrivals and exits, the
    allocator on the trace's clock (each boot's ``requested_at_s`` hint), 5 compute nodes."""

    HOSTS = ('host1', 'host2', 'host3', 'host4', 'host5')
    INVENTORY = ()  # the allocator starts empty: its hosts come from Placement
    CLOCK = 'request'
    PHASES = 4

    def test_every_server_lands_where_the_allocator_decided_and_the_books_agree(self):
        events = trace.events(count=48, every=40)
        boots = [e for e in events if e[1] == 'boot']
        phase_size = len(boots) // self.PHASES
        servers, landed, booted = {}, {}, 0
        started = time.monotonic()
        for at, kind, vm in events:
            if kind == 'delete':
                self.delete(servers.pop(vm.trace_id))
                continue
            self.api.project_id = vm.tenant  # the trace's tenant is the server's project
            flavor = self.flavor(*vm.flavor)
            server = self.boot(vm.trace_id, flavor, hints={'requested_at_s': '%.3f' % at})
            servers[vm.trace_id] = server
            landed[server['id']] = self.node_of(server)
            booted += 1
            if booted % phase_size == 0:
                self.assert_phase(landed)
        for server in servers.values():
            self.delete(server)
        self.assert_phase(landed)
        hosts = self.control.hosts()
        self.assertEqual([], [h for h in hosts if h['vms']])
        self.assertEqual(48, len(landed))
        self.addDetail('timing', content.text_content('%d boots and %d deletes in %.1f s; weigher: %s'
                                           % (len(boots), len(events) - len(boots) + len(servers),
                                              time.monotonic() - started, dict(weigher.COUNTERS))))

    def assert_phase(self, landed):
        # Every server is where the allocator decided (the weigher was asked whenever Nova had
        # two candidates or more; with one, Nova's choice is the only one and is recorded).
        for uuid, node in landed.items():
            decision = self.decision_of(uuid)
            if decision is not None:
                self.assertEqual(('placed', node), decision, 'server %s' % uuid)
        self.assertEqual({'placed'}, set(weigher.COUNTERS), dict(weigher.COUNTERS))
        self.assert_no_difference()
        report = self.reconcile_now()
        self.assertEqual(0, report.changed, report.as_dict())
        self.assertEqual([], report.errors)


class FaultsTest(base.NovaTestBase):
    HOSTS = ('host1', 'host2', 'host3')

    def test_control_service_killed_mid_run(self):
        before = [self.boot('before-%d' % i) for i in range(3)]
        self.assert_no_difference()
        self.stack.kill('control-service')
        # Boots go on with Nova's own weighers: the connection is refused at once.
        during = []
        for i in range(3):
            begun = time.monotonic()
            during.append(self.boot('during-%d' % i))
            self.assertLess(time.monotonic() - begun, 10.0)
        self.assertEqual(3, weigher.COUNTERS['unreachable'])
        self.assertTrue(all(self.decision_of(s['id'])[0] == 'unreachable' for s in during))
        self.delete(before[0])
        # The listener could apply none of these four events.
        self.wait_for_listener('failed', 4)
        self.stack.restart('control-service')
        report = self.reconcile_now()
        self.assertEqual([], report.errors)
        self.assertEqual(sorted(s['id'] for s in during), sorted(report.vms_recorded))
        self.assertEqual([before[0]['id']], report.vms_released)
        self.assert_no_difference()
        self.assertEqual(0, self.reconcile_now().changed)

    def test_a_frozen_control_service_costs_a_boot_no_more_than_the_timeout(self):
        self.boot('warm')
        process = self.stack.services['control-service'].process
        os.kill(process.pid, signal.SIGSTOP)
        try:
            frozen = [self.boot('frozen-%d' % i) for i in range(2)]
        finally:
            os.kill(process.pid, signal.SIGCONT)
        for server in frozen:
            uuid, outcome, host, seconds = next(r for r in weigher.RECENT if r[0] == server['id'])
            self.assertEqual('timeout', outcome)
            self.assertLess(seconds, 2 * self.TIMEOUT + 0.5)  # connect + read, each bounded
        # The frozen requests may still be carried out once it runs again (a reservation Nova
        # did not follow, a record): the reconciliation leaves no difference.
        time.sleep(1.0)
        self.reconcile_now()
        self.assert_no_difference()

    def test_servers_deleted_while_the_listener_is_down_are_found(self):
        servers = [self.boot('s%d' % i) for i in range(6)]
        self.assert_no_difference()
        self.stop_listener()
        # Nothing reaches the listener meanwhile: its notifications are lost, not queued.
        self.stub_out('nova.rpc.NOTIFIER', self._notifier('noop'))
        for server in servers[:3]:
            self.delete(server)
        self.stub_out('nova.rpc.NOTIFIER', self._notifier('messaging'))
        self.start_listener()
        self.assertEqual(3, len([d for d in self.differences() if d.startswith('vm ')]))
        report = self.reconcile_now()
        self.assertEqual(sorted(s['id'] for s in servers[:3]), sorted(report.vms_released))
        self.assertEqual(3, report.changed)
        self.assert_no_difference()

    def test_duplicated_and_reordered_notifications_change_nothing(self):
        seen = []
        endpoint = self.service.endpoint
        handle = endpoint.handle

        def recording(event_type, payload, metadata=None):
            seen.append((event_type, payload, metadata))
            return handle(event_type, payload, metadata)
        endpoint.handle = recording
        servers = [self.boot('s%d' % i) for i in range(4)]
        for server in servers[:2]:
            self.delete(server)
        self.assert_no_difference()
        snapshot = self.control.hosts()
        instance_events = [e for e in seen if e[0] in ('instance.create.end', 'instance.delete.end')]
        self.assertEqual(6, len(instance_events))
        calls = []
        client = endpoint.client
        for name in ('record', 'release'):
            real = getattr(client, name)
            setattr(client, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
        try:
            for event_type, payload, metadata in list(reversed(instance_events)) + instance_events * 2:
                handle(event_type, payload, metadata)
        finally:
            client.record = type(client).record.__get__(client)
            client.release = type(client).release.__get__(client)
        self.assertEqual(snapshot, self.control.hosts())
        self.assert_no_difference()
        # Each replayed event was recognised: nothing was sent for a released server again.
        self.assertNotIn('release', calls)
        self.assertGreaterEqual(endpoint.counters['after_release'] + endpoint.counters['duplicate'], 12)


class ServerActionsTest(base.NovaTestBase):
    HOSTS = ('host1', 'host2', 'host3')

    def test_each_server_of_a_multiple_create_is_placed_by_the_allocator(self):
        server = self._build_server(name='multi', flavor_id=TINY, networks='none')
        server.update({'min_count': 3, 'max_count': 3})
        self.api.post_server({'server': server})
        deadline = time.monotonic() + 30
        while True:
            servers = self.admin_api.get_servers(search_opts={'name': 'multi'})
            if len(servers) == 3 and all(s['status'] == 'ACTIVE' for s in servers):
                break
            self.assertLess(time.monotonic(), deadline, servers)
            time.sleep(0.05)
        for server in servers:
            self.assertEqual(('placed', self.node_of(server)), self.decision_of(server['id']))
        self.assert_no_difference()

    def test_resized_and_migrated_servers_are_followed(self):
        servers = [self.boot('s%d' % i) for i in range(2)]
        # A resize to a bigger flavor: Nova's weighers choose (the weigher is neutral for moves).
        self.api.post_server_action(servers[0]['id'], {'resize': {'flavorRef': '2'}})
        self.wait_for_status(servers[0], 'VERIFY_RESIZE')
        self.api.post_server_action(servers[0]['id'], {'confirmResize': None})
        resized = self.wait_for_status(servers[0], 'ACTIVE')
        # A cold migration of the other.
        self.api.post_server_action(servers[1]['id'], {'migrate': None})
        self.wait_for_status(servers[1], 'VERIFY_RESIZE')
        self.api.post_server_action(servers[1]['id'], {'confirmResize': None})
        migrated = self.wait_for_status(servers[1], 'ACTIVE')
        self.assertNotEqual(self.node_of(servers[1]), self.node_of(migrated))
        self.assertEqual(2, weigher.COUNTERS['move'])
        self.assert_no_difference()
        self.assertEqual(self.node_of(resized), self.stack.vm(resized['id'])['host_id'])
        self.assertEqual(2.0, self.stack.vm(resized['id'])['demand']['memory_gib'])
        self.assertEqual(0, self.reconcile_now().changed)


class InventoryTest(base.NovaTestBase):
    HOSTS = ('host1', 'host2', 'host3')
    INVENTORY = ()

    def test_computes_started_mid_run_join_and_receive_servers(self):
        big = self.flavor('big', 2, 7680)  # a node's memory; 2 VCPUs is Placement's max_unit
        for i in range(3):  # the three first hosts full
            self.boot('big-%d' % i, big)
        self.assertEqual({'host1', 'host2', 'host3'}, {h['host_id'] for h in self.control.hosts()})
        for name in ('host4', 'host5'):
            self.computes[name] = self._start_compute(name)
        report = self.reconcile_now()
        self.assertEqual(['host4', 'host5'], report.hosts_added)
        late = [self.boot('late-%d' % i) for i in range(4)]
        for server in late:
            self.assertIn(self.node_of(server), ('host4', 'host5'))
            self.assertEqual(('placed', self.node_of(server)), self.decision_of(server['id']))
        self.assert_no_difference()

    def test_a_host_with_another_allocation_ratio_is_filled_to_it_not_beyond(self):
        # host2's VCPU allocation ratio becomes 1.0 (2 cores) in Placement, as an operator sets
        # it; the reconciliation gives the allocator the same capacity.
        rp = next(p for p in self.placement_reader().providers() if p['name'] == 'host2')
        path = '/resource_providers/%s/inventories/VCPU' % rp['uuid']
        vcpu = self.placement.get(path, version='1.26').body
        vcpu['allocation_ratio'] = 1.0
        self.placement.put(path, vcpu, version='1.26')
        report = self.reconcile_now()
        self.assertEqual(['host2'], report.hosts_updated)
        host2 = next(h for h in self.control.hosts() if h['host_id'] == 'host2')
        self.assertEqual(2.0, host2['capacity']['cores'])
        servers = [self.boot('s%d' % i) for i in range(8)]
        on_host2 = [s for s in servers if self.node_of(s) == 'host2']
        self.assertEqual(2, len(on_host2))  # best fit fills the smallest host first, to its ratio
        self.assertTrue(all(self.decision_of(s['id'])[0] == 'placed' for s in servers))
        self.assert_no_difference()

    def test_a_disabled_compute_receives_none(self):
        self.disable_compute('host2')
        report = self.reconcile_now()
        self.assertEqual(['host2'], report.hosts_updated)
        host2 = next(h for h in self.control.hosts() if h['host_id'] == 'host2')
        self.assertEqual('unavailable', host2['state'])
        servers = [self.boot('s%d' % i) for i in range(6)]
        self.assertNotIn('host2', {self.node_of(s) for s in servers})
        self.assert_no_difference()


class BadInputTest(base.NovaTestBase):
    HOSTS = ('host1', 'host2', 'host3')
    INVENTORY = ('host1', 'host2')  # host3 is unknown to the allocator until a reconciliation

    def log(self):
        return self.stdlog.logger.output

    def test_a_flavor_the_allocator_cannot_read_is_neutral_and_logged(self):
        # 150 two-byte characters: a valid Nova flavor name, over the allocator's 256 bytes.
        flavor = self.flavor('é' * 150, 1, 512)
        server = self.boot('long-flavor', flavor)
        self.assertEqual('bad_request', self.decision_of(server['id'])[0])
        self.assertIn('neutral weights for instance %s (bad_request): the flavor name' % server['id'],
                      self.log())
        self.assertIsNone(self.stack.vm(server['id']))  # nothing reserved for it

    def test_a_candidate_host_the_allocator_does_not_know(self):
        servers = [self.boot('s%d' % i) for i in range(4)]
        for server in servers:
            outcome, host = self.decision_of(server['id'])
            # Either the allocator chose among the hosts it knows, or it refused the request
            # (neutral weights, logged); never a record on a host it does not know.
            if outcome == 'placed':
                self.assertIn(host, ('host1', 'host2'))
                self.assertEqual(host, self.node_of(server))
            else:
                self.assertIn('neutral weights for instance %s' % server['id'], self.log())
        report = self.reconcile_now()
        self.assertEqual(['host3'], report.hosts_added)
        self.assert_no_difference()

    def test_a_request_without_a_project_is_neutral_and_logged(self):
        host_manager = self.scheduler.manager.host_manager
        ours = next(w for w in host_manager.weighers if isinstance(w, weigher.LifetimeWeigher))
        ctxt = nova_context.get_admin_context()
        nodes = self.placement_reader().providers()
        spec = objects.RequestSpec(
            instance_uuid='00000000-0000-4000-8000-000000000057', project_id=None,
            flavor=objects.Flavor(name='m1.tiny', vcpus=1, memory_mb=512, root_gb=1,
                                  ephemeral_gb=0, swap=0, extra_specs={}),
            scheduler_hints={}, is_bfv=False, ignore_hosts=None)
        hosts = list(host_manager.get_host_states_by_uuids(ctxt, [n['uuid'] for n in nodes], spec))
        self.assertEqual(3, len(hosts))
        weights = ours.weigh_objects([nova_weights.WeighedHost(h, 0.0) for h in hosts], spec)
        self.assertEqual([0.0, 0.0, 0.0], weights)
        self.assertIn('(bad_request): the request has no project', self.log())
        self.assertEqual([], [h for h in self.control.hosts() if h['vms']])
