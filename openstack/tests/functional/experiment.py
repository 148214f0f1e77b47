"""Issue 57's measured must-shows, as a runnable experiment in Nova's functional harness.

*Nova follows the allocator, at scale* and *Packing through Nova*: a piece of day 10 of the seeded
synthetic trace (the one ``scripts/demo.sh`` replays, held out from the default model) booted and
deleted through Nova's API in the order of its arrivals and exits, on ``--hosts`` fake compute
nodes, with the project's three binaries (the allocator on the trace's clock, starting with no
host: the listener's first reconciliation adds Nova's computes), once per row and seed:

- ``spread``: Nova's stock weighers with their defaults (the plug-in's weigher not in
  ``weight_classes``; the listener still records, so the allocator follows);
- ``stack``: the same with ``ram_weight_multiplier = cpu_weight_multiplier = -1``;
- ``pbfr``: the plug-in, the allocator on the ``pbfr`` preset;
- ``nilas-survival``: the plug-in, the allocator on the recommended policy (configs/allocator.toml:
  NILAS over exact best fit with its 8-hour exit floor, the default bundle's survival model).

Every server's host is read from Placement (``GET /allocations/{server}``) after its boot; the
packing figures are computed from that ledger, which is checked against Placement's providers
after every phase. After every phase the allocator's hosts, VMs and used resources are compared
with Placement's allocations (and a reconciliation must change nothing); with the plug-in, every
server must land on the host the allocator chose.

With ``--parity``, the simulator (``target/release/simulate``) replays each plug-in run's sequence
(arrival and exit times, demands as Nova asked Placement for them, the trace's tenants and types)
on the same inventory, with the same policy, tie-breaking and seed, and its placements are compared
VM by VM with Nova's, and so are the predictions the VMs were placed with (the simulator's model
source starting from the bundle's tenant history, as the inference server does). The exits reach
the tenants' history on the trace's clock: before each delete the server's metadata gets
``ended_at_s``, which the listener passes on (as the boot's ``requested_at_s`` hint dates the
arrival).

Run from ``openstack/`` (``docs/openstack.md``, "Packing through Nova")::

    ../target/openstack/nova-venv/bin/python -m tests.functional.experiment \\
        --servers 300 --hosts 20 --seeds 1,2,3 --parity --out ../target/openstack/packing

Each run writes ``<out>/runs/<row>-seed<seed>.json`` as soon as it ends (an existing one is kept:
an interrupted experiment resumes); then ``summary.json``, ``summary.md`` and ``packing.svg``.
A seed is a sampling offset: seed ``s`` keeps every ``--every``-th request of the day from the
``s``-th on (the same trace, the same day, another sample of it).
"""

import argparse
import collections
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

from nova import context as nova_context

from lifetime_alloc_openstack import reconcile
from lifetime_alloc_openstack import weigher
from tests.functional import base
from tests.functional import stack as stack_mod
from tests.functional import trace

DAY_S = 86400.0
# The allocator's policy of each row (the stock rows' allocator only follows: its policy decides
# nothing there).
RECOMMENDED = ('kind = "nilas"\nbuckets = "exact"\nlong_threshold_s = 7200.0\n'
               'prefer_non_empty = true\nexit_floor_s = 28800.0\n')
ROWS = collections.OrderedDict([
    ('spread', dict(label="Nova's stock weighers, spreading (defaults)", weigher=False,
                    stacking=False, policy=RECOMMENDED)),
    ('stack', dict(label="Nova's stock weighers, stacking (RAM and CPU multipliers -1)",
                   weigher=False, stacking=True, policy=RECOMMENDED)),
    ('pbfr', dict(label='the plug-in, PBFR (`kind = "pbfr"`)', weigher=True, stacking=False,
                  policy='kind = "pbfr"\n', simulate=['--policy', 'pbfr', '--prediction', 'none'])),
    ('nilas-survival', dict(label='the plug-in, recommended (`nilas-survival`)', weigher=True,
                            stacking=False, policy=RECOMMENDED,
                            simulate=['--policy', 'nilas', '--buckets', 'exact',
                                      '--long-threshold-s', '7200'])),
])
SHORT = {'spread': 'Nova, spreading', 'stack': 'Nova, stacking', 'pbfr': 'plug-in, PBFR',
         'nilas-survival': 'plug-in, nilas-survival'}
