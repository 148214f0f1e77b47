"""Watcher's own consolidation strategies against ``lifetime_consolidation`` on the same cluster
states: snapshots of a real trace (issue 59; docs/openstack.md, "Against Watcher's strategies").

A cluster (a sample, run as a seed is): the trace's VMs of the tenants whose id hashes to the
sample modulo ``--tenant-every`` (whole tenants, so batches stay whole), placed by the project's three binaries (the recommended policy, the trace's clock, the
given model bundle) as the trace asks for and releases them, on hosts enough for 10% over the
sample's peak. At each snapshot time (fractions of the trace's arrival span, after the bundle's
training cutoff) the allocator's hosts and VMs become a Watcher compute model (node: the host's
cores, memory; instance: the VM's vCPUs, memory, project, creation time), and each strategy
plans on it:

- Watcher's ``vm_workload_consolidation`` and ``basic`` (server consolidation), run as Watcher's
  decision engine runs them (``execute``), with a datasource that reports every VM as busy as it
  was sized (100% of its vCPUs, all of its memory): consolidation by reservations, as the
  allocator reckons;
- ``lifetime_consolidation`` (this package's strategy, against the real allocator) with the
  ``lifetime`` chooser and with ``age-batches``, the same rules without the model, each at the
  migrations ``vm_workload_consolidation`` proposed on that snapshot (the budget matched) and at
  the recommended 0.25 migrations per host-day. Every move of the round is in the action plan
  (``max_in_flight`` up to 100).

Each plan is read against the trace's later exits: migrations proposed, hosts emptied (a source
all of whose VMs leave and none arrive), migrations wasted (the VM exits within 1 h or 6 h of its
move ending, moves taking ``--migration-s``), and the empty host-hours the plan gains over the next
``--horizon-h`` hours with no new arrivals (each host empty from its last VM's exit; a move's
source holds it until the move ends), per migration. Our strategy's migrations are then failed at
the allocator (nothing moved) and its consolidation turned off and on again (the hosts it started
go back to service), so the cluster goes on as it was: every zone holds the same state at every
snapshot unless a prediction fell back (the summary says how often).

Run from the repository's root, with the Watcher venv (``scripts/openstack-env.sh``) and the
binaries built::

    target/openstack/watcher-venv/bin/python openstack/bench/watcher_compare.py \\
        --trace ../shared/data/azure-v1-tracegen/trace-dev.csv.gz \\
        --bundle target/eval-models/azure-validation-w3 --out docs/evaluation/watcher-comparison

Writes ``results.json`` and ``summary.md`` into ``--out``.
"""

import watcher.tests.unit  # noqa: F401,I100 (eventlet first, as Watcher's own tests do)

import argparse
import collections
import csv
import datetime
import gzip
import json
import logging
import math
import os
import statistics
import sys
import threading
import time
import uuid
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # openstack/: the package and its tests

from watcher.common import utils as watcher_utils  # noqa: E402
from watcher.decision_engine.model import element  # noqa: E402
from watcher.decision_engine.model import model_root  # noqa: E402
from watcher.decision_engine.strategy import strategies  # noqa: E402

from lifetime_alloc_openstack import client as client_mod  # noqa: E402
from lifetime_alloc_openstack import consolidation  # noqa: E402
from lifetime_alloc_openstack import watcher_strategy  # noqa: E402
from tests.functional import stack as stack_mod  # noqa: E402

ADMIN_TOKEN = 'watcher-compare-admin-token'
HOST_CORES, HOST_MEMORY_GIB = 48, 384
# During the replay: no round is ever due, and the bucket refills within a second of trace time.
CONSOLIDATION = ('budget_per_host_day = 1000000.0\nchooser = "%s"\nevery_s = 1000000000.0\n'
                 'migration_s = %s\nmax_in_flight = 100\n')
RECOMMENDED_BUDGET = 0.25


# The trace format's own columns (docs/trace-format.md); any other is a request-time feature.
TRACE_COLUMNS = ('vm_id', 'tenant_id', 'vm_type', 'cores', 'memory_gib', 'priority', 'start_s', 'end_s')


