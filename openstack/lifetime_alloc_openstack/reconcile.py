"""The reconciliation from Placement: the allocator's hosts and VMs made equal to Placement's
resource providers and their allocations, and a report of what changed.

- **Hosts**: every compute-node resource provider (one with VCPU and MEMORY_MB inventory) is a
  host of the allocator, named by the provider's name (the hypervisor hostname, Nova's node) with
  capacity (total - reserved) x allocation_ratio of each resource; its state is ``unavailable``
  while Nova's compute service is disabled (Placement's ``COMPUTE_STATUS_DISABLED`` trait), else
  ``available`` (a host the allocator holds as ``failed`` stays failed). A host that is no provider
  any more is removed when it holds no VM, else kept and reported.
- **VMs**: every consumer of a provider (an instance, or a migration holding the source during a
  resize) is recorded on that host; every VM of the allocator that Placement no longer holds is
  released, except those placed within ``reservation_grace`` seconds (a boot in flight between the
  weigher's reservation and Nova's claim) and those the listener has just released.

:func:`differences` compares the two sides and is what the reconciliation acts on; the tests assert
it is empty after every phase.
"""

import sys
import time

from keystoneauth1 import loading as ks_loading
from oslo_log import log as logging

from lifetime_alloc_openstack import client as client_mod
from lifetime_alloc_openstack import mapping

LOG = logging.getLogger(__name__)

PLACEMENT_GROUP = 'placement'
# 1.38: consumer types in GET /allocations/{consumer}; 1.14: root providers in the listing.
MICROVERSION = 'placement 1.38'
DISABLED_TRAIT = 'COMPUTE_STATUS_DISABLED'


def register_placement_opts(conf):
    """Nova's ``[placement]`` keystoneauth options (session, auth type, adapter with the service
    type ``placement`` and the interfaces internal, public), as Nova registers them; the auth
    plugin's own options are registered when it is loaded. Options registered already (in Nova's
    own process) are left as they are."""
    from oslo_config import cfg
    adapter_opts = ks_loading.get_adapter_conf_options(include_deprecated=False)
    cfg.set_defaults(adapter_opts, valid_interfaces=['internal', 'public'],
                     service_type='placement')
    for register in (lambda: ks_loading.register_session_conf_options(conf, PLACEMENT_GROUP),
                     lambda: ks_loading.register_auth_conf_options(conf, PLACEMENT_GROUP),
                     lambda: conf.register_opts(adapter_opts, group=PLACEMENT_GROUP)):
        try:
            register()
        except cfg.DuplicateOptError:
            pass


class PlacementReader(object):
    """Read-only access to Placement through a keystoneauth adapter."""

    def __init__(self, adapter):
        self.adapter = adapter

    @classmethod
    def from_conf(cls, conf):
        """The adapter ``[placement]`` of nova.conf describes (auth, endpoint, interfaces)."""
        register_placement_opts(conf)
        auth = ks_loading.load_auth_from_conf_options(conf, PLACEMENT_GROUP)
        session = ks_loading.load_session_from_conf_options(conf, PLACEMENT_GROUP, auth=auth)
        adapter = ks_loading.load_adapter_from_conf_options(
            conf, PLACEMENT_GROUP, session=session, auth=auth)
        return cls(adapter)

    def get(self, path):
        response = self.adapter.get(path, headers={'OpenStack-API-Version': MICROVERSION},
                                    raise_exc=False)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise RuntimeError('Placement GET %s: %d %s' % (path, response.status_code,
                                                           response.text[:200]))
        return response.json()

    def providers(self):
        return (self.get('/resource_providers') or {}).get('resource_providers', [])

    def inventories(self, uuid):
        return (self.get('/resource_providers/%s/inventories' % uuid) or {}).get('inventories', {})

    def traits(self, uuid):
        return (self.get('/resource_providers/%s/traits' % uuid) or {}).get('traits', [])

    def allocations(self, uuid):
        """``{consumer uuid: {resource class: amount}}`` of one provider."""
        allocs = (self.get('/resource_providers/%s/allocations' % uuid) or {}).get('allocations', {})
        return {consumer: dict(a.get('resources', {})) for consumer, a in allocs.items()}

    def consumer(self, consumer_uuid):
        """``GET /allocations/{consumer}``: its ``project_id``, ``user_id``, ``consumer_type``."""
        return self.get('/allocations/%s' % consumer_uuid) or {}


