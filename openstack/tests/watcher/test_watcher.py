"""The ``lifetime_consolidation`` strategy end to end in Watcher's own functional harness: Watcher's
API, decision engine and applier (python-watcher 17.0.0) against its emulated Nova and Placement,
with the allocator as the real binary of target/release. An audit asks the allocator for a round
and turns its migrations into an action plan; the applier carries it out in the emulated cloud,
and Watcher's action notifications reach the allocator through the listener's endpoint
(:class:`lifetime_alloc_openstack.consolidation.MigrationOutcomes`), so the allocator's record and
the cloud agree.
"""

import os
import shutil
import tempfile
import time

import fixtures
import oslo_messaging
import requests
from oslo_config import cfg

from watcher.common import rpc
from watcher.tests.functional import base
from watcher.tests.functional import topology

from lifetime_alloc_openstack import consolidation
from lifetime_alloc_openstack import watcher_strategy
from tests.functional import stack

CONF = cfg.CONF
ADMIN_TOKEN = 'watcher-test-admin-token'
STRATEGY_GROUP = 'watcher_strategies.lifetime_consolidation'
# Two hosts of one VM each (the ones worth emptying) and two fuller ones; every VM 2 vCPUs, 4 GiB.
NODE = {'vcpus': 16, 'memory': 32768, 'disk': 500}
TOPOLOGY = (
    topology.ComputeTopology()
    .add_computes(count=4, **NODE)
    .add_instances(computes=['compute-1', 'compute-2'], count=1, vcpus=2, memory=4096, disk=20)
    .add_instances(computes=['compute-3', 'compute-4'], count=3, vcpus=2, memory=4096, disk=20)
)


class Allocator(fixtures.Fixture):
    """The allocator binary alone, on the topology's compute nodes, with an admin token and the
    service token of :mod:`tests.functional.stack`, consolidation on from its config (rounds only
    when asked, a budget that fills in a second)."""

    def __init__(self, nodes, chooser):
        super().__init__()
        self.nodes, self.chooser = nodes, chooser

    def _setUp(self):
        binary = os.path.join(stack.bin_dir(), 'allocator')
        if not os.access(binary, os.X_OK):
            raise RuntimeError('%s is missing: build it with `cargo build --release --bins`' % binary)
        self.dir = tempfile.mkdtemp(prefix='lifetime-alloc-watcher-')
        self.addCleanup(shutil.rmtree, self.dir, True)
        capacity = {'cores': float(NODE['vcpus']), 'memory_gib': NODE['memory'] / 1024.0,
                    'ssd_gib': float(NODE['disk'])}
        inventory = os.path.join(self.dir, 'inventory.toml')
        with open(inventory, 'w') as f:
            f.write(stack.inventory_toml([n.hostname for n in self.nodes], capacity))
        port = stack.free_port()
        config = os.path.join(self.dir, 'allocator.toml')
        with open(config, 'w') as f:
            f.write('listen = "127.0.0.1:%d"\nstore = "%s"\ninventory_file = "%s"\nadmin_token = "%s"\n'
                    '[allocator]\ntie_break = "lowest-index"\n'
                    '[consolidation]\nbudget_per_host_day = 86400\nchooser = "%s"\nevery_s = 1000000\n'
                    % (port, os.path.join(self.dir, 'allocator.db'), inventory, ADMIN_TOKEN, self.chooser))
        env = {k: v for k, v in os.environ.items() if not k.startswith('ALLOCATOR_') and not k.startswith('http')}
        env.update({'RUST_LOG': 'warn', 'NO_COLOR': '1', 'ALLOCATOR_SERVICE_TOKEN': stack.SERVICE_TOKEN})
        self.service = stack.Service('allocator', binary, config, port, os.path.join(self.dir, 'allocator.log'),
                                     env)
        self.addCleanup(self.service.stop, kill=True)
        self.service.start()
        self.url = self.service.url
        self.data = requests.Session()
        self.data.headers['Authorization'] = 'Bearer ' + stack.SERVICE_TOKEN
        self.addCleanup(self.data.close)
        self.admin = consolidation.AllocatorAdmin(self.url, ADMIN_TOKEN)

    def record(self, instance):
        """The allocator learns that ``instance`` is on its host (what the Nova listener or the
        reconciliation from Placement tells it in a real cloud)."""
        request = {'vm_id': instance.uuid, 'tenant_id': instance.project_id, 'vm_type': 'flavor-2',
                   'demand': {'cores': float(instance.vcpus), 'memory_gib': instance.memory / 1024.0,
                              'ssd_gib': float(instance.disk)}}
        answer = self.data.put('%s/v1/allocations/%s' % (self.url, instance.uuid),
                               json={'host_id': instance.host, 'request': request}, timeout=10)
        assert answer.status_code == 200, answer.text

    def host_of(self, vm_id):
        answer = self.data.get('%s/v1/allocations/%s' % (self.url, vm_id), timeout=10)
        assert answer.status_code == 200, answer.text
        return answer.json()['host_id']

    def host_state(self, host_id):
        answer = self.data.get('%s/v1/hosts/%s' % (self.url, host_id), timeout=10)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        return body.get('host', body)['state']


