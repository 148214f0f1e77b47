"""A piece of the project's seeded synthetic trace as a sequence of Nova boots and deletes.

``vmtrace generate`` (the project's binary) writes day 0 of the seed-42 trace; from 10:00 every
``every``-th request is kept, up to ``count`` VMs, and their arrivals and exits are merged in time
order, so that lifetimes mean what they meant in the trace (exits within the window happen there;
VMs still running at its end are deleted afterwards). Shapes are scaled to the harness's small
compute nodes (8 cores, 7.5 GiB; a VM has at most 2 VCPUs there, the physical cores, Placement's
max_unit): a quarter of the cores (1 or 2), 1/16 of the memory (256 MB to 4 GiB); flavors keep the trace's VM type as their name.
"""

import csv
import math
import os
import subprocess
import tempfile

from tests.functional import stack as stack_mod


class Vm(object):
    def __init__(self, row):
        self.trace_id = row['vm_id']
        self.tenant = row['tenant_id']
        self.vm_type = row['vm_type']
        self.vcpus = min(2, max(1, int(math.ceil(float(row['cores']) / 4))))
        self.ram_mb = min(4096, max(256, int(float(row['memory_gib']) * 64)))
        self.start_s = float(row['start_s'])
        self.end_s = float(row['end_s']) if row.get('end_s') else None
        self.os = row.get('os') or None

    @property
    def flavor(self):
        return (self.vm_type, self.vcpus, self.ram_mb)


def events(count=48, every=40, start_s=36000.0, seed=42):
    """``[(time, 'boot'|'delete', Vm)]`` in time order (exits before arrivals at equal times)."""
    binary = os.path.join(stack_mod.bin_dir(), 'vmtrace')
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'trace.csv')
        subprocess.run([binary, 'generate', '--out', path, '--days', '1', '--seed', str(seed)],
                       check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            rows = [r for r in csv.DictReader(f) if float(r['start_s']) >= start_s]
    rows.sort(key=lambda r: float(r['start_s']))
    vms = [Vm(r) for r in rows[::every][:count]]
    last = vms[-1].start_s
    out = [(vm.start_s, 'boot', vm) for vm in vms]
    out += [(vm.end_s, 'delete', vm) for vm in vms if vm.end_s is not None and vm.end_s <= last]
    out.sort(key=lambda e: (e[0], e[1] == 'boot'))
    return out