CORES, MEMORY_MB = stack_mod.FAKE_NODE['cores'], int(stack_mod.FAKE_NODE['memory_gib'] * 1024)


# The sequence.
_TRACES = {}


def _trace_rows(days, trace_seed):
    key = (days, trace_seed)
    if key not in _TRACES:
        binary = os.path.join(stack_mod.bin_dir(), 'vmtrace')
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, 'trace.csv')
            subprocess.run([binary, 'generate', '--out', path, '--days', str(days), '--seed',
                            str(trace_seed)], check=True, stdout=subprocess.DEVNULL)
            with open(path) as f:
                _TRACES[key] = list(csv.DictReader(f))
    return _TRACES[key]


def sequence(servers, every, day, seed, trace_seed=42, days=14):
    """``[(time, 'boot'|'delete', Vm)]`` as :func:`trace.events` makes it (exits within the
    window in their place, exits before arrivals at equal times; the VMs still running at the
    last arrival are deleted afterwards), from day ``day`` of the ``days``-day trace, every
    ``every``-th request from the ``seed``-th on."""
    start, end = day * DAY_S, (day + 1) * DAY_S
    rows = sorted((r for r in _trace_rows(days, trace_seed) if start <= float(r['start_s']) < end),
                  key=lambda r: float(r['start_s']))
    vms = [trace.Vm(r) for r in rows[(seed - 1) % every::every][:servers]]
    if len(vms) < servers:
        raise SystemExit('day %d has only %d requests every %d' % (day, len(vms), every))
    last = vms[-1].start_s
    out = [(vm.start_s, 'boot', vm) for vm in vms]
    out += [(vm.end_s, 'delete', vm) for vm in vms if vm.end_s is not None and vm.end_s <= last]
    out.sort(key=lambda e: (e[0], e[1] == 'boot'))
    return out


# The packing figures, from the ledger of Placement's allocations.
class Packing(object):
    """Density (used / capacity of the non-empty hosts; cores, memory) and empty hosts, integrated
    exactly on the trace clock: the state after the last event at a time stands until the next."""

    def __init__(self, hosts):
        self.hosts = list(hosts)
        self.used = {h: [0.0, 0.0, 0] for h in self.hosts}  # cores, memory MB, VMs
        self.sums = collections.Counter()
        self.last_t = None
        self.first_t = None
        self.series = []

    def instant(self):
        busy = [u for u in self.used.values() if u[2] > 0]
        cores = sum(u[0] for u in busy)
        mem = sum(u[1] for u in busy)
        return {'density_cores': cores / (CORES * len(busy)) if busy else 0.0,
                'density_memory': mem / (MEMORY_MB * len(busy)) if busy else 0.0,
                'empty_hosts': len(self.hosts) - len(busy),
                'used_cores': cores, 'used_memory_mb': mem}

    def advance(self, t):
        """Weighs the current state from the last event's time to ``t``."""
        if self.last_t is None:
            self.first_t = self.last_t = t
            return
        dt = t - self.last_t
        if dt > 0:
            now = self.instant()
            self.sums['t'] += dt
            for key in ('density_cores', 'density_memory', 'empty_hosts'):
                self.sums[key] += dt * now[key]
            self.last_t = t

    def add(self, host, vcpus, ram_mb, sign=1):
        u = self.used[host]
        u[0] += sign * vcpus
        u[1] += sign * ram_mb
        u[2] += sign

    def sample(self, t):
        now = self.instant()
        now['t'] = t
        if self.series and self.series[-1]['t'] == t:
            self.series[-1] = now
        else:
            self.series.append(now)

    def averages(self):
        w = self.sums['t']
        return {k: (self.sums[k] / w if w else 0.0)
                for k in ('density_cores', 'density_memory', 'empty_hosts')}