def read_placement(placement):
    """Placement's view: ``{host id: {"uuid", "capacity", "state", "vms": {consumer: demand}}}``
    of the compute-node providers (nested providers and ones without compute inventory left out;
    a provider whose name is no allocator id is reported in ``"unusable"``)."""
    hosts, unusable = {}, []
    for rp in placement.providers():
        uuid = rp['uuid']
        root = rp.get('root_provider_uuid')
        if root and root != uuid:
            continue
        capacity = mapping.capacity_from_inventory(placement.inventories(uuid))
        if capacity is None:
            continue
        name = rp.get('name')
        if not (isinstance(name, str) and mapping.ID_RE.match(name)):
            unusable.append(name)
            continue
        disabled = DISABLED_TRAIT in placement.traits(uuid)
        vms = {consumer: mapping.demand_from_resources(resources)
               for consumer, resources in placement.allocations(uuid).items()}
        hosts[name] = {'uuid': uuid, 'capacity': capacity,
                       'state': 'unavailable' if disabled else 'available', 'vms': vms}
    return hosts, unusable


def read_allocator(client):
    """The allocator's view: ``{host id: {"state", "capacity", "used", "vms": [ids]}}``."""
    hosts = {}
    for entry in client.hosts():
        info = entry.get('host', entry)
        hosts[info['host_id']] = {'state': info.get('state'), 'capacity': info.get('capacity'),
                                  'used': info.get('used'), 'vms': list(entry.get('vms', []))}
    return hosts


def _desired_state(allocator_state, placement_state):
    if allocator_state == 'failed':
        return 'failed'
    return placement_state


def differences(placement_hosts, allocator_hosts):
    """Every way the allocator differs from Placement, as sorted texts (empty: equal): hosts
    missing or extra, capacities, states, VMs missing, extra or on another host, used resources."""
    diffs = []
    vm_host = {}
    for host_id, info in allocator_hosts.items():
        for vm in info['vms']:
            vm_host[vm] = host_id
    placed = {}
    for host_id, info in placement_hosts.items():
        for vm in info['vms']:
            placed[vm] = host_id
    for host_id in sorted(set(placement_hosts) - set(allocator_hosts)):
        diffs.append('host %s: in Placement, not in the allocator' % host_id)
    for host_id in sorted(set(allocator_hosts) - set(placement_hosts)):
        diffs.append('host %s: in the allocator, not in Placement' % host_id)
    for host_id in sorted(set(placement_hosts) & set(allocator_hosts)):
        want, have = placement_hosts[host_id], allocator_hosts[host_id]
        if mapping.base_units(want['capacity']) != mapping.base_units(have['capacity']):
            diffs.append('host %s: capacity %s in the allocator, %s in Placement'
                         % (host_id, have['capacity'], want['capacity']))
        if _desired_state(have['state'], want['state']) != have['state']:
            diffs.append('host %s: %s in the allocator, %s in Nova' % (host_id, have['state'],
                                                                       want['state']))
        used = [0, 0, 0]
        for demand in want['vms'].values():
            used = [a + b for a, b in zip(used, mapping.base_units(demand))]
        if have.get('used') is not None and list(mapping.base_units(have['used'])) != used:
            diffs.append('host %s: used %s in the allocator, %s (base units) in Placement'
                         % (host_id, have['used'], used))
    for vm in sorted(set(placed) | set(vm_host)):
        if placed.get(vm) != vm_host.get(vm):
            diffs.append('vm %s: on %s in the allocator, on %s in Placement'
                         % (vm, vm_host.get(vm), placed.get(vm)))
    return diffs


