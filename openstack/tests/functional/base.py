"""The test base: Nova's functional harness (its real API, conductor, scheduler and Placement,
computes on the fake driver, sqlite) configured only through nova.conf options to weigh with
``LifetimeWeigher``, Nova's versioned notifications sent for real on its oslo.messaging
transport to the plug-in's listener service, and the project's three binaries (:mod:`stack`).

Every compute node of the fake driver is 8 cores (2 VCPU x 4.0), 7.5 GiB (8192 MB less 512
reserved) and 1028 GB of disk in Placement.
"""

import time
import warnings

import oslo_messaging
from oslo_config import cfg

from nova import rpc
from nova.tests.functional import integrated_helpers

from lifetime_alloc_openstack import client as client_mod
from lifetime_alloc_openstack import conf as conf_mod
from lifetime_alloc_openstack import listener as listener_mod
from lifetime_alloc_openstack import reconcile
from lifetime_alloc_openstack import weigher
from tests.functional import stack as stack_mod

WEIGHER = 'lifetime_alloc_openstack.weigher.LifetimeWeigher'
# Nova's stock flavors of the harness: id -> (vcpus, memory_mb, disk_gb).
FLAVORS = {'1': (1, 512, 1), '2': (1, 2048, 20), '3': (2, 4096, 40)}


