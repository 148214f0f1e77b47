"""``LifetimeWeigher``: a Nova scheduler weigher that lets the lifetime-aware allocator choose
among the hosts Nova's filters left.

Named in ``nova.conf``::

    [filter_scheduler]
    weight_classes = nova.scheduler.weights.all_weighers,lifetime_alloc_openstack.weigher.LifetimeWeigher

For each instance the scheduler weighs (with at least two candidates) it sends the VM request with
the candidates' node names to the control service (``POST /v1/allocate``); the allocator's policy
picks one of them and reserves it at once. The chosen host weighs 1, the others 0, and with the
default multiplier (1000) the choice outweighs Nova's stock weighers. Nova may still end elsewhere
(a failed claim, an alternate after a failed build): the notification listener records where the
server really is, and the reconciliation heals whatever it missed.

On any failure -- the control service away or slow (``[lifetime_alloc] timeout``), a rejection, a
request it cannot read, a move of an existing server, a choice outside the candidates -- every host
weighs the same (Nova's other weighers decide), the outcome is counted in :data:`COUNTERS` and
logged with its reason, and nothing is raised.
"""

import collections
import threading
import time

from oslo_log import log as logging

import nova.conf
from nova.scheduler import weights

from lifetime_alloc_openstack import client as client_mod
from lifetime_alloc_openstack import conf as conf_mod
from lifetime_alloc_openstack import mapping

LOG = logging.getLogger(__name__)
CONF = nova.conf.CONF
conf_mod.register_opts(CONF)

# Decisions by outcome: placed (the allocator's host weighs 1), and the neutral ones: rejected,
# timeout, unreachable, refused (4xx), server_error, bad_request (the plug-in could not build the
# request), move, not_candidate, not_configured, internal.
COUNTERS = collections.Counter()
_COUNTERS_LOCK = threading.Lock()
# The latest decisions, newest last: (instance uuid, outcome, chosen host or None, seconds).
RECENT = collections.deque(maxlen=1000)


def count(outcome, vm_id=None, host=None, seconds=0.0):
    with _COUNTERS_LOCK:
        COUNTERS[outcome] += 1
        RECENT.append((vm_id, outcome, host, seconds))


def reset_counters():
    with _COUNTERS_LOCK:
        COUNTERS.clear()
        RECENT.clear()


def _nova_resources(spec):
    """The amounts Nova asks Placement for this request (flavor, extra-spec overrides, boot from
    volume), by Nova's own code; None when it cannot tell (then the flavor's are used)."""
    try:
        from nova.scheduler import utils as scheduler_utils
        request = scheduler_utils.ResourceRequest.from_request_spec(spec)
        return dict(request.merged_resources())
    except Exception:  # an older Nova, or a spec this version cannot read
        return None


class LifetimeWeigher(weights.BaseHostWeigher):
    """The allocator's choice among the candidates weighs 1, the others 0; neutral on failure."""

    def __init__(self):
        super().__init__()
        self._client = None
        self._client_key = None
        self._multiplier = None

    def weight_multiplier(self, host_state):
        # Nova asks once per candidate host after weigh_objects: the option is read once per
        # decision there (an oslo.config lookup costs about 1.5 us, 0.8 ms over 500 hosts).
        multiplier = self._multiplier
        if multiplier is None:
            return CONF.lifetime_alloc.weight_multiplier
        return multiplier

    def _weigh_object(self, host_state, weight_properties):
        # Only reached through the base weigh_objects, which this class overrides.
        return 0.0

    def client(self):
        group = CONF.lifetime_alloc
        key = (group.control_url, group.token, group.timeout, group.zone)
        if key != self._client_key:
            self._client = client_mod.ControlClient.from_conf(group)
            self._client_key = key
        return self._client

    def weigh_objects(self, weighed_obj_list, spec):
        neutral = [0.0] * len(weighed_obj_list)
        started = time.monotonic()
        vm_id = None
        try:
            self._multiplier = CONF.lifetime_alloc.weight_multiplier
            vm_id = getattr(spec, 'instance_uuid', None) if spec is not None else None
            return self._weigh(weighed_obj_list, spec, neutral, started)
        except Exception as exc:  # never a failed boot
            self._neutral('internal', vm_id, started, 'unexpected error: %s' % exc, exc_info=True)
            return neutral

    def _neutral(self, outcome, vm_id, started, reason, exc_info=False):
        elapsed = time.monotonic() - started
        count(outcome, vm_id, None, elapsed)
        LOG.warning('lifetime_alloc: neutral weights for instance %s (%s): %s',
                    vm_id, outcome, reason, exc_info=exc_info)

    def _weigh(self, weighed_obj_list, spec, neutral, started):
        vm_id = mapping._getter(spec)('instance_uuid')
        control = self.client()
        if control is None:
            self._neutral('not_configured', vm_id, started, '[lifetime_alloc] control_url is not set')
            return neutral
        if mapping.is_move(spec):
            self._neutral('move', vm_id, started, 'a move of an existing server (rebuild, '
                          'migration, resize or evacuation): Nova\'s weighers decide')
            return neutral
        candidates = []
        for weighed in weighed_obj_list:
            host = weighed.obj
            if vm_id and vm_id in (getattr(host, 'instances', None) or ()):
                self._neutral('move', vm_id, started, 'the server is already on a candidate host')
                return neutral
            candidates.append(host.nodename)
        try:
            request, skipped = mapping.request_from_spec(
                spec, control.zone, candidates, _nova_resources(spec),
                CONF.lifetime_alloc.max_features)
        except mapping.MappingError as exc:
            self._neutral('bad_request', vm_id, started, exc.reason)
            return neutral
        if not CONF.lifetime_alloc.send_candidates:
            del request['candidates']
        if skipped:
            LOG.info('lifetime_alloc: instance %s: features left out (over 64, or not a number '
                     'or a short text): %s', vm_id, ', '.join(skipped[:10]))
        try:
            decision = control.allocate(request)
        except client_mod.ControlError as exc:
            self._neutral(exc.outcome, vm_id, started, str(exc))
            return neutral
        if not isinstance(decision, dict) or decision.get('status') != 'placed':
            rejection = decision.get('rejection') if isinstance(decision, dict) else None
            rejection = rejection if isinstance(rejection, dict) else {}
            detail = rejection.get('detail') or rejection.get('code') or decision
            self._neutral('rejected', vm_id, started, 'the allocator rejected it: %s' % (detail,))
            return neutral
        placements = decision.get('placements') or []
        chosen = placements[0].get('host_id') if placements else None
        if chosen not in candidates:
            self._neutral('not_candidate', vm_id, started,
                          'the allocator holds it on %s, not among the %d candidates (a retry or a '
                          'move): Nova\'s weighers decide' % (chosen, len(candidates)))
            return neutral
        elapsed = time.monotonic() - started
        count('placed', vm_id, chosen, elapsed)
        LOG.debug('lifetime_alloc: instance %s -> %s (%.1f ms, %d candidates)',
                  vm_id, chosen, elapsed * 1000, len(candidates))
        return [1.0 if name == chosen else 0.0 for name in candidates]