class Vm(object):
    def __init__(self, row):
        self.id = row['vm_id']
        self.tenant = row['tenant_id']
        self.vm_type = row['vm_type']
        self.cores = float(row['cores'])
        self.memory_gib = float(row['memory_gib'])
        self.priority = row.get('priority') or 'regular'
        self.start_s = float(row['start_s'])
        self.end_s = float(row['end_s']) if row.get('end_s') else math.inf
        self.extra = {k: v for k, v in row.items() if k not in TRACE_COLUMNS and v not in (None, '')}

    def request(self):
        """The allocation request as ``vmreplay`` sends it (traces::TraceRecord::to_request): the
        ``os`` column as the OS, every other extra column a feature (a number when it reads as one)."""
        features = {}
        for name, value in self.extra.items():
            if name == 'os':
                continue
            try:
                number = float(value)
                features[name] = number if math.isfinite(number) else value
            except ValueError:
                features[name] = value
        request = {'vm_id': self.id, 'tenant_id': self.tenant, 'vm_type': self.vm_type, 'priority': self.priority,
                   'demand': {'cores': self.cores, 'memory_gib': self.memory_gib},
                   'requested_at_s': self.start_s, 'features': features}
        if 'os' in self.extra:
            request['os'] = self.extra['os']
        return request


def read_trace(path, tenant_every, sample):
    """The VMs of the tenants whose id hashes to ``sample`` modulo ``tenant_every``, by start."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rt') as f:
        vms = [Vm(row) for row in csv.DictReader(f)
               if zlib.crc32(row['tenant_id'].encode()) % tenant_every == sample]
    vms.sort(key=lambda v: v.start_s)
    return vms


def hosts_for(vms, headroom=0.1):
    """Enough hosts for ``headroom`` over the sample's peak cores or memory."""
    events = sorted([(v.start_s, 1, v) for v in vms] + [(v.end_s, 0, v) for v in vms if v.end_s < math.inf],
                    key=lambda e: (e[0], e[1]))
    cores = memory = peak_cores = peak_memory = 0.0
    for _, arrival, vm in events:
        sign = 1 if arrival else -1
        cores += sign * vm.cores
        memory += sign * vm.memory_gib
        peak_cores, peak_memory = max(peak_cores, cores), max(peak_memory, memory)
    return int(math.ceil(max(peak_cores / HOST_CORES, peak_memory / HOST_MEMORY_GIB) * (1 + headroom)))


class Busy(object):
    """Watcher's datasource, as busy as the VMs were sized: percent CPU of the VM's (or the host's)
    vCPUs, memory in MB (host memory in KB, as Watcher's metrics give it)."""

    def __init__(self, model):
        self.model = model

    def get_instance_cpu_usage(self, resource, *args, **kwargs):
        return 100.0

    def get_instance_ram_usage(self, resource, *args, **kwargs):
        return float(resource.memory)

    def get_instance_root_disk_size(self, resource, *args, **kwargs):
        return float(resource.disk)

    def get_host_cpu_usage(self, resource, *args, **kwargs):
        node = self.model.get_node_by_uuid(resource.uuid)
        used = sum(i.vcpus for i in self.model.get_node_instances(node))
        return 100.0 * used / node.vcpus

    def get_host_ram_usage(self, resource, *args, **kwargs):
        node = self.model.get_node_by_uuid(resource.uuid)
        return sum(i.memory for i in self.model.get_node_instances(node)) * 1024.0


def compute_model(placement, vms):
    """Watcher's compute model of ``placement`` ({host: [vm id]}); VMs' whole vCPUs (at least 1)
    and MB of memory."""
    model = model_root.ModelRoot()
    for host, vm_ids in sorted(placement.items()):
        node = element.ComputeNode(
            uuid=host, hostname=host, status='enabled', state='up', disabled_reason=None,
            vcpus=HOST_CORES, memory=HOST_MEMORY_GIB * 1024, disk=10000, vcpu_reserved=0,
            memory_mb_reserved=0, disk_gb_reserved=0, vcpu_ratio=1.0, memory_ratio=1.0, disk_ratio=1.0)
        model.add_node(node)
        for vm_id in vm_ids:
            vm = vms[vm_id]
            instance = element.Instance(
                uuid=vm_id, name=vm_id, state='active', vcpus=max(1, int(round(vm.cores))),
                memory=int(round(vm.memory_gib * 1024)), disk=0, metadata={},
                project_id=str(uuid.uuid5(uuid.NAMESPACE_URL, vm.tenant)),
                locked=False, host=host, hypervisor_hostname=host, watcher_exclude=False,
                created=datetime.datetime.fromtimestamp(vm.start_s, datetime.timezone.utc),
                flavor_extra_specs={})
            model.add_instance(instance)
            model.map_instance(instance, node)
    return model


def migrations_of(solution):
    return [(a['input_parameters']['resource_id'], a['input_parameters']['source_node'],
             a['input_parameters']['destination_node'])
            for a in solution.actions if a['action_type'] == 'migrate']


