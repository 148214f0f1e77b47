"""The allocator's consolidation as OpenStack Watcher carries it out (issue 59; docs/openstack.md,
"Watcher").

- :class:`AllocatorAdmin`: the zone allocator's admin routes that consolidation needs: its settings
  and report (``GET``/``PUT /v1/consolidation``), a round now (``POST /v1/consolidation/rounds``)
  and the outcome of a migration (``POST /v1/migrations/{vm_id}/complete`` or ``.../fail``). Admin
  routes take the allocator's admin token; Watcher is the cloud operator's own service.
- :class:`MigrationOutcomes`: an endpoint of Watcher's versioned action notifications
  (``action.execution.end``, ``action.execution.error``, ``action.cancel.end``): a ``migrate``
  action that ended moved its VM (the migration completes at the allocator); one that failed or
  was cancelled did not (the allocator gives the reservation back and the host being emptied
  returns to service). So the allocator's consolidation record follows what the applier did.

Neither imports Watcher: the strategy (:mod:`lifetime_alloc_openstack.watcher_strategy`) does.
"""

import collections
import threading

import oslo_messaging
import requests

from lifetime_alloc_openstack import client as client_mod
from lifetime_alloc_openstack import mapping

# The allocator's choosers (placement::consolidation::ChooserKind), less `oracle` (simulator only).
CHOOSERS = ('fewest-vms', 'least-used', 'age', 'age-batches', 'lifetime')
MAX_IN_FLIGHT = 100
MAX_BUDGET = 1e6


class AllocatorAdmin(object):
    """The allocator at ``base_url``, with ``admin_token`` as the bearer; calls bounded by
    ``timeout`` seconds; failures are :mod:`client`'s typed errors."""

    def __init__(self, base_url, admin_token, timeout=10.0):
        self.base_url = base_url.rstrip('/')
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers['Accept'] = 'application/json'
        if admin_token:
            self.session.headers['Authorization'] = 'Bearer %s' % admin_token

    def _call(self, method, path, body=None):
        url = self.base_url + path
        try:
            answer = self.session.request(method, url, json=body, timeout=self.timeout)
        except requests.Timeout as error:
            raise client_mod.Timeout('%s %s: no answer within %.1f s (%s)' % (method, path, self.timeout, error))
        except requests.RequestException as error:
            raise client_mod.Unreachable('%s %s: %s' % (method, path, error))
        return client_mod.answer_of(method, path, answer.status_code, answer.content)

    def report(self):
        """The allocator's ``ConsolidationReport``, or None while consolidation is off."""
        try:
            return self._call('GET', '/v1/consolidation')
        except client_mod.NotFound:
            return None

    def configure(self, settings):
        """Turns consolidation on with ``settings`` (a full ``ConsolidationConfig``), or changes
        them; answers the report."""
        return self._call('PUT', '/v1/consolidation', settings)

    def pause(self):
        """Pauses consolidation (``POST /v1/consolidation/pause``): no new host and no new
        migration; those in flight go on until they complete or fail."""
        return self._call('POST', '/v1/consolidation/pause')

    def off(self):
        """Turns consolidation off (``DELETE /v1/consolidation``): the hosts being emptied go back
        to service. Refused (:class:`client.Conflict`) while migrations are in flight."""
        return self._call('DELETE', '/v1/consolidation')

    def plan(self):
        """The hosts a round would start now (``PlannedHost`` dicts), a dry run."""
        return (self._call('GET', '/v1/consolidation/plan') or {}).get('plan', [])

    def round(self):
        """A round now: the hosts it started (``PlannedHost`` dicts)."""
        return (self._call('POST', '/v1/consolidation/rounds') or {}).get('started', [])

    def complete(self, vm_id):
        return self._call('POST', '/v1/migrations/%s/complete' % mapping.check_id(vm_id, 'the VM id'))

    def fail(self, vm_id):
        return self._call('POST', '/v1/migrations/%s/fail' % mapping.check_id(vm_id, 'the VM id'))


def check_parameters(budget_per_host_day, chooser, max_in_flight):
    """The audit's parameters checked (Watcher checks them against the strategy's schema first);
    raises ValueError naming the parameter and what it takes."""
    if isinstance(budget_per_host_day, bool) or not isinstance(budget_per_host_day, (int, float)) \
            or not 0 <= budget_per_host_day <= MAX_BUDGET:
        raise ValueError('budget_per_host_day: must be a number of migrations per host-day from 0 to %g, got %r'
                         % (MAX_BUDGET, budget_per_host_day))
    if chooser not in CHOOSERS:
        raise ValueError('chooser: must be one of %s, got %r' % (', '.join(CHOOSERS), chooser))
    if max_in_flight != 'auto' and (isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int)
                                    or not 1 <= max_in_flight <= MAX_IN_FLIGHT):
        raise ValueError('max_in_flight: must be "auto" or a whole number from 1 to %d, got %r'
                         % (MAX_IN_FLIGHT, max_in_flight))


def settings_with(current, budget_per_host_day, chooser, max_in_flight):
    """The allocator's settings ``current`` (a ``ConsolidationConfig`` dict; None while off) with
    the audit's three parameters; the rest (period, migration time, waste rule) as the operator
    set them."""
    check_parameters(budget_per_host_day, chooser, max_in_flight)
    settings = dict(current or {})
    settings.update(budget_per_host_day=budget_per_host_day, chooser=chooser, max_in_flight=max_in_flight)
    return settings


class MigrationOutcomes(object):
    """Applies Watcher's action notifications to the allocator through ``admin``
    (:class:`AllocatorAdmin`). ``counters`` counts outcomes: completed, failed, not_migrating
    (the allocator had no such migration: already applied, or not its plan), skipped, error."""

    ENDED = 'action.execution.end'
    FAILED = frozenset(['action.execution.error', 'action.cancel.end'])
    filter_rule = oslo_messaging.NotificationFilter(event_type=r'^action\.')

    def __init__(self, admin):
        self.admin = admin
        self.counters = collections.Counter()
        self._lock = threading.Lock()

    # oslo.messaging calls the method named after the notification's priority.
    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        self.handle(event_type, payload)

    def error(self, ctxt, publisher_id, event_type, payload, metadata):
        self.handle(event_type, payload)

    warn = info

    def handle(self, event_type, payload):
        """Applies one notification; returns what happened (the counter's name) or None."""
        if event_type != self.ENDED and event_type not in self.FAILED:
            return None
        action = mapping.payload_data(payload)
        if action.get('action_type') != 'migrate':
            return None
        params = action.get('input_parameters') or {}
        vm_id = params.get('resource_id')
        if not vm_id:
            outcome = 'skipped'
        else:
            call = self.admin.complete if event_type == self.ENDED else self.admin.fail
            try:
                call(vm_id)
                outcome = 'completed' if event_type == self.ENDED else 'failed'
            except client_mod.NotFound:
                outcome = 'not_migrating'
            except (client_mod.ControlError, mapping.MappingError):
                outcome = 'error'
        with self._lock:
            self.counters[outcome] += 1
        return outcome


def outcomes_listener(transport, outcomes, topics=('watcher_notifications',), pool=None):
    """A notification listener that hands Watcher's notifications on ``topics`` to ``outcomes``
    (:class:`MigrationOutcomes`); ``start()`` it, ``stop()`` and ``wait()`` at the end."""
    targets = [oslo_messaging.Target(topic=topic) for topic in topics]
    return oslo_messaging.get_notification_listener(transport, targets, [outcomes], executor='threading',
                                                    pool=pool or None)
