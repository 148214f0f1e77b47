"""From Nova's and Placement's shapes to the allocator's wire shapes: a RequestSpec to a VM
request, a versioned notification to a VM request and its host, a resource provider's inventory to
a host capacity, Placement's resource amounts to a demand.

Pure functions of plain values (a RequestSpec is read through its attributes only), so that they
are tested without Nova. A request the allocator could not read raises :class:`MappingError`
naming what is wrong; the callers turn it into neutral weights (the weigher) or a skipped event
(the listener), with a log line.
"""

import datetime
import math
import re

ID_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$')
MAX_TEXT_BYTES = 256
MAX_FEATURES = 64
MIB_PER_GIB = 1024.0
# Scheduler hints that Nova's own filters read: ids of servers and groups, no request fact.
NOVA_HINTS = frozenset(['group', 'same_host', 'different_host', 'query', 'target_cell',
                        'build_near_host_ip', 'cidr', 'requested_at_s', 'priority',
                        'lifetime'])
# The feature a user's lifetime hint (seconds) becomes, as the model reads it.
LIFETIME_FEATURE = 'lifetime'


class MappingError(ValueError):
    """A request the allocator could not read; ``reason`` says what (for the log line)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def check_id(value, what):
    """``value`` as an id of the allocator's charset, else :class:`MappingError` naming ``what``."""
    if not isinstance(value, str) or not ID_RE.match(value):
        raise MappingError('%s %r is not an id the allocator accepts (%s)' % (what, value, ID_RE.pattern))
    return value


def check_text(value, what):
    """``value`` as a text of 1 to 256 bytes without control characters."""
    if not isinstance(value, str) or not value:
        raise MappingError('%s is missing' % what)
    if len(value.encode('utf-8')) > MAX_TEXT_BYTES:
        raise MappingError('%s %r is over %d bytes' % (what, value[:40], MAX_TEXT_BYTES))
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise MappingError('%s %r holds a control character' % (what, value))
    return value


def _number(value):
    """``value`` as a finite float, or None (texts that parse as numbers count)."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def feature_value(value):
    """A feature's wire value: a number (booleans as 1/0), or a text of at most 256 bytes without
    control characters; None when the value cannot be one (lists, objects, long texts)."""
    if isinstance(value, (bool, int, float)):
        return _number(value)
    if isinstance(value, str):
        if not value or len(value.encode('utf-8')) > MAX_TEXT_BYTES:
            return None
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            return None
        return value
    return None


def _single(value):
    """A scheduler hint's value: Nova keeps every hint as a list of strings."""
    if isinstance(value, (list, tuple)):
        return value[0] if len(value) == 1 else None
    return value


class Features(object):
    """Features gathered in priority order, at most ``limit``, each name 1 to 256 bytes; what is
    left out is counted (``skipped``) for the log."""

    def __init__(self, limit=MAX_FEATURES):
        self.limit = min(limit, MAX_FEATURES)
        self.values = {}
        self.skipped = []

    def add(self, name, value):
        if name in self.values:
            return
        wire = feature_value(value)
        if wire is None or not name or len(name.encode('utf-8')) > MAX_TEXT_BYTES \
                or len(self.values) >= self.limit:
            self.skipped.append(name)
            return
        self.values[name] = wire

    def add_all(self, prefix, mapping):
        for key in sorted(mapping or {}):
            self.add(prefix + str(key), mapping[key])


def demand_from_resources(resources):
    """Placement's resource amounts (``{"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}``) as the
    allocator's demand: cores = VCPU + PCPU, memory_gib = MEMORY_MB / 1024, ssd_gib = DISK_GB."""
    resources = resources or {}
    cores = float(resources.get('VCPU', 0) or 0) + float(resources.get('PCPU', 0) or 0)
    memory = float(resources.get('MEMORY_MB', 0) or 0) / MIB_PER_GIB
    demand = {'cores': cores, 'memory_gib': memory}
    if resources.get('DISK_GB'):
        demand['ssd_gib'] = float(resources['DISK_GB'])
    return demand


def resources_from_flavor(flavor, is_bfv=False):
    """The amounts Nova asks Placement for a flavor (``nova.scheduler.utils.resources_from_flavor``
    without extra-spec overrides): VCPU, MEMORY_MB and DISK_GB = root (none when booted from a
    volume) + ephemeral + swap rounded up to whole GB. ``flavor`` is a dict or an object."""
    get = _getter(flavor)
    disk = (0 if is_bfv else int(get('root_gb') or 0)) + int(get('ephemeral_gb') or 0)
    swap = int(get('swap') or 0)
    disk += int(math.ceil(swap / 1024.0))
    return {'VCPU': int(get('vcpus') or 0), 'MEMORY_MB': int(get('memory_mb') or 0),
            'DISK_GB': disk}


