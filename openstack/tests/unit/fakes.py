"""In-memory stand-ins of the control service (as ``ControlClient`` calls it) and of Placement
(as ``PlacementReader`` reads it), for the unit tests of the listener and the reconciliation."""

from lifetime_alloc_openstack import client, mapping


class FakeControl(object):
    """The control service's routes over a dict of hosts; ``down = True`` makes every call
    :class:`client.Unreachable`; ``calls`` lists what was called."""

    zone = 'zone-1'

    def __init__(self, hosts=None, now=1000.0):
        self.hosts_ = {h: {'capacity': dict(c), 'state': 'available'} for h, c in (hosts or {}).items()}
        self.vms = {}  # vm -> {'host_id', 'request', 'placed_at_s'}
        self.calls = []
        self.down = False
        self.now = now

    def _call(self, *what):
        self.calls.append(what)
        if self.down:
            raise client.Unreachable('down')

    def allocate(self, request):
        self._call('allocate', request['vm_id'])
        vm = self.vms.get(request['vm_id'])
        if vm is None:
            host = sorted(request['candidates'])[0]
            vm = self.vms[request['vm_id']] = {'host_id': host, 'request': request,
                                              'placed_at_s': self.now}
        return {'status': 'placed', 'placements': [{'vm_id': request['vm_id'], 'host_id': vm['host_id']}]}

    def record(self, vm_id, host_id, request):
        self._call('record', vm_id, host_id)
        if host_id not in self.hosts_:
            raise client.NotFound('unknown host', 404, {'type': 'urn:problem:unknown-host'})
        vm = self.vms.get(vm_id)
        # As the allocator: a resized VM takes the request's demand and type, keeping the rest.
        resized = vm is not None and (vm['request'].get('demand'), vm['request'].get('vm_type')) != (
            request.get('demand'), request.get('vm_type'))
        if resized:
            vm['request'] = dict(vm['request'], demand=request.get('demand'), vm_type=request.get('vm_type'))
        if vm is not None and vm['host_id'] == host_id:
            return {'vm_id': vm_id, 'host_id': host_id, 'recorded': 'resized' if resized else 'unchanged'}
        if vm is not None:
            vm['host_id'] = host_id
            return {'vm_id': vm_id, 'host_id': host_id, 'recorded': 'moved'}
        self.vms[vm_id] = {'host_id': host_id, 'request': request, 'placed_at_s': self.now}
        return {'vm_id': vm_id, 'host_id': host_id, 'recorded': 'placed'}

    def release(self, vm_id, ended_at_s=None):
        self._call('release', vm_id, ended_at_s)
        return self.vms.pop(vm_id, None) is not None

    def lookup(self, vm_id):
        self._call('lookup', vm_id)
        vm = self.vms.get(vm_id)
        if vm is None:
            return None
        return {'vm_id': vm_id, 'host_id': vm['host_id'], 'tenant_id': vm['request']['tenant_id'],
                'vm_type': vm['request']['vm_type'], 'demand': vm['request']['demand'],
                'placed_at_s': vm['placed_at_s']}

    def used(self, host_id):
        used = [0, 0, 0]
        for vm in self.vms.values():
            if vm['host_id'] == host_id:
                used = [a + b for a, b in zip(used, mapping.base_units(vm['request']['demand']))]
        return {'cores': used[0] / 1000.0, 'memory_gib': used[1] / 1024.0, 'ssd_gib': used[2] / 1024.0}

    def hosts(self):
        self._call('hosts')
        return [{'host_id': h, 'state': info['state'], 'capacity': info['capacity'],
                 'used': self.used(h),
                 'vms': sorted(v for v, vm in self.vms.items() if vm['host_id'] == h)}
                for h, info in sorted(self.hosts_.items())]

    def put_host(self, host_id, capacity, state=None):
        self._call('put_host', host_id, state)
        host = self.hosts_.setdefault(host_id, {'state': 'available'})
        host['capacity'] = dict(capacity)
        if state:
            host['state'] = state
        return {'host_id': host_id}

    def delete_host(self, host_id):
        self._call('delete_host', host_id)
        if any(vm['host_id'] == host_id for vm in self.vms.values()):
            raise client.Conflict('VMs on it', 409, {})
        return self.hosts_.pop(host_id, None) is not None


INVENTORY = {'VCPU': {'total': 2, 'reserved': 0, 'allocation_ratio': 4.0},
             'MEMORY_MB': {'total': 8192, 'reserved': 512, 'allocation_ratio': 1.0},
             'DISK_GB': {'total': 1028, 'reserved': 0, 'allocation_ratio': 1.0}}
CAPACITY = {'cores': 8.0, 'memory_gib': 7.5, 'ssd_gib': 1028.0}
TINY = {'VCPU': 1, 'MEMORY_MB': 512, 'DISK_GB': 1}


class FakePlacement(object):
    """Resource providers by name: ``add(name)``, ``allocate(name, consumer)``."""

    def __init__(self):
        self.rps = {}
        self.consumers = {}

    def add(self, name, inventory=INVENTORY, traits=()):
        self.rps[name] = {'uuid': 'rp-' + name, 'inv': dict(inventory), 'traits': list(traits), 'allocs': {}}

    def allocate(self, name, consumer, resources=TINY, project='p1', consumer_type='INSTANCE'):
        self.rps[name]['allocs'][consumer] = dict(resources)
        self.consumers[consumer] = {'project_id': project, 'user_id': 'u1',
                                    'consumer_type': consumer_type}

    def free(self, consumer):
        for rp in self.rps.values():
            rp['allocs'].pop(consumer, None)
        self.consumers.pop(consumer, None)

    def _by_uuid(self, uuid):
        return next(rp for rp in self.rps.values() if rp['uuid'] == uuid)

    def providers(self):
        return [{'uuid': rp['uuid'], 'name': name, 'root_provider_uuid': rp['uuid']}
                for name, rp in sorted(self.rps.items())]

    def inventories(self, uuid):
        return self._by_uuid(uuid)['inv']

    def traits(self, uuid):
        return self._by_uuid(uuid)['traits']

    def allocations(self, uuid):
        return dict(self._by_uuid(uuid)['allocs'])

    def consumer(self, consumer):
        return self.consumers.get(consumer, {})