class Report(object):
    """What one reconciliation changed (ids per kind) and what it left, with why."""

    KINDS = ('hosts_added', 'hosts_updated', 'hosts_removed', 'hosts_kept', 'vms_recorded',
             'vms_moved', 'vms_resized', 'vms_released', 'vms_in_flight', 'errors')

    def __init__(self):
        for kind in self.KINDS:
            setattr(self, kind, [])
        self.differences_before = 0
        self.seconds = 0.0

    @property
    def changed(self):
        return sum(len(getattr(self, kind)) for kind in self.KINDS
                   if kind not in ('hosts_kept', 'vms_in_flight', 'errors'))

    def as_dict(self):
        out = {kind: list(getattr(self, kind)) for kind in self.KINDS}
        out['changed'] = self.changed
        out['differences_before'] = self.differences_before
        out['seconds'] = round(self.seconds, 3)
        return out

    def summary(self):
        counts = ', '.join('%s %d' % (kind, len(getattr(self, kind))) for kind in self.KINDS
                           if getattr(self, kind))
        return 'reconciliation: %d differences found, %d changes (%s) in %.2f s' % (
            self.differences_before, self.changed, counts or 'none', self.seconds)


def _record_request(client, placement, vm_id, demand, existing):
    """The request recorded for a consumer the allocator lacks or holds elsewhere: its own facts
    when it holds the VM, else the consumer's project and type from Placement."""
    if existing:
        request = {'vm_id': vm_id, 'tenant_id': existing['tenant_id'],
                   'vm_type': existing['vm_type'], 'demand': demand, 'zone': client.zone}
        return request
    consumer = placement.consumer(vm_id)
    project = consumer.get('project_id')
    if not project:
        raise mapping.MappingError('Placement names no project for consumer %s' % vm_id)
    kind = (consumer.get('consumer_type') or 'INSTANCE').lower()
    return {'vm_id': mapping.check_id(vm_id, 'the consumer uuid'),
            'tenant_id': mapping.check_id(project, 'the project id'),
            'vm_type': 'nova-%s' % kind, 'demand': mapping.check_demand(dict(demand)),
            'zone': client.zone}


def resize(client, vm_id, host_id, request):
    """Gives ``vm_id`` (on ``host_id``) the demand of ``request``: the allocator takes a resized
    server's new demand where it is, keeping its placement time and prediction (no exit). True
    when it changed anything."""
    answer = client.record(vm_id, host_id, request) or {}
    return answer.get('recorded') in ('resized', 'moved', 'placed')