def check_demand(demand):
    for field in ('cores', 'memory_gib'):
        value = demand.get(field)
        if value is None or not math.isfinite(value) or value <= 0 or value > 1e9:
            raise MappingError('the flavor\'s %s is %r; the allocator needs a positive amount'
                               % (field, value))
    ssd = demand.get('ssd_gib', 0.0)
    if not math.isfinite(ssd) or ssd < 0 or ssd > 1e9:
        raise MappingError('the flavor\'s ssd_gib is %r' % ssd)
    return demand


def _getter(obj):
    """A reader of ``obj``'s fields that works for dicts and for Nova objects (an unset field of a
    versioned object reads as None instead of raising or lazy-loading)."""
    if isinstance(obj, dict):
        return obj.get

    def get(name):
        if obj is None:
            return None
        is_set = getattr(obj, 'obj_attr_is_set', None)
        if is_set is not None:
            try:
                if not is_set(name):
                    return None
            except Exception:  # an unknown field name
                return None
        return getattr(obj, name, None)
    return get


def image_properties(image):
    """An image's properties (a Nova ``ImageMeta`` or a dict) as a plain dict of set fields."""
    if image is None:
        return {}
    props = _getter(image)('properties')
    if props is None:
        return {}
    if isinstance(props, dict):
        return dict(props)
    to_primitive = getattr(props, 'obj_to_primitive', None)
    if to_primitive is not None:
        return dict(to_primitive().get('nova_object.data', {}))
    return {}


def hints_of(spec):
    """A RequestSpec's scheduler hints, each as a single value where Nova holds a list of one."""
    hints = _getter(spec)('scheduler_hints') or {}
    return {str(k): _single(v) for k, v in dict(hints).items()}


def is_move(spec):
    """Whether the RequestSpec is for a server that exists already (rebuild, migration, resize,
    evacuation): Nova's internal check-type hint, or hosts to ignore (the source host)."""
    hints = _getter(spec)('scheduler_hints') or {}
    if '_nova_check_type' in hints:
        return True
    return bool(_getter(spec)('ignore_hosts'))


def request_facts(features, hints):
    """The typed facts a request's hints carry: ``requested_at_s`` (a number, on the allocator's
    request clock) and ``priority`` (``low`` or ``regular``); the ``lifetime`` hint as the feature
    ``lifetime`` (a number of seconds when it parses)."""
    facts = {}
    at = _number(hints.get('requested_at_s'))
    if at is not None and at >= 0:
        facts['requested_at_s'] = at
    priority = hints.get('priority')
    if priority in ('low', 'regular'):
        facts['priority'] = priority
    lifetime = hints.get('lifetime')
    if lifetime is not None:
        number = _number(lifetime)
        features.add(LIFETIME_FEATURE, number if number is not None else lifetime)
    return facts


def request_from_spec(spec, zone, candidates, resources=None, max_features=MAX_FEATURES):
    """The VM request (the wire's ``VmRequest``) for a RequestSpec, choosing among ``candidates``
    (host ids). ``resources`` are the amounts Nova asks Placement for (the flavor's when None).

    Features, in this order until 64: the ``lifetime`` hint, the other scheduler hints
    (``hint.<key>``), the image's properties (``image.<name>``), the flavor's extra specs
    (``flavor.<key>``). The OS is the image's ``os_distro``, else its ``os_type``."""
    get = _getter(spec)
    vm_id = check_id(get('instance_uuid'), 'the instance uuid')
    project = get('project_id')
    if not project:
        raise MappingError('the request has no project (project_id is missing)')
    tenant = check_id(project, 'the project id')
    flavor = get('flavor')
    if flavor is None:
        raise MappingError('the request has no flavor')
    flavor_get = _getter(flavor)
    vm_type = check_text(flavor_get('name'), 'the flavor name')
    if resources is None:
        resources = resources_from_flavor(flavor, bool(get('is_bfv')))
    demand = check_demand(demand_from_resources(resources))
    hints = hints_of(spec)
    features = Features(max_features)
    facts = request_facts(features, hints)
    for key in sorted(hints):
        if key.startswith('_') or key in NOVA_HINTS:
            continue
        features.add('hint.' + key, hints[key])
    props = image_properties(get('image'))
    features.add_all('image.', props)
    extra_specs = flavor_get('extra_specs') or {}
    features.add_all('flavor.', dict(extra_specs))
    request = {'vm_id': vm_id, 'tenant_id': tenant, 'vm_type': vm_type, 'demand': demand,
               'zone': zone}
    request.update(facts)
    os_name = props.get('os_distro') or props.get('os_type')
    if isinstance(os_name, str) and feature_value(os_name) is not None:
        request['os'] = os_name
    if features.values:
        request['features'] = features.values
    ids = [c for c in candidates if isinstance(c, str) and ID_RE.match(c)]
    if not ids:
        raise MappingError('no candidate host has an id the allocator accepts: %r' % (list(candidates)[:5],))
    request['candidates'] = ids
    return request, features.skipped