class Replay(base.NovaTestBase):
    """One row and seed: set by :func:`make_case`."""

    CLOCK = 'request'
    INVENTORY = ()
    # The plug-in's timeout: generous, so that a slow answer on a loaded 2-core machine does not
    # hand a boot to Nova's weighers (an operator's choice; the faults test covers timeouts).
    TIMEOUT = 2.0
    ROW = None
    SEED = None
    ARGS = None
    RESULT = None

    def setUp(self):
        row = ROWS[self.ROW]
        real = stack_mod.Stack

        def stack(hosts, clock='wall'):
            return real(hosts, policy=row['policy'], clock=clock,
                        inference_timeout_ms=self.ARGS.inference_timeout_ms)
        with mock.patch.object(stack_mod, 'Stack', stack):
            super().setUp()

    def _setup_scheduler_service(self):
        row = ROWS[self.ROW]
        if not row['weigher']:
            self.flags(weight_classes=['nova.scheduler.weights.all_weighers'],
                       group='filter_scheduler')
        if row['stacking']:
            self.flags(ram_weight_multiplier=-1.0, cpu_weight_multiplier=-1.0,
                       group='filter_scheduler')
        return super()._setup_scheduler_service()

    def wait_for_boot(self, server, within_s=60.0):
        deadline = time.monotonic() + within_s
        while True:
            server = self.admin_api.get_server(server['id'])
            if server['status'] in ('ACTIVE', 'ERROR'):
                return server
            if time.monotonic() > deadline:
                self.fail('server %s is %s after %.0f s' % (server['id'], server['status'], within_s))
            time.sleep(0.05)

    def refresh_compute(self, host):
        """The compute's periodic ``update_available_resource`` on ``host`` (the harness runs no
        periodic task). In production it runs every 60 s, so at the trace's pace (an arrival every
        100 s or so) every host's statistics are fresh when the next server is scheduled; without
        it the node's ``io_workload`` counts every server ever built there, and Nova's
        ``IoOpsWeigher`` (multiplier -1.0) spreads whatever the other weighers say."""
        ctx = nova_context.get_admin_context()
        with nova_context.target_cell(ctx, self.host_mappings[host].cell_mapping) as cctxt:
            self.computes[host].manager.update_available_resource(cctxt)

    def books_differences(self, within_s=10.0):
        deadline = time.monotonic() + within_s
        while True:
            diffs = self.differences()
            if not diffs or time.monotonic() > deadline:
                return diffs
            time.sleep(0.1)

    def test_replay(self):
        args, row = self.ARGS, ROWS[self.ROW]
        events = sequence(args.servers, args.every, args.day, self.SEED)
        boots = [e for e in events if e[1] == 'boot']
        phase_size = int(math.ceil(len(boots) / float(args.phases)))
        reader = self.placement_reader()
        rp_name = {p['uuid']: p['name'] for p in reader.providers()}
        packing = Packing(sorted(self.HOSTS))
        result = {'row': self.ROW, 'label': row['label'], 'seed': self.SEED,
                  'servers': len(boots), 'hosts': len(self.HOSTS), 'every': args.every,
                  'day': args.day, 'policy': row['policy'], 'rejected': [], 'mismatches': [],
                  'decisions': collections.Counter(), 'phases': [], 'vms': [],
                  'allocator_hosts': [h['host_id'] for h in self.control.hosts()]}
        servers, ledger, booted = {}, {}, 0
        started = time.monotonic()
        phase_started = started
        wall_boot = wall_delete = 0.0

        def check_phase(name):
            # The ledger read from Placement server by server equals Placement's providers.
            want, _ = reconcile.read_placement(reader)
            from_placement = {vm: host for host, info in want.items() for vm in info['vms']}
            from_ledger = {vm: entry[0] for vm, entry in ledger.items()}
            diffs = self.books_differences()
            report = self.reconcile_now()
            result['phases'].append({
                'phase': name, 'at_s': packing.last_t, 'servers_running': len(ledger),
                'ledger_equals_placement': from_placement == from_ledger,
                'differences': len(diffs), 'differences_sample': diffs[:5],
                'reconcile_changed': report.changed, 'reconcile_errors': report.errors[:5],
                'seconds': round(time.monotonic() - phase_started, 1)})

        for at, kind, vm in events:
            packing.advance(at)
            if kind == 'delete':
                server = servers.pop(vm.trace_id, None)
                if server is None:  # a server Nova could not place
                    continue
                begun = time.monotonic()
                # The exit on the trace's clock, as the boot's requested_at_s hint dates the
                # arrival: the listener passes it on, so that the tenants' history the model
                # reads has the trace's lifetimes.
                self.admin_api.post_server_metadata(server['id'], {'ended_at_s': '%.3f' % at})
                self.delete(server)
                wall_delete += time.monotonic() - begun
                host, vcpus, ram = ledger.pop(server['id'])
                packing.add(host, vcpus, ram, -1)
                packing.sample(at)
                continue
            self.api.project_id = vm.tenant
            flavor = self.flavor(*vm.flavor)
            begun = time.monotonic()
            server = self.boot(vm.trace_id, flavor, hints={'requested_at_s': '%.3f' % at},
                               wait=False)
            server = self.wait_for_boot(server)
            wall_boot += time.monotonic() - begun
            decision = self.decision_of(server['id'])
            outcome = decision[0] if decision else 'not_asked'
            result['decisions'][outcome] += 1
            entry = {'uuid': server['id'], 'trace_id': vm.trace_id, 'tenant': vm.tenant,
                     'vm_type': vm.vm_type, 'vcpus': vm.vcpus, 'ram_mb': vm.ram_mb,
                     'start_s': vm.start_s, 'end_s': vm.end_s, 'chosen': decision and decision[1]}
            if server['status'] == 'ERROR':
                entry['host'] = None
                result['rejected'].append({'uuid': server['id'], 'fault': server.get('fault')})
                self.admin_api.delete_server(server['id'])
            else:
                consumer = reader.consumer(server['id']) or {}
                providers = list((consumer.get('allocations') or {}).items())
                if len(providers) != 1:
                    self.fail('server %s: allocations %s' % (server['id'], consumer))
                rp, alloc = providers[0]
                host = rp_name[rp]
                res = alloc['resources']
                ledger[server['id']] = (host, res.get('VCPU', 0), res.get('MEMORY_MB', 0))
                packing.add(host, res.get('VCPU', 0), res.get('MEMORY_MB', 0))
                packing.sample(at)
                entry['host'] = host
                entry['nova_host'] = self.node_of(server)
                self.refresh_compute(self.node_of(server))
                servers[vm.trace_id] = server
                if row['weigher'] and decision is not None and decision != ('placed', host):
                    result['mismatches'].append({'uuid': server['id'], 'decision': decision,
                                                 'host': host})
                recorded = self.stack.vm(server['id']) or {}
                entry['prediction'] = recorded.get('prediction')
            result['vms'].append(entry)
            booted += 1
            if booted % phase_size == 0 or booted == len(boots):
                check_phase('after %d boots' % booted)
                phase_started = time.monotonic()
        end_of_arrivals = packing.instant()
        averages = packing.averages()
        for server in servers.values():
            self.delete(server)
            ledger.pop(server['id'])
        check_phase('all deleted')
        result.update({
            'averages': averages, 'end_of_arrivals': end_of_arrivals,
            'window_s': [packing.first_t, packing.last_t], 'series': packing.series,
            'weigher_counters': dict(weigher.COUNTERS),
            'listener_counters': dict(self.service.endpoint.counters),
            'wall_s': round(time.monotonic() - started, 1), 'wall_boot_s': round(wall_boot, 1),
            'wall_delete_s': round(wall_delete, 1),
            'boots_per_s': round(len(boots) / max(wall_boot, 1e-9), 2)})
        result['decisions'] = dict(result['decisions'])
        self.RESULT.update(result)