def run_watcher(strategy_class, model, parameters):
    # The strategy's options at their defaults, as an unset watcher.conf gives them.
    defaults = {opt.dest: opt.default for opt in strategy_class.get_config_opts()}
    strategy = strategy_class(config=watcher_utils.Struct(defaults, datasources=None))
    strategy._compute_model = model
    strategy._datasource_backend = Busy(model)
    strategy.input_parameters = watcher_utils.Struct(parameters)
    started = time.monotonic()
    solution = strategy.execute()
    return migrations_of(solution), time.monotonic() - started


def run_ours(url, model, chooser, budget_per_host_day):
    """``lifetime_consolidation``'s action plan on ``model``; its migrations failed afterwards."""
    config = watcher_utils.Struct(allocator_url=url, admin_token=ADMIN_TOKEN, timeout=60.0)
    strategy = watcher_strategy.LifetimeConsolidation(config)
    strategy._compute_model = model
    strategy.input_parameters = watcher_utils.Struct(
        budget_per_host_day=budget_per_host_day, chooser=chooser, max_in_flight=consolidation.MAX_IN_FLIGHT)
    started = time.monotonic()
    strategy.execute()
    elapsed = time.monotonic() - started
    moves = migrations_of(strategy.solution)
    admin = strategy.admin()
    report = admin.report()
    queued = sum(len(h.get('queue', [])) for h in report.get('hosts', []))
    in_flight = [m['vm_id'] for m in report.get('in_flight', [])]
    unplanned = sorted(set(in_flight) - {vm_id for vm_id, _, _ in moves})
    if unplanned:
        print('  (in flight at the allocator with no action: %s)' % ', '.join(unplanned[:5]), flush=True)
    # Paused (a failed migration would start the host's next), every migration failed, then off
    # and on again: the hosts whose VMs wait in the queue go back to service too, and the bucket
    # refills at the next request (the batches the choosers read are the last hour's exits, and
    # the next snapshot is hours away).
    admin.pause()
    for vm_id in in_flight:
        admin.fail(vm_id)
    settings = consolidation.settings_with(report['config'], 1e6, chooser, consolidation.MAX_IN_FLIGHT)
    admin.off()
    admin.configure(settings)
    return moves, elapsed, queued


def score(moves, placement, vms, now_s, migration_s, horizon_s):
    """What a plan does, read against the trace's later exits."""
    moved = {vm_id: (source, target) for vm_id, source, target in moves}
    after = {host: [v for v in vm_ids if v not in moved] for host, vm_ids in placement.items()}
    for vm_id, (source, target) in moved.items():
        after[target].append(vm_id)

    def empty_hours(hosts, holding):
        total = 0.0
        for host, vm_ids in hosts.items():
            empty_at = max([now_s] + [vms[v].end_s for v in vm_ids] + holding.get(host, []))
            total += max(0.0, now_s + horizon_s - empty_at) / 3600.0
        return total

    holding = collections.defaultdict(list)
    for vm_id, (source, _) in moved.items():
        holding[source].append(min(vms[vm_id].end_s, now_s + migration_s))
    sources = {source for source, _ in moved.values()}
    targets = {target for _, target in moved.values()}
    emptied = [h for h in sources if not after[h] and h not in targets]
    gained = empty_hours(after, holding) - empty_hours(placement, {})
    wasted = {w: sum(1 for v in moved if vms[v].end_s < now_s + migration_s + w * 3600.0) for w in (1, 6)}
    count = len(moves)
    return {'migrations': count, 'hosts_emptied': len(emptied), 'wasted_1h': wasted[1], 'wasted_6h': wasted[6],
            'empty_host_hours_gained': gained, 'per_migration': gained / count if count else None}


class Zone(object):
    """One stack replaying the sample; ``chooser`` is its allocator's consolidation chooser."""

    def __init__(self, chooser, hosts, bundle, migration_s):
        self.chooser = chooser
        self.stack = stack_mod.Stack(
            ['host-%04d' % i for i in range(hosts)],
            capacity={'cores': float(HOST_CORES), 'memory_gib': float(HOST_MEMORY_GIB), 'ssd_gib': 0.0},
            inference_timeout_ms=2500, clock='request', bundle=bundle, admin_token=ADMIN_TOKEN,
            consolidation=CONSOLIDATION % (chooser, repr(float(migration_s))))
        self.stack.setUp()
        self.control = client_mod.ControlClient(self.stack.control_url, stack_mod.OPERATOR_KEY, timeout=60.0,
                                                zone=stack_mod.ZONE)
        self.position = 0
        self.failed = 0

    def replay_until(self, events, until_s):
        while self.position < len(events) and events[self.position][0] <= until_s:
            at_s, kind, vm = events[self.position]
            self.position += 1
            if kind == 'exit':
                self.control.release(vm.id, ended_at_s=at_s)
                continue
            answer = self.control.allocate(vm.request())
            if answer.get('status') != 'placed':
                self.failed += 1

    def placement(self):
        return {entry.get('host', entry)['host_id']: sorted(entry.get('vms', []))
                for entry in self.control.hosts(timeout=60.0)}

    def close(self):
        self.control.close()
        self.stack.cleanUp()