class TestLifetimeConsolidation(base.WatcherFunctionalTestCase):

    COMPUTE_TOPOLOGY = topology.ComputeTopology()
    CHOOSER = 'fewest-vms'

    def setUp(self):
        super().setUp()
        self.flags(migration_max_retries=5, group='nova')
        self.flags(migration_interval=0.1, group='nova')
        self.load_topology(TOPOLOGY)
        self.allocator = self.useFixture(Allocator(TOPOLOGY.compute_nodes, self.CHOOSER))
        for instance in TOPOLOGY.instances:
            self.allocator.record(instance)
        # The strategy's section of watcher.conf.
        CONF.register_opts(watcher_strategy.LifetimeConsolidation.get_config_opts(), group=STRATEGY_GROUP)
        self.flags(allocator_url=self.allocator.url, admin_token=ADMIN_TOKEN, group=STRATEGY_GROUP)
        # Watcher's action notifications on the harness's in-memory transport, as
        # `[oslo_messaging_notifications] driver = messagingv2` sends them, read by the listener's
        # endpoint.
        notifier = oslo_messaging.Notifier(rpc.NOTIFICATION_TRANSPORT, serializer=rpc.NOTIFIER._serializer,
                                           driver='messagingv2', topics=['watcher_notifications'])
        self.useFixture(fixtures.MockPatchObject(rpc, 'NOTIFIER', notifier))
        self.outcomes = consolidation.MigrationOutcomes(self.allocator.admin)
        listener = consolidation.outcomes_listener(rpc.NOTIFICATION_TRANSPORT, self.outcomes)
        listener.start()
        self.addCleanup(listener.wait)
        self.addCleanup(listener.stop)
        # The budget accrues from the allocator's start: a round would start a host once it holds
        # that host's migrations.
        self._wait(lambda: self.allocator.admin.plan(), 'the budget to fill')

    def _wait(self, condition, what, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.05)
        self.fail('timed out waiting for %s' % what)

    def _audit(self, parameters):
        answer = self.admin_api.post('/audits', {'audit_type': 'ONESHOT', 'goal': 'server_consolidation',
                                                 'strategy': 'lifetime_consolidation', 'parameters': parameters})
        return answer

    def _plan(self, parameters):
        """An audit's action plan: its uuid and migrate actions."""
        answer = self._audit(parameters)
        self.assertEqual(201, answer.status_code, answer.text)
        audit = answer.json()['uuid']
        self._wait_for_audit_state(audit, 'SUCCEEDED')
        plans = self.admin_api.get('/action_plans?audit_uuid=%s' % audit).json()['action_plans']
        self.assertEqual(1, len(plans))
        actions = self.admin_api.get('/actions?action_plan_uuid=%s' % plans[0]['uuid']).json()['actions']
        details = [self.admin_api.get('/actions/%s' % a['uuid']).json() for a in actions]
        return plans[0]['uuid'], [a for a in details if a['action_type'] == 'migrate']

    def _start(self, plan):
        answer = self.admin_api.post('/action_plans/%s/start' % plan, {})
        self.assertIn(answer.status_code, (200, 202), answer.text)

    def _cloud_host(self, vm_id):
        return self.env.nova_fixture.nova_emulator.servers[vm_id]['OS-EXT-SRV-ATTR:host']

    def _differences(self):
        """Every VM whose host the allocator and the emulated cloud see differently."""
        return ['%s: allocator %s, cloud %s' % (i.uuid, self.allocator.host_of(i.uuid), self._cloud_host(i.uuid))
                for i in TOPOLOGY.instances if self.allocator.host_of(i.uuid) != self._cloud_host(i.uuid)]

    def test_an_audit_plans_the_allocators_migrations_and_the_applier_empties_its_hosts(self):
        plan, migrations = self._plan({'budget_per_host_day': 1000, 'chooser': self.CHOOSER, 'max_in_flight': 'auto'})
        report = self.allocator.admin.report()
        emptying = [h['host'] for h in report['hosts']]
        self.assertTrue(emptying, 'the allocator started a host: %s' % report)
        # One live migrate action per migration the allocator has in flight, to its target.
        planned = {(m['vm_id'], m['source'], m['target']) for m in report['in_flight']}
        acted = {(a['input_parameters']['resource_id'], a['input_parameters']['source_node'],
                  a['input_parameters']['destination_node']) for a in migrations}
        self.assertEqual(planned, acted)
        self.assertTrue(all(a['input_parameters']['migration_type'] == 'live' for a in migrations))
        for host in emptying:
            self.assertEqual('unavailable', self.allocator.host_state(host), 'out of scheduling while emptied')

        self._start(plan)
        self._wait_for_action_plan_state(plan, 'SUCCEEDED')
        self._wait(lambda: not (self.allocator.admin.report() or {}).get('in_flight'), 'the migrations to complete')
        for host in emptying:
            self.assertEqual([], [i.uuid for i in TOPOLOGY.instances if self._cloud_host(i.uuid) == host],
                             '%s is empty in the cloud' % host)
            self.assertEqual('available', self.allocator.host_state(host), 'back in service once empty')
        self.assertEqual([], self._differences())
        counters = self.allocator.admin.report()['counters']
        self.assertEqual(counters['migrations_completed'], len(migrations))
        self.assertEqual(counters['hosts_emptied'], len(emptying))
        self.assertEqual(self.outcomes.counters['completed'], len(migrations))

    def test_a_migration_the_applier_fails_is_given_back_and_its_host_returns_to_service(self):
        emulator = self.env.nova_fixture.nova_emulator
        self.useFixture(fixtures.MockPatchObject(emulator, '_move_server', lambda *args: None))
        plan, migrations = self._plan({'budget_per_host_day': 1000, 'chooser': self.CHOOSER, 'max_in_flight': 1})
        self.assertEqual(1, len(migrations))
        source = migrations[0]['input_parameters']['source_node']
        self._start(plan)
        self._wait_for_state_in(plan, ('FAILED', 'SUCCEEDED'))
        self._wait(lambda: self.outcomes.counters['failed'] == 1, 'the failure to reach the allocator')
        report = self.allocator.admin.report()
        # The failed VM's reservation is given back (the allocator may have started another
        # host's migration since, for the next audit), and its host is back in service.
        failed = migrations[0]['input_parameters']['resource_id']
        self.assertNotIn(failed, [m['vm_id'] for m in report['in_flight']])
        self.assertNotIn(source, [h['host'] for h in report['hosts']])
        self.assertEqual(1, report['counters']['migrations_failed'])
        self.assertEqual('available', self.allocator.host_state(source))
        self.assertEqual(source, self.allocator.host_of(failed))
        self.assertEqual([], self._differences())

    def _wait_for_state_in(self, plan, states):
        self._wait(lambda: self.admin_api.get('/action_plans/%s' % plan).json()['state'] in states,
                   'the action plan to end')

    def test_an_audit_with_bad_parameters_is_refused_with_the_reason(self):
        for parameters, says in [({'chooser': 'best'}, 'best'), ({'max_in_flight': 0}, 'max_in_flight'),
                                 ({'budget_per_host_day': -1}, 'budget_per_host_day'), ({'speed': 2}, 'speed')]:
            answer = self._audit(parameters)
            self.assertEqual(400, answer.status_code, (parameters, answer.text))
            self.assertIn(says, answer.text, parameters)
        self.assertEqual(0, self.allocator.admin.report()['counters']['rounds'], 'a refused audit changes nothing')