def make_case(row, seed, args, result):
    name = 'Replay_%s_seed%d' % (row.replace('-', '_'), seed)
    hosts = tuple('host%02d' % i for i in range(1, args.hosts + 1))
    return type(name, (Replay,), {'ROW': row, 'SEED': seed, 'ARGS': args, 'RESULT': result,
                                  'HOSTS': hosts})('test_replay')


def run_one(row, seed, args, path):
    result = {}
    case = make_case(row, seed, args, result)
    began = time.monotonic()
    outcome = unittest.TextTestRunner(stream=sys.stderr, verbosity=1).run(case)
    if not outcome.wasSuccessful():
        for _, text in outcome.errors + outcome.failures:
            sys.stderr.write(text[-5000:] + '\n')
        raise SystemExit('%s seed %d failed' % (row, seed))
    result['run_s'] = round(time.monotonic() - began, 1)
    with open(path + '.tmp', 'w') as f:
        json.dump(result, f, indent=1, sort_keys=True)
    os.replace(path + '.tmp', path)
    return result


# Parity with the simulator.
def simulate_parity(result, args, workdir):
    """Replays the run's sequence through ``simulate`` and compares the placements, and the
    predictions the VMs were placed with (the control service's, as the allocator recorded them,
    against the simulator's model source)."""
    row = ROWS[result['row']]
    vms = result['vms']
    last = max(vm['start_s'] for vm in vms)
    name = '%s-seed%d' % (result['row'], result['seed'])
    trace_path = os.path.join(workdir, name + '.csv')
    with open(trace_path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['vm_id', 'tenant_id', 'vm_type', 'cores', 'memory_gib', 'priority',
                         'start_s', 'end_s'])
        for vm in sorted(vms, key=lambda v: v['start_s']):
            end = vm['end_s'] if vm['end_s'] is not None and vm['end_s'] <= last else ''
            writer.writerow([vm['uuid'], vm['tenant'], vm['vm_type'], vm['vcpus'],
                             repr(vm['ram_mb'] / 1024.0), 'regular', repr(vm['start_s']),
                             repr(end) if end != '' else ''])
    out = os.path.join(workdir, name + '.json')
    simulate = os.path.join(stack_mod.bin_dir(), 'simulate')
    flags = ['--trace', trace_path, '--hosts', str(result['hosts']), '--host-cores', repr(CORES),
             '--host-memory-gib', repr(MEMORY_MB / 1024.0), '--tie-break', 'lowest-index',
             '--seed', '42'] + row['simulate']
    with_model = result['row'].startswith('nilas-survival')
    if with_model:
        # The tenants' history from the bundle's feature store, as the inference server starts.
        bundle = os.path.join(stack_mod.REPO, 'models', 'default')
        flags += ['--prediction', 'model:' + bundle, '--bundle-history']
    # The whole configuration, with what no flag sets (the exit floor) as the allocator has it.
    config = subprocess.run([simulate, 'run', '--print-config'] + flags, check=True,
                            capture_output=True, text=True).stdout
    if 'exit_floor_s = 28800' in row['policy']:
        config = config.replace('exit_floor_s = 0.0', 'exit_floor_s = 28800.0')
    config_path = os.path.join(workdir, name + '.toml')
    with open(config_path, 'w') as f:
        f.write(config)
    command = [simulate, 'run', '--config', config_path, '--record-placements', '--quiet',
               '--out', out]
    began = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        simulated = json.load(f)
    # The simulator's hosts in index order are the allocator's (added in name order).
    sim_hosts = _host_order(simulated)
    to_nova = dict(zip(sim_hosts, result['allocator_hosts']))
    by_vm = {p['vm_id']: p for p in simulated['placements']}
    placed = {vm_id: (to_nova.get(p['host_id']) if p.get('host_id') else None) for vm_id, p in by_vm.items()}
    differing = [{'uuid': vm['uuid'], 'nova': vm['host'], 'simulator': placed.get(vm['uuid']),
                  'start_s': vm['start_s']}
                 for vm in vms if placed.get(vm['uuid'], 'missing') != vm['host']]

    def same_prediction(vm):
        mine, theirs = vm.get('prediction') or {}, by_vm.get(vm['uuid'], {})
        return (mine.get('p_long') == theirs.get('p_long')
                and mine.get('expected_lifetime_s') == theirs.get('expected_lifetime_s'))
    # The simulator predicts only with the model (not for PBFR); the control service's prediction
    # cache answers a request with what it predicted for the same features before, on an older
    # tenant history: such answers are counted apart.
    other = [vm for vm in vms if not same_prediction(vm)] if with_model else []
    cached = sum(1 for vm in other if (vm.get('prediction') or {}).get('source') == 'cache')
    order = {vm['uuid']: i for i, vm in enumerate(vms)}
    first = min((order[d['uuid']] for d in differing), default=None)
    return {'compared': len(vms), 'differing': len(differing), 'examples': differing[:10],
            'first_differing_arrival': first,
            'predictions_differing': len(other) if with_model else None,
            'predictions_differing_cache_hits': cached,
            'simulator_metrics': {k: simulated['metrics'].get(k) for k in
                                  ('packing_density', 'empty_hosts_pct')},
            'command': ' '.join(command), 'seconds': round(time.monotonic() - began, 1)}


