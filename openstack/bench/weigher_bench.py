"""What LifetimeWeigher adds to one scheduling decision in Nova (issue 57, "Speed").

Nova's own weighing path (``HostWeightHandler().get_weighed_objects`` with the weighers Nova loads
from ``[filter_scheduler] weight_classes``, as ``HostManager`` does) over Nova's own ``HostState``
objects (updated from ``ComputeNode`` objects, as the scheduler's host manager does) and real
``RequestSpec`` objects (``RequestSpec.from_components``, as the conductor builds them), twice per
decision and interleaved (ABBA): once with the stock weighers only (the reference), once with the
stock weighers and ``LifetimeWeigher`` talking to the project's three real binaries (the stack of
the functional tests: ``openstack/tests/functional/stack.py``), whose allocator holds the 500
candidate hosts. 20 and 500 candidates, prediction cache hit (the same request facts every time)
and miss (a new flavor name per decision, which is part of the control service's cache key).

Every decision is a new instance uuid; the allocator's reservation is released after it (outside
the timed part), so the hosts never fill. Prints p50/p99 per row and what the plug-in adds; proves
hit and miss from the control service's ``/v1/stats`` cache counters; asserts nothing about time.

    target/openstack/nova-venv/bin/python openstack/bench/weigher_bench.py [--decisions 500]

``--profile`` adds a cProfile pass of the plug-in's side (500 candidates, cache hit).
"""

# As nova-scheduler starts (nova/cmd/scheduler.py): native threads, no eventlet.
from nova import monkey_patch; monkey_patch.patch(backend='threading')  # noqa: E702,I100

import argparse
import collections
import cProfile
import datetime
import io
import json
import math
import os
import platform
import pstats
import random
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # openstack/: the package
# Another copy of the package (e.g. an older commit's, for a before/after comparison).
if os.environ.get('LIFETIME_ALLOC_PACKAGE_DIR'):
    sys.path.insert(0, os.environ['LIFETIME_ALLOC_PACKAGE_DIR'])

import nova.conf  # noqa: E402
from nova import context as nova_context  # noqa: E402
from nova import objects  # noqa: E402
from nova.scheduler import host_manager  # noqa: E402
from nova.scheduler import weights as nova_weights  # noqa: E402

objects.register_all()

from lifetime_alloc_openstack import client as client_mod  # noqa: E402
from lifetime_alloc_openstack import weigher as weigher_mod  # noqa: E402

