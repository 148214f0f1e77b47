"""weigher: Nova's RequestSpec objects in, the allocator's choice out as weights; neutral weights,
counted and logged, on every failure; the option group and its entry points."""

import unittest

import fixtures
from oslo_config import fixture as config_fixture
import testtools

from nova import objects
from nova.scheduler import weights as nova_weights

from lifetime_alloc_openstack import client, conf, weigher
from tests.unit.fakes import CAPACITY, FakeControl

objects.register_all()
UUID = '6f0c7f4e-8d8e-4a55-9d5c-2f5f3c1a0b11'


class HostState(object):
    def __init__(self, name, instances=None):
        self.host = name
        self.nodename = name
        self.instances = instances or {}


def request_spec(**over):
    fields = dict(
        instance_uuid=UUID, project_id='project1', user_id='user1', num_instances=1,
        flavor=objects.Flavor(name='m1.tiny', vcpus=1, memory_mb=512, root_gb=1, ephemeral_gb=0,
                              swap=0, extra_specs={}),
        image=objects.ImageMeta(properties=objects.ImageMetaProps(os_distro='ubuntu')),
        scheduler_hints={'lifetime': ['3600']}, is_bfv=False, ignore_hosts=None)
    fields.update(over)
    return objects.RequestSpec(**fields)


class Failing(object):
    zone = 'zone-1'

    def __init__(self, error):
        self.error = error

    def allocate(self, request):
        raise self.error


class WeigherTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = self.useFixture(config_fixture.Config(weigher.CONF))
        self.conf.config(control_url='http://127.0.0.1:9', group='lifetime_alloc')
        weigher.reset_counters()
        self.log = self.useFixture(fixtures.FakeLogger(name='lifetime_alloc_openstack'))
        self.control = FakeControl({'host1': CAPACITY, 'host2': CAPACITY, 'host3': CAPACITY})
        self.weigher = weigher.LifetimeWeigher()
        self.weigher.client = lambda: self.control
        self.hosts = [HostState('host3'), HostState('host2'), HostState('host1')]

    def weigh(self, spec, hosts=None):
        objs = [nova_weights.WeighedHost(h, 0.0) for h in (hosts or self.hosts)]
        return self.weigher.weigh_objects(objs, spec)

    def test_the_allocators_choice_weighs_one(self):
        self.assertEqual(self.weigh(request_spec()), [0.0, 0.0, 1.0])
        request = self.control.vms[UUID]['request']
        self.assertEqual(request['candidates'], ['host3', 'host2', 'host1'])
        self.assertEqual(request['features']['lifetime'], 3600.0)
        self.assertEqual(request['demand'], {'cores': 1.0, 'memory_gib': 0.5, 'ssd_gib': 1.0})
        self.assertEqual(weigher.COUNTERS['placed'], 1)
        self.assertEqual(self.weigher.weight_multiplier(self.hosts[0]), 1000.0)

    def test_failures_are_neutral_and_counted(self):
        for error, outcome in [(client.Unreachable('x'), 'unreachable'),
                               (client.Timeout('x'), 'timeout'),
                               (client.Refused('x', 422), 'refused'),
                               (client.ServerError('x', 502), 'server_error'),
                               (RuntimeError('bug'), 'internal')]:
            self.weigher.client = lambda: Failing(error)
            self.assertEqual(self.weigh(request_spec()), [0.0, 0.0, 0.0])
            self.assertEqual(weigher.COUNTERS[outcome], 1, outcome)
            self.assertIn('neutral weights for instance %s (%s)' % (UUID, outcome), self.log.output)

    def test_a_rejection_is_neutral(self):
        self.control.allocate = lambda request: {
            'status': 'rejected', 'rejection': {'code': 'no_feasible_host', 'detail': 'no host can take it'}}
        self.assertEqual(self.weigh(request_spec()), [0.0, 0.0, 0.0])
        self.assertEqual(weigher.COUNTERS['rejected'], 1)
        self.assertIn('(rejected): the allocator rejected it: no host can take it', self.log.output)

    def test_a_choice_outside_the_candidates_is_neutral(self):
        self.control.vms[UUID] = {'host_id': 'host9', 'request': {}, 'placed_at_s': 0}
        self.assertEqual(self.weigh(request_spec()), [0.0, 0.0, 0.0])
        self.assertEqual(weigher.COUNTERS['not_candidate'], 1)

    def test_moves_and_unreadable_requests_are_neutral_without_a_call(self):
        self.weigh(request_spec(scheduler_hints={'_nova_check_type': ['rebuild']}))
        self.weigh(request_spec(ignore_hosts=['host4']))
        self.weigh(request_spec(), [HostState('host1', {UUID: object()}), HostState('host2')])
        self.weigh(request_spec(project_id=None))
        self.weigh(request_spec(), [HostState('bad host'), HostState('also bad')])
        self.assertEqual(weigher.COUNTERS['move'], 3)
        self.assertEqual(weigher.COUNTERS['bad_request'], 2)
        self.assertEqual(self.control.calls, [])

    def test_without_a_control_url_it_is_neutral(self):
        self.conf.config(control_url=None, group='lifetime_alloc')
        self.assertIsNone(weigher.LifetimeWeigher().client())
        plain = weigher.LifetimeWeigher()
        objs = [nova_weights.WeighedHost(h, 0.0) for h in self.hosts]
        self.assertEqual(plain.weigh_objects(objs, request_spec()), [0.0, 0.0, 0.0])
        self.assertEqual(weigher.COUNTERS['not_configured'], 1)

    def test_the_client_follows_the_options(self):
        plain = weigher.LifetimeWeigher()
        first = plain.client()
        self.assertIs(plain.client(), first)
        self.conf.config(timeout=0.1, group='lifetime_alloc')
        self.assertIsNot(plain.client(), first)
        self.assertEqual(plain.client().timeout, 0.1)

    def test_nova_computes_the_resources(self):
        spec = request_spec(is_bfv=True)
        self.assertEqual(weigher._nova_resources(spec), {'VCPU': 1, 'MEMORY_MB': 512})


class ConfTest(unittest.TestCase):

    def test_the_option_group_lists_every_option(self):
        [(group, opts)] = conf.list_opts()
        self.assertEqual(group.name, 'lifetime_alloc')
        names = {o.name for o in opts}
        self.assertTrue({'control_url', 'token', 'timeout', 'zone', 'weight_multiplier',
                         'reconcile_interval', 'reservation_grace'} <= names)
        self.assertTrue(next(o for o in opts if o.name == 'token').secret)

    def test_the_entry_points_are_installed(self):
        from importlib import metadata
        eps = metadata.entry_points()
        scripts = {ep.name: ep.value for ep in eps.select(group='console_scripts')}
        self.assertEqual(scripts.get('lifetime-alloc-nova-listener'), 'lifetime_alloc_openstack.listener:main')
        self.assertEqual(scripts.get('lifetime-alloc-nova-reconcile'), 'lifetime_alloc_openstack.reconcile:main')
        opts = {ep.name: ep.value for ep in eps.select(group='oslo.config.opts')}
        self.assertEqual(opts.get('lifetime_alloc'), 'lifetime_alloc_openstack.conf:list_opts')


if __name__ == '__main__':
    unittest.main()