def parse_time(value):
    """A notification's ISO time (``2026-12-07T14:30:08Z``, with or without fraction or offset) as
    Unix seconds, or None."""
    if not value or not isinstance(value, str):
        return None
    text = value.strip().replace('Z', '+00:00').replace(' ', 'T', 1)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def payload_data(payload):
    """A versioned notification's payload fields (the ``nova_object.data`` of Nova's, the
    ``watcher_object.data`` of Watcher's)."""
    if isinstance(payload, dict):
        for key in ('nova_object.data', 'watcher_object.data'):
            if key in payload:
                return payload[key] or {}
    return payload or {}


def host_of_payload(data):
    """The allocator's host id of an instance payload: its node (the hypervisor hostname, which
    is Placement's provider name), else its host; None when the instance is on no host."""
    return data.get('node') or data.get('host') or None


def request_from_payload(data, zone, max_features=MAX_FEATURES, send_times=True):
    """The VM request of an instance notification's payload (``InstanceCreatePayload``,
    ``InstanceActionPayload``): project -> tenant, flavor -> type and demand, server metadata ->
    ``meta.<key>`` features (a ``lifetime`` key, like the hint, -> ``lifetime``; a
    ``requested_at_s`` key -> the request time; ``ended_at_s`` is :func:`ended_at`'s); ``launched_at`` as the request time when
    ``send_times`` and no ``requested_at_s`` is given."""
    vm_id = check_id(data.get('uuid'), 'the instance uuid')
    project = data.get('tenant_id')
    if not project:
        raise MappingError('the notification has no project (tenant_id)')
    tenant = check_id(project, 'the project id')
    flavor = payload_data(data.get('flavor'))
    if not flavor:
        raise MappingError('the notification has no flavor')
    vm_type = check_text(flavor.get('name'), 'the flavor name')
    demand = check_demand(demand_from_resources(resources_from_flavor(flavor)))
    metadata = dict(data.get('metadata') or {})
    features = Features(max_features)
    facts = request_facts(features, metadata)
    for key in sorted(metadata):
        if key in ('lifetime', 'requested_at_s', 'ended_at_s', 'priority'):
            continue
        features.add('meta.' + key, metadata[key])
    request = {'vm_id': vm_id, 'tenant_id': tenant, 'vm_type': vm_type, 'demand': demand,
               'zone': zone}
    request.update(facts)
    if send_times and 'requested_at_s' not in request:
        launched = parse_time(data.get('launched_at'))
        if launched is not None:
            request['requested_at_s'] = launched
    if features.values:
        request['features'] = features.values
    return request


def ended_at(data, send_times=True):
    """When a deleted instance's payload says it ended: its ``ended_at_s`` metadata key (a number
    on the allocator's request clock, as ``requested_at_s``: what a trace replay sets before the
    delete), else ``terminated_at`` when ``send_times``; None (the service's clock) otherwise."""
    at = _number((data.get('metadata') or {}).get('ended_at_s'))
    if at is not None and at >= 0:
        return at
    return parse_time(data.get('terminated_at')) if send_times else None


def capacity_from_inventory(inventories):
    """A resource provider's inventories (``{"VCPU": {"total", "reserved", "allocation_ratio"},
    ...}``) as the host's capacity: (total - reserved) x allocation_ratio of VCPU (+ PCPU), of
    MEMORY_MB in GiB and of DISK_GB, rounded down to the allocator's base units (1/1000 core,
    1 MiB). None when the provider has no VCPU or MEMORY_MB (not a compute node)."""
    def usable(rc):
        inv = inventories.get(rc)
        if not inv:
            return 0.0
        total = float(inv.get('total', 0)) - float(inv.get('reserved', 0) or 0)
        return max(total, 0.0) * float(inv.get('allocation_ratio', 1.0) or 1.0)

    if not (inventories.get('VCPU') or inventories.get('PCPU')) or not inventories.get('MEMORY_MB'):
        return None
    cores = math.floor((usable('VCPU') + usable('PCPU')) * 1000 + 1e-6) / 1000.0
    memory = math.floor(usable('MEMORY_MB') + 1e-6) / MIB_PER_GIB
    capacity = {'cores': cores, 'memory_gib': memory}
    if inventories.get('DISK_GB'):
        capacity['ssd_gib'] = math.floor(usable('DISK_GB') * 1024 + 1e-6) / 1024.0
    return capacity


def base_units(resources):
    """A wire resource vector as integers in the allocator's base units (1/1000 core, MiB), for
    exact comparisons."""
    resources = resources or {}
    return (int(round(float(resources.get('cores', 0) or 0) * 1000)),
            int(round(float(resources.get('memory_gib', 0) or 0) * 1024)),
            int(round(float(resources.get('ssd_gib', 0) or 0) * 1024)))