# The functional tests' stack fixture, loaded from its file: the ``tests`` package patches with
# eventlet (Nova's harness does), which nova-scheduler in native threading mode does not.
def _load_stack():
    import importlib.util
    path = os.path.join(os.path.dirname(HERE), 'tests', 'functional', 'stack.py')
    spec = importlib.util.spec_from_file_location('lifetime_alloc_bench_stack', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stack_mod = _load_stack()

CONF = nova.conf.CONF
STOCK = ['nova.scheduler.weights.all_weighers']
OURS = STOCK + ['lifetime_alloc_openstack.weigher.LifetimeWeigher']
# A compute host of a real cloud: 64 cores (x 4.0 in Placement), 256 GiB, 2 TB.
HOST = {'vcpus': 64, 'cpu_ratio': 4.0, 'memory_mb': 262144, 'disk_gb': 2048}
CAPACITY = {'cores': HOST['vcpus'] * HOST['cpu_ratio'], 'memory_gib': HOST['memory_mb'] / 1024.0,
            'ssd_gib': float(HOST['disk_gb'])}
CELL = '8f2e6a34-3a5b-4f0e-9a53-5b0d5c6f1e01'


def host_names(n):
    return ['cmp-%04d' % i for i in range(n)]


def host_states(names, seed=57):
    """Nova's HostState of each host, updated from a ComputeNode with some usage (so that the
    stock RAM, CPU, disk, IO and instance-count weighers have something to weigh)."""
    rnd = random.Random(seed)
    states = []
    for i, name in enumerate(names):
        used_vcpus = rnd.randint(0, HOST['vcpus'] * 3)
        used_ram = rnd.randint(0, HOST['memory_mb'] // 2)
        used_disk = rnd.randint(0, HOST['disk_gb'] // 2)
        compute = objects.ComputeNode(
            id=i + 1, uuid=str(uuid.UUID(int=rnd.getrandbits(128))), host=name,
            hypervisor_hostname=name, vcpus=HOST['vcpus'], vcpus_used=used_vcpus,
            memory_mb=HOST['memory_mb'], memory_mb_used=used_ram,
            free_ram_mb=HOST['memory_mb'] - used_ram, local_gb=HOST['disk_gb'],
            local_gb_used=used_disk, free_disk_gb=HOST['disk_gb'] - used_disk,
            disk_available_least=HOST['disk_gb'] - used_disk, running_vms=used_vcpus // 4,
            hypervisor_type='fake', hypervisor_version=1000, cpu_info='{}',
            host_ip='10.0.%d.%d' % (i // 250, i % 250 + 1), supported_hv_specs=[],
            numa_topology=None, pci_device_pools=objects.PciDevicePoolList(objects=[]),
            stats={'num_instances': str(used_vcpus // 4), 'io_workload': str(rnd.randint(0, 3)),
                   'failed_builds': '0'},
            metrics='[]', cpu_allocation_ratio=HOST['cpu_ratio'], ram_allocation_ratio=1.0,
            disk_allocation_ratio=1.0, updated_at=None)
        state = host_manager.HostState(name, name, CELL)
        state.update(compute=compute, service={'disabled': False, 'forced_down': False},
                     aggregates=[], inst_dict={})
        states.append(state)
    return states


class Specs(object):
    """RequestSpecs as the conductor builds them for a boot: a flavor, an image with properties,
    the project, a hint; ``hit``: the same request facts each time, ``miss``: a flavor name never
    seen before (the control service's cache key holds the VM type)."""

    def __init__(self):
        self.context = nova_context.RequestContext('bench-user', 'bench-project')
        self.image = {'id': 'a4f5c1de-5b52-4b54-8d2b-0c2f1f0f4b00', 'name': 'ubuntu-24.04',
                      'min_ram': 0, 'min_disk': 0, 'disk_format': 'qcow2',
                      'container_format': 'bare', 'size': 1 << 30,
                      'properties': {'os_distro': 'ubuntu', 'os_type': 'linux',
                                     'hw_disk_bus': 'virtio', 'hw_qemu_guest_agent': 'yes'}}
        self.misses = 0

    def flavor(self, name):
        return objects.Flavor(id=1, flavorid='bench', name=name, vcpus=2, memory_mb=4096,
                              root_gb=20, ephemeral_gb=0, swap=0, rxtx_factor=1.0,
                              vcpu_weight=0, disabled=False, is_public=True,
                              extra_specs={'hw:cpu_policy': 'shared'}, description=None)

    def make(self, mode):
        if mode == 'hit':
            name = 'bench.m2'
        else:
            self.misses += 1
            name = 'bench.m2.%d' % self.misses
        filter_properties = {'scheduler_hints': {'batch': ['nightly']}}
        return objects.RequestSpec.from_components(
            self.context, str(uuid.uuid4()), self.image, self.flavor(name), None,
            objects.InstancePCIRequests(requests=[]), filter_properties, None, 'nova',
            project_id='bench-project', user_id='bench-user')


def percentile(values, p):
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100.0 * len(ordered)) - 1)]


def ms(seconds):
    return seconds * 1000.0


class Timings(object):
    """The Server-Timing header and the wall time of every call the weigher's client makes (the
    client's observer: a list append)."""

    def __init__(self):
        self.calls = []

    def observe(self, method, path, status, headers, seconds):
        self.calls.append((headers.get('server-timing', ''), seconds))

    @staticmethod
    def parse(header):
        out = {}
        for part in header.split(','):
            name, _, rest = part.strip().partition(';dur=')
            if name and rest:
                out[name] = float(rest)
        return out


class Load(object):
    """The machine's load: load averages, and the CPU the other processes used meanwhile (all
    busy jiffies less this process's and the three services')."""

    def __init__(self, pids):
        self.pids = pids

    @staticmethod
    def machine():
        with open('/proc/stat') as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    def ours(self):
        total = 0
        for pid in self.pids:
            try:
                with open('/proc/%d/stat' % pid) as f:
                    parts = f.read().rsplit(')', 1)[1].split()
                total += int(parts[11]) + int(parts[12])
            except OSError:
                pass
        return total

    def start(self):
        self.t0 = (self.machine(), self.ours(), os.getloadavg())

    def stop(self):
        (busy0, all0), ours0, load0 = self.t0
        (busy1, all1), ours1, load1 = self.machine(), self.ours(), os.getloadavg()
        span = max(all1 - all0, 1)
        return {'busy_pct': 100.0 * (busy1 - busy0) / span,
                'others_pct': 100.0 * ((busy1 - busy0) - (ours1 - ours0)) / span,
                'loadavg_start': load0, 'loadavg_end': load1}


def cache_counts(stack):
    stats = stack.stats()
    cache = stats.get('cache', {})
    return {'hits': cache.get('hits', 0), 'misses': cache.get('misses', 0),
            'sources': dict(stats.get('predictions_by_source', {}) or {})}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--decisions', type=int, default=500, help='timed decisions per row')
    parser.add_argument('--warmup', type=int, default=30, help='untimed decisions per row first')
    parser.add_argument('--candidates', default='20,500')
    parser.add_argument('--cache', default='hit,miss', help='rows: hit, miss or both')
    parser.add_argument('--profile', action='store_true',
                        help='then a cProfile pass of the plug-in (500 candidates, hit)')
    parser.add_argument('--json', help='write the figures to this file')
    args = parser.parse_args()
    sizes = [int(x) for x in args.candidates.split(',')]

    CONF([], project='nova', default_config_files=[])
    names = host_names(max(sizes))
    stack = stack_mod.Stack(names, capacity=CAPACITY)
    stack.setUp()
    try:
        return run(args, sizes, names, stack)
    finally:
        stack.cleanUp()


def run(args, sizes, names, stack):
    CONF.set_override('control_url', stack.control_url, 'lifetime_alloc')
    CONF.set_override('token', stack_mod.OPERATOR_KEY, 'lifetime_alloc')
    CONF.set_override('zone', stack_mod.ZONE, 'lifetime_alloc')
    # As HostManager.__init__ loads them, once per configuration.
    handler = nova_weights.HostWeightHandler()
    loaded = {}
    for label, classes in (('stock', STOCK), ('ours', OURS)):
        CONF.set_override('weight_classes', classes, 'filter_scheduler')
        loaded[label] = [cls() for cls in handler.get_matching_classes(
            CONF.filter_scheduler.weight_classes)]
    CONF.clear_override('weight_classes', 'filter_scheduler')
    lifetime = [w for w in loaded['ours'] if isinstance(w, weigher_mod.LifetimeWeigher)][0]
    timings = Timings()
    lifetime.client().observer = timings.observe
    control = client_mod.ControlClient(stack.control_url, stack_mod.OPERATOR_KEY, timeout=10.0,
                                       zone=stack_mod.ZONE)
    states = host_states(names)
    specs = Specs()
    pids = [os.getpid()] + [s.process.pid for s in stack.services.values()]
    print('machine: %d cores, %s, Python %s, nova weighers: %s' % (
        os.cpu_count(), platform.platform(), platform.python_version(),
        ', '.join(type(w).__name__ for w in loaded['stock'])))
    print('plug-in: %s' % os.path.dirname(weigher_mod.__file__))
    for name in ('allocator', 'control-service', 'inference-server'):
        path = os.path.join(stack_mod.bin_dir(), name)
        print('binary %s: built %s' % (path, datetime.datetime.fromtimestamp(
            os.path.getmtime(path), datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')))
    print('load average at start: %.2f %.2f %.2f' % os.getloadavg())
    print('%d decisions per row (after %d untimed), stock and stock + LifetimeWeigher '
          'interleaved ABBA; times in ms' % (args.decisions, args.warmup))

    def decide(label, hosts, spec):
        cpu = time.thread_time()
        started = time.perf_counter()
        weighed = handler.get_weighed_objects(loaded[label], hosts, spec)
        return time.perf_counter() - started, time.thread_time() - cpu, weighed

    rows = []
    run_started = time.monotonic()
    for n in sizes:
        hosts = states[:n]
        for mode in args.cache.split(','):
            result = {'stock': [], 'ours': [], 'stock_cpu': [], 'ours_cpu': [], 'weigher': [],
                      'http': [], 'server': []}
            for phase, count in (('warmup', args.warmup), ('timed', args.decisions)):
                if phase == 'timed':
                    cache0 = cache_counts(stack)
                    counters0 = collections.Counter(weigher_mod.COUNTERS)
                    load = Load(pids)
                    load.start()
                    first_call = len(timings.calls)
                for i in range(count):
                    order = ('stock', 'ours') if i % 4 in (0, 3) else ('ours', 'stock')
                    for label in order:
                        spec = specs.make(mode)
                        seconds, cpu, weighed = decide(label, hosts, spec)
                        if label == 'ours':
                            decision = weigher_mod.RECENT[-1]
                            if decision[0] != spec.instance_uuid or decision[1] != 'placed':
                                raise SystemExit('the weigher did not place %s: %r (counters %r)'
                                                 % (spec.instance_uuid, decision,
                                                    dict(weigher_mod.COUNTERS)))
                            if weighed[0].obj.nodename != decision[2]:
                                raise SystemExit('Nova chose %s, the allocator %s' % (
                                    weighed[0].obj.nodename, decision[2]))
                            if phase == 'timed':
                                result['weigher'].append(decision[3])
                            control.release(spec.instance_uuid)  # untimed: hosts never fill
                        if phase == 'timed':
                            result[label].append(seconds)
                            result[label + '_cpu'].append(cpu)
            figures = load.stop()
            cache1 = cache_counts(stack)
            counters = collections.Counter(weigher_mod.COUNTERS)
            counters.subtract(counters0)
            allocate_calls = [c for c in timings.calls[first_call:] if 'alloc-total' in c[0]]
            for header, elapsed in allocate_calls:
                result['http'].append(elapsed)
                result['server'].append(Timings.parse(header))
            row = summarize(n, mode, result, cache0, cache1, counters, figures, args.decisions)
            rows.append(row)
            print_row(row)
    print_table(rows)
    print('load average at end: %.2f %.2f %.2f; %.0f s in all' % (
        os.getloadavg() + (time.monotonic() - run_started,)))
    if args.profile:
        profile(handler, loaded, states, specs, control)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'date': datetime.datetime.now(datetime.timezone.utc).isoformat(),
                       'decisions': args.decisions, 'rows': rows}, f, indent=1)
    return 0


def summarize(n, mode, result, cache0, cache1, counters, load, decisions):
    stock, ours = result['stock'], result['ours']
    paired = [o - s for o, s in zip(ours, stock)]
    server = result['server']

    def stage(name, p):
        values = [s.get(name, 0.0) for s in server]
        return percentile(values, p) if values else float('nan')

    row = {
        'candidates': n, 'cache': mode, 'decisions': len(ours),
        'stock_p50': ms(percentile(stock, 50)), 'stock_p99': ms(percentile(stock, 99)),
        'ours_p50': ms(percentile(ours, 50)), 'ours_p99': ms(percentile(ours, 99)),
        'paired_p50': ms(percentile(paired, 50)), 'paired_p99': ms(percentile(paired, 99)),
        'weigher_p50': ms(percentile(result['weigher'], 50)),
        'weigher_p99': ms(percentile(result['weigher'], 99)),
        'http_p50': ms(percentile(result['http'], 50)) if result['http'] else float('nan'),
        'http_p99': ms(percentile(result['http'], 99)) if result['http'] else float('nan'),
        'control_total_p50': stage('total', 50), 'control_total_p99': stage('total', 99),
        'control_cache_p50': stage('cache', 50), 'control_inference_p50': stage('inference', 50),
        'control_inference_p99': stage('inference', 99),
        'control_allocator_p50': stage('allocator', 50),
        'control_allocator_p99': stage('allocator', 99),
        'alloc_total_p50': stage('alloc-total', 50), 'alloc_total_p99': stage('alloc-total', 99),
        'alloc_parse_p50': stage('alloc-parse', 50), 'alloc_decide_p50': stage('alloc-decide', 50),
        'alloc_decide_p99': stage('alloc-decide', 99),
        'alloc_commit_p50': stage('alloc-commit', 50),
        'alloc_commit_p99': stage('alloc-commit', 99),
        'cache_hits': cache1['hits'] - cache0['hits'],
        'cache_misses': cache1['misses'] - cache0['misses'],
        'sources': {k: v - cache0['sources'].get(k, 0) for k, v in cache1['sources'].items()
                    if v - cache0['sources'].get(k, 0)},
        'outcomes': {k: v for k, v in counters.items() if v},
        'busy_pct': load['busy_pct'], 'others_pct': load['others_pct'],
        'loadavg_start': load['loadavg_start'][0], 'loadavg_end': load['loadavg_end'][0],
    }
    row['stock_cpu_p50'] = ms(percentile(result['stock_cpu'], 50))
    row['ours_cpu_p50'] = ms(percentile(result['ours_cpu'], 50))
    row['added_cpu_p50'] = row['ours_cpu_p50'] - row['stock_cpu_p50']
    row['added_p50'] = row['ours_p50'] - row['stock_p50']
    row['added_p99'] = row['ours_p99'] - row['stock_p99']
    return row


def print_row(row):
    print('\n%(candidates)d candidates, cache %(cache)s: %(decisions)d decisions; control service '
          'cache +%(cache_hits)d hits +%(cache_misses)d misses; weigher outcomes %(outcomes)s; '
          'prediction sources %(sources)s' % row)
    print('  stock weighers        p50 %(stock_p50)7.3f  p99 %(stock_p99)7.3f' % row)
    print('  stock + Lifetime      p50 %(ours_p50)7.3f  p99 %(ours_p99)7.3f' % row)
    print('  added (ours - stock)  p50 %(added_p50)7.3f  p99 %(added_p99)7.3f   '
          '(per decision, paired: p50 %(paired_p50).3f p99 %(paired_p99).3f)' % row)
    print('  CPU of this thread    p50 stock %(stock_cpu_p50).3f, + Lifetime %(ours_cpu_p50).3f: '
          'the plug-in adds %(added_cpu_p50).3f of Python CPU' % row)
    print('  inside: the weigher   p50 %(weigher_p50)7.3f  p99 %(weigher_p99)7.3f; its HTTP call '
          '(client) p50 %(http_p50).3f p99 %(http_p99).3f' % row)
    print('  control service total p50 %(control_total_p50).3f p99 %(control_total_p99).3f '
          '(cache %(control_cache_p50).3f, inference p50 %(control_inference_p50).3f p99 '
          '%(control_inference_p99).3f, allocator hop p50 %(control_allocator_p50).3f p99 '
          '%(control_allocator_p99).3f)' % row)
    print('  allocator total       p50 %(alloc_total_p50).3f p99 %(alloc_total_p99).3f (parse '
          '%(alloc_parse_p50).3f, decide p50 %(alloc_decide_p50).3f p99 %(alloc_decide_p99).3f, '
          'commit p50 %(alloc_commit_p50).3f p99 %(alloc_commit_p99).3f)' % row)
    print('  machine: %(busy_pct).0f%% of 2 cores busy, others than this benchmark and its '
          'services %(others_pct).1f%%; load average %(loadavg_start).2f -> %(loadavg_end).2f'
          % row)


def print_table(rows):
    print('\n| candidates | cache | stock p50 | stock p99 | + Lifetime p50 | + Lifetime p99 | '
          'added p50 | added p99 | paired p99 | Python CPU added (p50) | '
          'control service total p50 / p99 | others\' CPU |')
    print('|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
    for r in rows:
        print('| %(candidates)d | %(cache)s | %(stock_p50).2f | %(stock_p99).2f | %(ours_p50).2f | '
              '%(ours_p99).2f | %(added_p50).2f | %(added_p99).2f | %(paired_p99).2f | '
              '%(added_cpu_p50).2f | %(control_total_p50).2f / %(control_total_p99).2f | '
              '%(others_pct).1f%% |' % r)


def profile(handler, loaded, states, specs, control, decisions=300):
    """cProfile of the plug-in's decisions, 500 candidates, cache hit."""
    hosts = states[:500]
    profiler = cProfile.Profile()
    for _ in range(decisions):
        spec = specs.make('hit')
        profiler.enable()
        handler.get_weighed_objects(loaded['ours'], hosts, spec)
        profiler.disable()
        control.release(spec.instance_uuid)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats('cumulative').print_stats(35)
    stats.sort_stats('tottime').print_stats(25)
    print('\ncProfile, %d decisions with stock + LifetimeWeigher, 500 candidates, cache hit:'
          % decisions)
    print(out.getvalue())


if __name__ == '__main__':
    sys.exit(main())