def _host_order(simulated):
    """The simulator's host ids in index order (``sim-h0``, ``sim-h1``, ...)."""
    return ['sim-h%d' % i for i in range(simulated['config']['inventory']['hosts'])]


# The summary.
def mean_spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def integrate(result, key, share=1.0):
    """The time average of ``key`` over the last ``share`` of the arrivals' window, from the run's
    series (each state stands from its time until the next one's)."""
    t0, t1 = result['window_s']
    start = t1 - share * (t1 - t0)
    total = weight = 0.0
    series = result['series']
    for i, s in enumerate(series):
        until = series[i + 1]['t'] if i + 1 < len(series) else t1
        lo, hi = max(s['t'], start), min(until, t1)
        if hi > lo:
            total += (hi - lo) * s[key]
            weight += hi - lo
    return total / weight if weight else 0.0


def summarize(results, args, parity, commit, started_at):
    rows = []
    for row in ROWS:
        runs = [r for r in results if r['row'] == row]
        if not runs:
            continue
        line = {'row': row, 'label': ROWS[row]['label'], 'seeds': [r['seed'] for r in runs]}
        for key, pick in (('avg_density_cores', lambda r: 100 * r['averages']['density_cores']),
                          ('avg_density_memory', lambda r: 100 * r['averages']['density_memory']),
                          ('avg_empty_hosts', lambda r: r['averages']['empty_hosts']),
                          ('half_density_cores', lambda r: 100 * integrate(r, 'density_cores', 0.5)),
                          ('half_empty_hosts', lambda r: integrate(r, 'empty_hosts', 0.5)),
                          ('end_density_cores', lambda r: 100 * r['end_of_arrivals']['density_cores']),
                          ('end_density_memory', lambda r: 100 * r['end_of_arrivals']['density_memory']),
                          ('end_empty_hosts', lambda r: r['end_of_arrivals']['empty_hosts'])):
            line[key] = mean_spread([pick(r) for r in runs])
            line[key + '_per_seed'] = [round(pick(r), 2) for r in runs]
        line['rejected'] = sum(len(r['rejected']) for r in runs)
        line['mismatches'] = sum(len(r['mismatches']) for r in runs)
        line['max_differences'] = max(p['differences'] for r in runs for p in r['phases'])
        line['max_reconcile_changed'] = max(p['reconcile_changed'] for r in runs for p in r['phases'])
        line['ledger_ok'] = all(p['ledger_equals_placement'] for r in runs for p in r['phases'])
        line['phases'] = sum(len(r['phases']) for r in runs)
        line['decisions'] = dict(sum((collections.Counter(r['decisions']) for r in runs),
                                     collections.Counter()))
        line['run_s'] = [r.get('run_s') for r in runs]
        if parity:
            p = [parity[(row, r['seed'])] for r in runs if (row, r['seed']) in parity]
            if p:
                line['parity_differing'] = [x['differing'] for x in p]
                line['parity_predictions_differing'] = [
                    (x['predictions_differing'], x['predictions_differing_cache_hits']) for x in p]
                line['parity_compared'] = [x['compared'] for x in p]
        rows.append(line)
    return {'date': started_at, 'commit': commit, 'servers': args.servers, 'hosts': args.hosts,
            'every': args.every, 'day': args.day, 'rows': rows}