def reconcile(client, placement, grace_s=300.0, remove_unknown_hosts=True,
              released_by_listener=None, now=None):
    """Makes the allocator behind ``client`` equal to Placement; returns the :class:`Report`."""
    started = time.monotonic()
    now = time.time() if now is None else now
    report = Report()
    want, unusable = read_placement(placement)
    for name in unusable:
        report.errors.append('provider %r: its name is no allocator host id' % (name,))
    have = read_allocator(client)
    report.differences_before = len(differences(want, have))

    def attempt(kind, what, call):
        try:
            call()
            getattr(report, kind).append(what)
        except (client_mod.ControlError, mapping.MappingError) as exc:
            report.errors.append('%s %s: %s' % (kind, what, exc))

    # Hosts first, so that VMs can be recorded on them.
    for host_id, info in sorted(want.items()):
        current = have.get(host_id)
        state = _desired_state(current and current['state'], info['state'])
        if current is None:
            attempt('hosts_added', host_id, lambda: client.put_host(host_id, info['capacity'], state))
        elif (mapping.base_units(current['capacity']) != mapping.base_units(info['capacity'])
              or current['state'] != state):
            attempt('hosts_updated', host_id,
                    lambda: client.put_host(host_id, info['capacity'], state))

    where = {vm: host_id for host_id, info in have.items() for vm in info['vms']}
    consumers = {vm: (host_id, demand) for host_id, info in want.items()
                 for vm, demand in info['vms'].items()}
    # Releases before records: they free the room a moved VM may need.
    for vm in sorted(set(where) - set(consumers)):
        existing = client.lookup(vm)
        if existing is None:
            continue
        placed_at = existing.get('placed_at_s')
        if placed_at is not None and now - placed_at < grace_s:
            report.vms_in_flight.append(vm)
            continue
        attempt('vms_released', vm, lambda: client.release(vm))
    for vm, (host_id, demand) in sorted(consumers.items()):
        if where.get(vm) == host_id:
            continue
        if released_by_listener is not None and released_by_listener(vm):
            continue
        kind = 'vms_moved' if vm in where else 'vms_recorded'
        existing = client.lookup(vm) if vm in where else None

        def record(vm=vm, host_id=host_id, demand=demand, existing=existing):
            client.record(vm, host_id, _record_request(client, placement, vm, demand, existing))
        attempt(kind, vm, record)

    # A server resized while nobody listened: the hosts whose used resources still differ are
    # looked at VM by VM, and each VM whose demand differs is recorded with Placement's.
    if report.differences_before:
        now_have = read_allocator(client)
        for host_id, info in sorted(want.items()):
            current = now_have.get(host_id)
            if current is None or not differences({host_id: info}, {host_id: current}):
                continue
            for vm, demand in sorted(info['vms'].items()):
                if vm not in current['vms']:
                    continue
                existing = client.lookup(vm)
                if existing is None:
                    continue

                def redo(vm=vm, host_id=host_id, demand=demand, existing=existing):
                    request = _record_request(client, placement, vm, demand, existing)
                    resize(client, vm, host_id, request)
                if mapping.base_units(existing.get('demand')) != mapping.base_units(demand):
                    attempt('vms_resized', vm, redo)

    if remove_unknown_hosts:
        for host_id in sorted(set(have) - set(want)):
            if have[host_id]['vms'] and any(vm in where and vm not in report.vms_released
                                            for vm in have[host_id]['vms']):
                report.hosts_kept.append(host_id)
                continue
            attempt('hosts_removed', host_id, lambda: client.delete_host(host_id))
    report.seconds = time.monotonic() - started
    LOG.info('lifetime_alloc: %s', report.summary())
    if report.errors:
        LOG.warning('lifetime_alloc: reconciliation errors: %s', '; '.join(report.errors[:20]))
    return report


def main(argv=None):
    """``lifetime-alloc-nova-reconcile --config-file /etc/nova/nova.conf [--dry-run]``: one
    reconciliation; prints its report as JSON (exit 1 when anything could not be done)."""
    import json
    from oslo_config import cfg
    from lifetime_alloc_openstack import listener
    args = list(sys.argv[1:] if argv is None else argv)
    dry_run_opt = cfg.BoolOpt('dry-run', default=False,
                              help='Print the differences between Placement and the allocator; '
                                   'change nothing.')
    conf = listener.load_conf(args, 'lifetime-alloc-nova-reconcile', [dry_run_opt])
    dry_run = conf.dry_run
    control = client_mod.ControlClient.from_conf(conf.lifetime_alloc)
    if control is None:
        print('[lifetime_alloc] control_url is not set', file=sys.stderr)
        return 2
    try:
        placement = PlacementReader.from_conf(conf)
        if dry_run:
            want, _ = read_placement(placement)
            diffs = differences(want, read_allocator(control))
            print(json.dumps({'differences': diffs}, indent=2))
            return 0
        report = reconcile(control, placement, grace_s=conf.lifetime_alloc.reservation_grace,
                           remove_unknown_hosts=conf.lifetime_alloc.remove_unknown_hosts)
    except Exception as exc:  # Placement or the control service away, a configuration error
        print('lifetime-alloc-nova-reconcile: failed: %s: %s' % (type(exc).__name__, exc),
              file=sys.stderr)
        return 1
    print(json.dumps(report.as_dict(), indent=2))
    return 1 if report.errors else 0


if __name__ == '__main__':
    sys.exit(main())