def run_sample(args, sample, bundle):
    """One sample's cluster (the tenants hashing to ``sample``): every snapshot, every strategy."""
    vms_list = read_trace(args.trace, args.tenant_every, sample)
    vms = {v.id: v for v in vms_list}
    first, last = vms_list[0].start_s, vms_list[-1].start_s
    snapshots = [first + float(f) * (last - first) for f in args.snapshots.split(',')]
    events = sorted([(v.start_s, 'arrival', v) for v in vms_list if v.start_s <= snapshots[-1]]
                    + [(v.end_s, 'exit', v) for v in vms_list if v.end_s <= snapshots[-1]],
                    key=lambda e: (e[0], e[1] == 'arrival'))
    hosts = hosts_for(vms_list)
    print('sample %d: %d VMs of %d tenants, %d hosts, %d events up to the last snapshot'
          % (sample, len(vms_list), len({v.tenant for v in vms_list}), hosts, len(events)), flush=True)
    # A zone per row of ours: a round spends its zone's bucket, which refills only as trace time
    # passes (the next snapshot).
    zones = collections.OrderedDict(((chooser, budget), Zone(chooser, hosts, bundle, args.migration_s))
                                    for budget in ('matched', RECOMMENDED_BUDGET)
                                    for chooser in ('lifetime', 'age-batches'))
    rows = []
    try:
        for index, at_s in enumerate(snapshots):
            started = time.monotonic()
            threads = [threading.Thread(target=z.replay_until, args=(events, at_s)) for z in zones.values()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            placements = [z.placement() for z in zones.values()]
            # The zones replay the same sequence with the same policy and tie-breaking, so they
            # hold the same state unless a prediction fell back (an inference timeout on a loaded
            # machine): then each of ours plans on its own zone's state, and the row says on how
            # many hosts it differs.
            placement = placements[0]
            differing = [sum(1 for h in placement if placement[h] != other.get(h)) for other in placements]
            snapshot = {'sample': sample, 'snapshot': index + 1, 'at_s': at_s,
                        'vms': sum(len(v) for v in placement.values()), 'hosts': len(placement),
                        'empty_hosts': sum(1 for v in placement.values() if not v),
                        'failed_allocations': sum(z.failed for z in zones.values())}
            print('snapshot %d at %.0f s: %d VMs on %d hosts (%d empty), replayed in %.0f s'
                  % (index + 1, at_s, snapshot['vms'], len(placement), snapshot['empty_hosts'],
                     time.monotonic() - started), flush=True)

            def record(name, moves, elapsed, state=placement, **extra):
                row = dict(snapshot, strategy=name, plan_s=elapsed, **extra)
                row.update(score(moves, state, vms, at_s, args.migration_s, args.horizon_h * 3600.0))
                rows.append(row)
                print('  %-58s %4d migrations, %3d hosts emptied, wasted %d / %d, %.1f empty host-hours'
                      % (name, row['migrations'], row['hosts_emptied'], row['wasted_1h'], row['wasted_6h'],
                         row['empty_host_hours_gained']), flush=True)
                return row

            vwc = record('vm_workload_consolidation', *run_watcher(
                strategies.VMWorkloadConsolidation, compute_model(placement, vms), {'period': 3600}))
            record('basic', *run_watcher(strategies.BasicConsolidation, compute_model(placement, vms),
                                         {'migration_attempts': 0, 'period': 7200, 'granularity': 300,
                                          'aggregation_method': {'instance': 'mean', 'compute_node': 'mean',
                                                                 'node': ''}}))
            matched = max(vwc['migrations'], 1) / float(len(placement))
            for ((chooser, budget), zone), state, differ in zip(zones.items(), placements, differing):
                budget, label = ((matched, 'budget matched') if budget == 'matched'
                                 else (budget, 'budget %g/host-day' % budget))
                moves, elapsed, queued = run_ours(zone.stack.allocator_url, compute_model(state, vms), chooser, budget)
                record('lifetime_consolidation %s, %s' % (chooser, label), moves, elapsed, state=state,
                       budget_per_host_day=budget, queued=queued, hosts_differing=differ)
    finally:
        for zone in zones.values():
            zone.close()
    return hosts, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--trace', required=True)
    parser.add_argument('--bundle', required=True, help='model bundle (trained before the snapshots)')
    parser.add_argument('--tenant-every', type=int, default=10,
                        help='a sample keeps the tenants whose id hashes to it modulo this')
    parser.add_argument('--samples', default='0,1,2', help='the samples (clusters) to run, each a seed')
    parser.add_argument('--snapshots', default='0.82,0.86,0.9,0.94,0.98', help='fractions of the arrival span')
    parser.add_argument('--migration-s', type=float, default=1200.0)
    parser.add_argument('--horizon-h', type=float, default=24.0)
    parser.add_argument('--out', required=True)
    args = parser.parse_args()
    # Watcher logs a warning per VM without disk metrics; what matters is printed here.
    logging.getLogger('watcher').setLevel(logging.ERROR)
    bundle = os.path.abspath(args.bundle)
    if not os.path.isfile(os.path.join(bundle, 'manifest.json')):
        parser.error('--bundle: %s holds no model bundle (manifest.json)' % args.bundle)
    hosts, rows = {}, []
    for sample in (int(s) for s in args.samples.split(',')):
        hosts[sample], sample_rows = run_sample(args, sample, bundle)
        rows.extend(sample_rows)
    os.makedirs(args.out, exist_ok=True)
    meta = {'trace': args.trace, 'bundle': args.bundle, 'tenant_every': args.tenant_every, 'hosts': hosts,
            'snapshots': args.snapshots, 'migration_s': args.migration_s, 'horizon_h': args.horizon_h,
            'command': ' '.join(sys.argv)}
    with open(os.path.join(args.out, 'results.json'), 'w') as f:
        json.dump({'settings': meta, 'rows': rows}, f, indent=1)
    text = summary(rows, meta)
    with open(os.path.join(args.out, 'summary.md'), 'w') as f:
        f.write(text)
    print(text)


def spread(values, form='%.1f'):
    """Mean ± standard deviation over the samples."""
    values = [v for v in values if v is not None]
    if not values:
        return '-'
    if len(values) == 1:
        return form % values[0]
    return (form + ' ± ' + form) % (statistics.mean(values), statistics.stdev(values))


def summary(rows, meta):
    """Per strategy, each sample's snapshots summed, then mean ± sd over the samples."""
    by_strategy = collections.OrderedDict()
    for row in rows:
        by_strategy.setdefault(row['strategy'], collections.OrderedDict()).setdefault(row['sample'], []).append(row)
    samples = sorted({r['sample'] for r in rows})
    differed = [r['hosts_differing'] for r in rows if r.get('hosts_differing')]
    lines = ['%d samples (clusters of %s hosts of %d cores, %d GiB) x %d snapshots; migrations of %.0f s; '
             'gains over %.0f h with no new arrival. Each sample\'s snapshots summed, then mean ± sd over the '
             'samples; shares are of the migrations proposed. Plans on a state other than the Watcher '
             'strategies\': %d (on %s hosts).'
             % (len(samples), '/'.join(str(meta['hosts'][s]) for s in samples), HOST_CORES, HOST_MEMORY_GIB,
                len(meta['snapshots'].split(',')), meta['migration_s'], meta['horizon_h'], len(differed),
                '/'.join(str(d) for d in differed) or '0'),
             '',
             '| strategy | migrations | hosts emptied | wasted within 1 h | wasted within 6 h | '
             'empty host-hours gained | per migration |',
             '|---|---|---|---|---|---|---|']

    def total(group, key):
        return sum(r[key] for r in group)

    for name, per_sample in by_strategy.items():
        groups = list(per_sample.values())

        def share(key):
            return [100.0 * total(g, key) / total(g, 'migrations') if total(g, 'migrations') else None
                    for g in groups]

        lines.append('| %s | %s | %s | %s%% | %s%% | %s | %s |' % (
            name, spread([total(g, 'migrations') for g in groups]),
            spread([total(g, 'hosts_emptied') for g in groups]), spread(share('wasted_1h')),
            spread(share('wasted_6h')), spread([total(g, 'empty_host_hours_gained') for g in groups]),
            spread([total(g, 'empty_host_hours_gained') / total(g, 'migrations') if total(g, 'migrations')
                    else None for g in groups], '%.2f')))
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    main()