def fmt(pair, digits=1):
    m, s = pair
    if m is None:
        return '-'
    return '%.*f ± %.*f' % (digits, m, digits, s)


def markdown(summary):
    lines = ['| row | density, cores (%) | density, memory (%) | empty hosts | density, cores (%), '
             '2nd half | empty hosts, 2nd half | density, cores (%), at the end | density, memory '
             '(%), at the end | empty hosts, at the end | seeds |',
             '|---|---:|---:|---:|---:|---:|---:|---:|---:|---|']
    for line in summary['rows']:
        lines.append('| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |' % (
            line['label'], fmt(line['avg_density_cores']), fmt(line['avg_density_memory']),
            fmt(line['avg_empty_hosts']), fmt(line['half_density_cores']),
            fmt(line['half_empty_hosts']), fmt(line['end_density_cores']),
            fmt(line['end_density_memory']), fmt(line['end_empty_hosts']),
            ','.join(str(s) for s in line['seeds'])))
    lines.append('')
    lines.append('| row | servers placed where the allocator chose | rejected | most differences '
                 'after a phase (phases) | reconciliation changes | simulator parity: differing / '
                 'compared (predictions differing: all, cache hits), per seed | run time (s) per '
                 'seed |')
    lines.append('|---|---|---:|---:|---:|---|---|')
    for line in summary['rows']:
        placed = line['decisions'].get('placed', 0)
        total = sum(line['decisions'].values())
        chose = ('%d / %d (mismatches %d; %s)' % (placed - line['mismatches'], total,
                                                  line['mismatches'], line['decisions'])
                 if ROWS[line['row']]['weigher'] else 'n/a (weigher off: %s)' % line['decisions'])
        parity = ('-' if 'parity_differing' not in line else
                  ', '.join('%d / %d (%s)' % (d, c, 'not compared' if p[0] is None else '%d, %d' % p)
                            for d, c, p in zip(line['parity_differing'], line['parity_compared'],
                                               line['parity_predictions_differing'])))
        lines.append('| %s | %s | %d | %d (%d) | %d | %s | %s |' % (
            line['row'], chose, line['rejected'], line['max_differences'], line['phases'],
            line['max_reconcile_changed'], parity, ', '.join('%.0f' % s for s in line['run_s'])))
    return '\n'.join(lines) + '\n'


