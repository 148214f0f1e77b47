"""The project's three services as a test fixture: the real binaries of ``target/release``
(``LIFETIME_ALLOC_BIN_DIR``), each on a free loopback port with a config written into a temporary
directory, the allocator on a fresh SQLite store, all holding one service token, the control
service with one operator key (which the plug-in sends as its ``[lifetime_alloc] token``).

As ``test-support/src/stack.rs`` starts them for the Rust tests: the inference server on a copy of
the repository's default bundle (``models/default``), the allocator on an inventory of hosts named
like the harness's compute nodes, the control service in front of both. Stopped (SIGTERM, then
SIGKILL) and removed at cleanup; their logs are attached to a failing test's details.
"""

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import fixtures
import requests
from testtools import content

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))
SERVICE_TOKEN = 'openstack-test-service-token'
OPERATOR_KEY = 'openstack-test-operator-key'
ZONE = 'zone-1'
# A compute node of the harness's fake driver, as Placement sees it: VCPU 2 x 4.0, MEMORY_MB 8192
# less 512 reserved, DISK_GB 1028.
FAKE_NODE = {'cores': 8.0, 'memory_gib': 7.5, 'ssd_gib': 1028.0}
READY_WITHIN_S = 60.0


def bin_dir():
    return os.environ.get('LIFETIME_ALLOC_BIN_DIR') or os.path.join(REPO, 'target', 'release')


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _toml_number(value):
    return repr(float(value))


def inventory_toml(hosts, capacity=FAKE_NODE, zone=ZONE):
    """An allocator inventory of ``hosts`` (names) of ``capacity`` in one cluster and rack; with
    no host, a zone without clusters (hosts come from the reconciliation)."""
    if not hosts:
        return '[[zones]]\nid = "%s"\nclusters = []\n' % zone
    cap = ', '.join('%s = %s' % (k, _toml_number(v)) for k, v in sorted(capacity.items()))
    entries = ', '.join('{ id = "%s" }' % h for h in hosts)
    return ('[[zones]]\nid = "%s"\n\n[[zones.clusters]]\nid = "nova"\nhardware = "fake"\n'
            'host_capacity = { %s }\n\n[[zones.clusters.racks]]\nid = "rack-1"\nhosts = [%s]\n'
            % (zone, cap, entries))


class Service(object):
    """One running binary: its process, port, config and log file."""

    def __init__(self, name, binary, config_path, port, log_path, env):
        self.name, self.binary, self.config_path = name, binary, config_path
        self.port, self.log_path, self.env = port, log_path, env
        self.process = None

    @property
    def url(self):
        return 'http://127.0.0.1:%d' % self.port

    def start(self):
        log = open(self.log_path, 'ab')
        try:
            self.process = subprocess.Popen(
                [self.binary, '--config', self.config_path], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=os.path.dirname(self.config_path))
        finally:
            log.close()
        deadline = time.monotonic() + READY_WITHIN_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError('%s exited at start (%s); its log:\n%s'
                                   % (self.name, self.process.returncode, self.log()[-3000:]))
            try:
                if requests.get(self.url + '/readyz', timeout=1.0).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError('%s not ready within %.0f s; its log:\n%s'
                           % (self.name, READY_WITHIN_S, self.log()[-3000:]))

    def stop(self, kill=False):
        if self.process is None or self.process.poll() is not None:
            self.process = None
            return
        self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def log(self):
        try:
            with open(self.log_path, errors='replace') as f:
                return f.read()
        except OSError:
            return ''