class NovaTestBase(integrated_helpers._IntegratedTestBase):
    compute_driver = 'fake.MediumFakeDriver'
    ADMIN_API = True
    microversion = 'latest'
    # The compute nodes started with the harness, and the allocator's initial inventory.
    HOSTS = ('host1', 'host2', 'host3')
    # The hosts the allocator's configuration holds at start (None: the HOSTS; (): none, the
    # reconciliation at the listener's start adds them from Placement, as in production).
    INVENTORY = None
    TIMEOUT = 0.5
    # The allocator's clock: 'request' for a trace replay (the hints' requested_at_s).
    CLOCK = 'wall'

    def setUp(self):
        self.stack = stack_mod.Stack(self.HOSTS if self.INVENTORY is None else self.INVENTORY,
                                     clock=self.CLOCK)
        self.useFixture(self.stack)
        # nova.conf of the scheduler: only options, as an operator writes them.
        self.flags(weight_classes=['nova.scheduler.weights.all_weighers', WEIGHER],
                   group='filter_scheduler')
        self.flags(control_url=self.stack.control_url, token=stack_mod.OPERATOR_KEY,
                   zone=stack_mod.ZONE, timeout=self.TIMEOUT,
                   send_candidates=self.stack.supports('candidates'), group='lifetime_alloc')
        self.flags(cores=-1, instances=-1, ram=-1, group='quota')
        weigher.reset_counters()
        super().setUp()
        # Nova's harness turns SQLAlchemy's deprecation warnings raised in nova into errors; the
        # pinned set's SQLAlchemy 2.1 deprecates noload(), which nova 34 still calls when it
        # resizes a server or buries one no host could take: only a warning outside the harness.
        from sqlalchemy import exc as sqla_exc
        warnings.filterwarnings('ignore', message=r'The noload\(\) option is deprecated',
                                category=sqla_exc.SADeprecationWarning)
        # Nova's own messaging notifier on its transport instead of the harness's capturing one.
        self.stub_out('nova.rpc.NOTIFIER', self._notifier('messaging'))
        self.listener_conf = self._listener_conf()
        self.service = None
        self.start_listener()
        if self.INVENTORY == ():
            report = self.reconcile_now()  # as the listener service does when it starts
            self.assertEqual(sorted(self.HOSTS), report.hosts_added, report.as_dict())
        self.control = client_mod.ControlClient(self.stack.control_url, stack_mod.OPERATOR_KEY,
                                                timeout=10.0, zone=stack_mod.ZONE)
        self.addCleanup(self.control.close)

    def _notifier(self, driver):
        return oslo_messaging.Notifier(rpc.NOTIFICATION_TRANSPORT, publisher_id='nova',
                                       driver=driver, topics=['versioned_notifications'])

    def _setup_compute_service(self):
        self.computes = {}
        for name in self.HOSTS:
            self.computes[name] = self._start_compute(name)
        return self.computes[self.HOSTS[0]]

    def _listener_conf(self):
        """The listener's nova.conf: ``[lifetime_alloc]`` and Nova's ``[placement]``
        (keystoneauth; here the harness's Placement with its admin token)."""
        conf = cfg.ConfigOpts()
        conf_mod.register_opts(conf)
        reconcile.register_placement_opts(conf)
        conf([], project='nova')
        conf.set_override('control_url', self.stack.control_url, 'lifetime_alloc')
        conf.set_override('token', stack_mod.OPERATOR_KEY, 'lifetime_alloc')
        conf.set_override('zone', stack_mod.ZONE, 'lifetime_alloc')
        conf.set_override('timeout', 5.0, 'lifetime_alloc')
        # Reconciliations only when a test asks for one.
        conf.set_override('reconcile_interval', 0.0, 'lifetime_alloc')
        conf.set_override('reconcile_after_error', 3600.0, 'lifetime_alloc')
        conf.set_override('reservation_grace', 0.0, 'lifetime_alloc')
        # On the request clock, the servers' wall-clock launch and end times would move it.
        conf.set_override('send_event_times', self.CLOCK == 'wall', 'lifetime_alloc')
        conf.set_override('auth_type', 'admin_token', 'placement')
        from keystoneauth1 import loading as ks_loading
        conf.register_opts(ks_loading.get_auth_plugin_conf_options('admin_token'), group='placement')
        conf.set_override('endpoint', self.placement_fixture.endpoint, 'placement')
        conf.set_override('token', self.placement_fixture.token, 'placement')
        return conf

    # The listener service, as lifetime-alloc-nova-listener runs it.
    def start_listener(self):
        self.service = listener_mod.ListenerService(self.listener_conf, rpc.NOTIFICATION_TRANSPORT,
                                                    reconcile=False)
        self.service.start()
        self.addCleanup(self.stop_listener)

    def stop_listener(self):
        if self.service is not None:
            self.service.stop()
            self.service = None

    def wait_for_listener(self, outcome, count, within_s=10.0):
        """Waits until the listener has counted ``count`` events with ``outcome``."""
        deadline = time.monotonic() + within_s
        while self.service.endpoint.counters[outcome] < count:
            if time.monotonic() > deadline:
                self.fail('the listener counted %s, not %d %s' % (
                    dict(self.service.endpoint.counters), count, outcome))
            time.sleep(0.05)

    def reconcile_now(self):
        return self.service.reconcile_now()

    # Reads of both sides.
    def placement_reader(self):
        return reconcile.PlacementReader.from_conf(self.listener_conf)

    def differences(self):
        want, _ = reconcile.read_placement(self.placement_reader())
        return reconcile.differences(want, reconcile.read_allocator(self.control))

    def assert_no_difference(self, within_s=10.0):
        """Placement's allocations and the allocator's hosts, VMs and used resources are equal
        (the listener applies notifications asynchronously: it is given ``within_s``)."""
        deadline = time.monotonic() + within_s
        while True:
            diffs = self.differences()
            if not diffs or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual([], diffs)

    # Servers.
    def boot(self, name, flavor_id='1', hints=None, metadata=None, wait=True):
        server = self._build_server(name=name, flavor_id=flavor_id, networks='none')
        if metadata:
            server['metadata'] = metadata
        body = {'server': server}
        if hints:
            body['os:scheduler_hints'] = hints
        created = self.api.post_server(body)
        if wait:
            created = self.wait_for_status(created, 'ACTIVE')
        return created

    def wait_for_status(self, server, status, within_s=30.0):
        """Polls the server every 50 ms (the harness's helper sleeps 0.5 s) until ``status``;
        fails on ERROR (with the fault) or after ``within_s``."""
        deadline = time.monotonic() + within_s
        while True:
            server = self.admin_api.get_server(server['id'])
            if server['status'] == status:
                return server
            if server['status'] == 'ERROR':
                self.fail('server %s went to ERROR: %s' % (server['id'], server.get('fault')))
            if time.monotonic() > deadline:
                self.fail('server %s is %s after %.0f s' % (server['id'], server['status'], within_s))
            time.sleep(0.05)

    def delete(self, server):
        self.admin_api.delete_server(server['id'])
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            try:
                self.admin_api.get_server(server['id'])
            except Exception:  # OpenStackApiNotFoundException
                return
            time.sleep(0.05)
        self.fail('server %s not deleted within 30 s' % server['id'])

    def flavor(self, name, vcpus, ram_mb, disk_gb=1):
        """The id of a flavor of this shape named ``name`` (created once)."""
        flavors = getattr(self, '_flavors', None)
        if flavors is None:
            flavors = self._flavors = {}
        key = (name, vcpus, ram_mb, disk_gb)
        if key not in flavors:
            body = {'flavor': {'name': name, 'vcpus': vcpus, 'ram': ram_mb, 'disk': disk_gb}}
            flavors[key] = self.admin_api.post_flavor(body)['id']
        return flavors[key]

    def node_of(self, server):
        return server['OS-EXT-SRV-ATTR:hypervisor_hostname']

    def decision_of(self, vm_id):
        """The weigher's last outcome for the instance: (outcome, chosen host), or None."""
        for uuid, outcome, host, _ in reversed(weigher.RECENT):
            if uuid == vm_id:
                return outcome, host
        return None

    def disable_compute(self, host):
        services = self.admin_api.api_get('/os-services?binary=nova-compute').body['services']
        service = next(s for s in services if s['host'] == host)
        self.admin_api.api_put('/os-services/%s' % service['id'],
                               {'status': 'disabled', 'disabled_reason': 'test'})