def svg(summary, results):
    """Two panels: time-averaged density (cores) and empty hosts per row, mean and each seed; and
    each row's density over the trace clock (first seed)."""
    colors = {'spread': '#d62728', 'stack': '#ff7f0e', 'pbfr': '#1f77b4', 'nilas-survival': '#2ca02c'}
    width, height = 900, 400
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
             'font-size="12">' % (width, height), '<rect width="100%" height="100%" fill="white"/>']
    # Panel 1: bars.
    x0, y0, w, h = 60, 40, 330, 280
    parts.append('<text x="%d" y="20" font-size="14">Time-averaged over the arrivals '
                 '(bars: mean; dots: seeds)</text>' % x0)
    metrics = [('avg_density_cores', 'density, cores (%)', 100.0),
               ('avg_empty_hosts', 'empty hosts (of %d)' % summary['hosts'], float(summary['hosts']))]
    group_w = w / len(metrics)
    bar_w = group_w / (len(summary['rows']) + 1)
    parts.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (x0, y0 + h, x0 + w, y0 + h))
    for gi, (key, label, top) in enumerate(metrics):
        gx = x0 + gi * group_w
        parts.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (gx + group_w / 2, y0 + h + 18, label))
        parts.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#666">scale 0 to %g</text>'
                     % (gx + group_w / 2, y0 + h + 34, top))
        for ri, line in enumerate(summary['rows']):
            m = line[key][0] or 0.0
            bx = gx + bar_w * (ri + 0.5)
            bh = h * m / top
            parts.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" opacity="0.8"/>'
                         % (bx, y0 + h - bh, bar_w * 0.9, bh, colors[line['row']]))
            parts.append('<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%.1f</text>'
                         % (bx + bar_w * 0.45, y0 + h - bh - 4, m))
            for v in line[key + '_per_seed']:
                parts.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="black"/>'
                             % (bx + bar_w * 0.45, y0 + h - h * v / top))
    # Panel 2: density over time, first seed of each row.
    x1, w1 = 470, 400
    parts.append('<text x="%d" y="20" font-size="14">Density (cores) over the trace clock, seed %s</text>'
                 % (x1, summary['rows'][0]['seeds'][0] if summary['rows'] else ''))
    parts.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (x1, y0 + h, x1 + w1, y0 + h))
    parts.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (x1, y0, x1, y0 + h))
    for pct in (0, 25, 50, 75, 100):
        y = y0 + h - h * pct / 100.0
        parts.append('<text x="%d" y="%.1f" text-anchor="end" font-size="10">%d%%</text>' % (x1 - 4, y + 3, pct))
    first_seed = {}
    for r in results:
        first_seed.setdefault(r['row'], r)
        if r['seed'] < first_seed[r['row']]['seed']:
            first_seed[r['row']] = r
    if first_seed:
        t0 = min(r['window_s'][0] for r in first_seed.values())
        t1 = max(r['window_s'][1] for r in first_seed.values())
        span = max(t1 - t0, 1.0)
        for hour in range(0, int(span // 3600) + 1, 2):
            x = x1 + w1 * hour * 3600 / span
            parts.append('<text x="%.1f" y="%d" text-anchor="middle" font-size="10">%dh</text>'
                         % (x, y0 + h + 14, hour))
        parts.append('<text x="%d" y="%d" text-anchor="middle">hours after the first arrival (day %d)</text>'
                     % (x1 + w1 / 2, y0 + h + 30, summary['day']))
        for li, (row, r) in enumerate(first_seed.items()):
            points = []
            prev = None
            for s in r['series']:
                if s['t'] > r['window_s'][1]:
                    break
                x = x1 + w1 * (s['t'] - t0) / span
                y = y0 + h - h * s['density_cores']
                if prev is not None:
                    points.append('%.1f,%.1f' % (x, prev))
                points.append('%.1f,%.1f' % (x, y))
                prev = y
            parts.append('<polyline fill="none" stroke="%s" stroke-width="1.2" points="%s"/>'
                         % (colors[row], ' '.join(points)))
            parts.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>'
                         % (60 + 200 * li, height - 22, colors[row], 74 + 200 * li, height - 13,
                            SHORT[row]))
    parts.append('</svg>')
    return '\n'.join(parts) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--servers', type=int, default=300)
    parser.add_argument('--hosts', type=int, default=20)
    parser.add_argument('--every', type=int, default=10, help='every n-th request of the day')
    parser.add_argument('--day', type=int, default=10)
    parser.add_argument('--seeds', default='1,2,3')
    parser.add_argument('--rows', default=','.join(ROWS),
                        help='of %s' % ', '.join(ROWS))
    parser.add_argument('--phases', type=int, default=5)
    parser.add_argument('--inference-timeout-ms', type=int, default=1000,
                        help="the control service's [inference] timeout_ms")
    parser.add_argument('--parity', action='store_true', help='compare the plug-in rows with simulate')
    parser.add_argument('--summary-only', action='store_true', help='only the summary of existing runs')
    parser.add_argument('--out', required=True)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(',') if s]
    rows = [r for r in args.rows.split(',') if r]
    for row in rows:
        if row not in ROWS:
            parser.error('unknown row %r (%s)' % (row, ', '.join(ROWS)))
    runs_dir = os.path.join(args.out, 'runs')
    os.makedirs(runs_dir, exist_ok=True)
    started_at = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=stack_mod.REPO,
                            capture_output=True, text=True).stdout.strip()
    results = []
    # Seed by seed, each row in turn: an interrupted experiment has whole seeds.
    for seed in seeds:
        for row in rows:
            path = os.path.join(runs_dir, '%s-seed%d.json' % (row, seed))
            if os.path.exists(path):
                with open(path) as f:
                    results.append(json.load(f))
                continue
            if args.summary_only:
                continue
            sys.stderr.write('== %s, seed %d (%s)\n' % (row, seed, time.strftime('%H:%M:%S')))
            result = run_one(row, seed, args, path)
            sys.stderr.write('   %.0f s; averages %s; end %s\n' % (
                result['run_s'], result['averages'], result['end_of_arrivals']))
            results.append(result)
    parity = {}
    if args.parity:
        workdir = os.path.join(args.out, 'parity')
        os.makedirs(workdir, exist_ok=True)
        for result in results:
            if 'simulate' in ROWS[result['row']]:
                parity[(result['row'], result['seed'])] = p = simulate_parity(result, args, workdir)
                sys.stderr.write('parity %s seed %d: %d of %d differ (predictions: %s)\n' % (
                    result['row'], result['seed'], p['differing'], p['compared'],
                    p['predictions_differing']))
        with open(os.path.join(args.out, 'parity.json'), 'w') as f:
            json.dump({'%s-seed%d' % k: v for k, v in parity.items()}, f, indent=1, sort_keys=True)
    summary = summarize(results, args, parity, commit, started_at)
    with open(os.path.join(args.out, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    text = markdown(summary)
    with open(os.path.join(args.out, 'summary.md'), 'w') as f:
        f.write(text)
    with open(os.path.join(args.out, 'packing.svg'), 'w') as f:
        f.write(svg(summary, results))
    sys.stdout.write(text)


if __name__ == '__main__':
    main()