class Stack(fixtures.Fixture):
    """inference-server, allocator and control-service; ``hosts`` are the allocator's initial
    inventory (empty: none, for an inventory built by the reconciliation alone).
    ``policy`` is the allocator's ``[allocator.policy]`` TOML body; ``bundle`` the model bundle
    the inference server and the allocator read (the repository's default bundle when None);
    ``admin_token`` the allocator's admin token and ``consolidation`` its ``[consolidation]`` TOML
    body (none: no admin routes, no consolidation)."""

    def __init__(self, hosts, capacity=FAKE_NODE, policy=None, inference_timeout_ms=50,
                 clock='wall', bundle=None, admin_token=None, consolidation=None):
        super().__init__()
        self.clock = clock
        self.bundle = bundle or os.path.join(REPO, 'models', 'default')
        self.admin_token = admin_token
        self.consolidation = consolidation
        self.hosts = list(hosts) if hosts is not None else None
        self.capacity = capacity
        self.policy = policy or ('kind = "nilas"\nbuckets = "exact"\nlong_threshold_s = 7200.0\n'
                                 'prefer_non_empty = true\nexit_floor_s = 28800.0\n')
        self.inference_timeout_ms = inference_timeout_ms

    def _setUp(self):
        directory = bin_dir()
        for name in ('inference-server', 'allocator', 'control-service'):
            if not os.access(os.path.join(directory, name), os.X_OK):
                raise RuntimeError('%s is missing from %s: build it with `cargo build --release '
                                   '--bins` (or set LIFETIME_ALLOC_BIN_DIR)' % (name, directory))
        self.dir = tempfile.mkdtemp(prefix='lifetime-alloc-openstack-')
        self.addCleanup(shutil.rmtree, self.dir, True)
        models = os.path.join(self.dir, 'models')
        shutil.copytree(self.bundle, os.path.join(models, 'default'))
        env = {k: v for k, v in os.environ.items()
               if not k.endswith('_SERVICE_TOKEN') and not k.endswith('_SERVICE_TOKEN_FILE')
               and not k.endswith('_ADMIN_TOKEN') and not k.startswith('http')}
        env.update({'RUST_LOG': 'warn', 'NO_COLOR': '1', 'ALLOCATOR_SERVICE_TOKEN': SERVICE_TOKEN,
                    'INFERENCE_SERVICE_TOKEN': SERVICE_TOKEN,
                    'CONTROL_ALLOCATOR_SERVICE_TOKEN': SERVICE_TOKEN,
                    'CONTROL_INFERENCE_SERVICE_TOKEN': SERVICE_TOKEN})
        self.services = {}

        def service(name, config):
            port = free_port()
            path = os.path.join(self.dir, '%s.toml' % name)
            with open(path, 'w') as f:
                f.write('listen = "127.0.0.1:%d"\n%s' % (port, config))
            svc = Service(name, os.path.join(directory, name), path, port,
                          os.path.join(self.dir, '%s.log' % name), env)
            self.services[name] = svc
            self.addCleanup(svc.stop, kill=True)  # a throwaway store: no graceful stop needed
            self.addDetail('%s.log' % name, content.Content(
                content.UTF8_TEXT, lambda: [svc.log().encode()]))
            svc.start()
            return svc

        inference = service('inference-server', 'models_dir = "%s"\nwatch_interval_ms = 1000\n'
                                                'runtime_threads = 1\n' % models)
        with open(os.path.join(self.dir, 'inventory.toml'), 'w') as f:
            f.write(inventory_toml(self.hosts or [], self.capacity))
        allocator = service('allocator', (
            'clock = "%s"\nstore = "%s"\nmodels_dir = "%s"\ninventory_file = "%s"\n%s'
            '[allocator]\ntie_break = "lowest-index"\nseed = 42\n[allocator.policy]\n%s%s'
            % (self.clock, os.path.join(self.dir, 'allocator.db'), models,
               os.path.join(self.dir, 'inventory.toml'),
               'admin_token = "%s"\n' % self.admin_token if self.admin_token else '', self.policy,
               '[consolidation]\n%s' % self.consolidation if self.consolidation else '')))
        self.allocator_url = allocator.url
        digest = hashlib.sha256(OPERATOR_KEY.encode()).hexdigest()
        service('control-service', (
            'default_zone = "%s"\nruntime_threads = 1\n[zones.%s]\nallocator = "%s"\n'
            '[inference]\nservers = ["%s"]\ntimeout_ms = %d\nhealth_interval_ms = 200\n'
            '[allocator]\nhealth_interval_ms = 200\n'
            '[auth]\nmode = "keys"\n[[auth.keys]]\nadmin = true\nname = "nova"\nsha256 = "%s"\n'
            % (ZONE, ZONE, allocator.url, inference.url, self.inference_timeout_ms, digest)))
        self.session = requests.Session()
        self.addCleanup(self.session.close)
        self.session.headers['Authorization'] = 'Bearer ' + OPERATOR_KEY

    def supports(self, feature):
        """Whether the control service serves issue 57's additions, read off its OpenAPI
        document: ``candidates`` (the VM request's field), ``record`` (``PUT
        /v1/allocate/{vm_id}``), ``hosts`` (``PUT /v1/zones/{zone}/hosts/{host_id}``)."""
        if not hasattr(self, '_openapi'):
            self._openapi = self.session.get(self.control_url + '/openapi.json', timeout=10).json()
        doc = self._openapi
        paths = doc.get('paths', {})
        if feature == 'candidates':
            return '"candidates"' in json.dumps(doc.get('components', {}))
        if feature == 'record':
            return 'put' in paths.get('/v1/allocate/{vm_id}', {})
        if feature == 'hosts':
            return any('put' in ops for path, ops in paths.items()
                       if path.startswith('/v1/zones/{zone}/hosts/'))
        raise ValueError(feature)

    @property
    def control_url(self):
        return self.services['control-service'].url

    def kill(self, name):
        """SIGKILL of one service (a fault); :meth:`restart` brings it back on its port."""
        self.services[name].stop(kill=True)

    def restart(self, name):
        self.services[name].stop()
        self.services[name].start()

    # Reads through the control service, as an operator.
    def get(self, path, **params):
        response = self.session.get(self.control_url + path, params=params, timeout=10)
        response.raise_for_status()
        return response.json()

    def stats(self):
        return self.get('/v1/stats')

    def vm(self, vm_id):
        response = self.session.get(self.control_url + '/v1/allocate/%s' % vm_id,
                                    params={'zone': ZONE}, timeout=10)
        return response.json() if response.status_code == 200 else None
