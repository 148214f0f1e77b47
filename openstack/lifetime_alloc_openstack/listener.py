"""The allocator learns what Nova did: a listener of Nova's versioned notifications, and the
``lifetime-alloc-nova-listener`` service that runs it with the reconciliation from Placement.

Events (``[notifications] notification_format = versioned`` or ``both`` in nova.conf):

- where a server now is -- ``instance.create.end``, ``instance.live_migration_post_dest.end``,
  ``instance.resize_finish.end``, ``instance.resize_revert.end``, ``instance.rebuild.end`` (an
  evacuation lands there), ``instance.unshelve.end`` -- record it on the payload's node
  (``PUT /v1/allocate/{uuid}``: placed, moved or unchanged);
- where it is no more -- ``instance.delete.end``, ``instance.create.error``,
  ``instance.shelve_offload.end`` -- release it (``DELETE``; a 404 is a release already done).

Idempotent and order-tolerant: each instance's newest applied event time is remembered, so a
duplicate or an older event changes nothing, and an instance released once is never recorded
again (uuids are not reused). An event that could not be applied (the control service away) is
not retried in a loop: it brings the next reconciliation closer, which heals it from Placement.
"""

import collections
import signal
import sys
import threading
import time

import oslo_messaging
from oslo_config import cfg
from oslo_log import log as logging

from lifetime_alloc_openstack import client as client_mod
from lifetime_alloc_openstack import conf as conf_mod
from lifetime_alloc_openstack import consolidation
from lifetime_alloc_openstack import mapping
from lifetime_alloc_openstack import reconcile as reconcile_mod

LOG = logging.getLogger(__name__)

PLACE_EVENTS = frozenset([
    'instance.create.end',
    'instance.live_migration_post_dest.end',
    'instance.resize_finish.end',
    'instance.resize_revert.end',
    'instance.rebuild.end',
    'instance.unshelve.end',
])
# Events after which the server may have another flavor than it was placed with.
RELEASE_EVENTS = frozenset([
    'instance.delete.end',
    'instance.create.error',
    'instance.shelve_offload.end',
])
EVENTS = PLACE_EVENTS | RELEASE_EVENTS


def _event_time(metadata, data):
    """When the event happened: oslo.messaging's ``timestamp`` (UTC), else the payload's
    ``updated_at``; None when neither reads."""
    stamp = mapping.parse_time((metadata or {}).get('timestamp'))
    if stamp is None:
        stamp = mapping.parse_time(data.get('updated_at'))
    return stamp


class NotificationEndpoint(object):
    """Applies instance notifications to the allocator through ``client``. ``counters`` counts
    outcomes: recorded, released, duplicate, stale, after_release, skipped, failed."""

    filter_rule = oslo_messaging.NotificationFilter(event_type=r'^instance\.')

    def __init__(self, client, zone=None, remember=100000, send_times=True, max_features=64,
                 on_failure=None):
        self.client = client
        self.zone = zone or (client.zone if client else 'zone-1')
        self.remember = remember
        self.send_times = send_times
        self.max_features = max_features
        self.on_failure = on_failure
        self.counters = collections.Counter()
        # uuid -> (event time, 'placed'|'released', host); oldest first, bounded.
        self._seen = collections.OrderedDict()
        self._lock = threading.Lock()

    # oslo.messaging calls the method named after the notification's priority.
    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        self.handle(event_type, payload, metadata)

    def error(self, ctxt, publisher_id, event_type, payload, metadata):
        self.handle(event_type, payload, metadata)

    warn = info

    def _remember(self, vm_id, at, what, host):
        self._seen[vm_id] = (at, what, host)
        self._seen.move_to_end(vm_id)
        while len(self._seen) > self.remember:
            self._seen.popitem(last=False)

    def released(self, vm_id):
        """Whether this listener released ``vm_id`` (the reconciliation skips such VMs)."""
        with self._lock:
            seen = self._seen.get(vm_id)
        return seen is not None and seen[1] == 'released'

    def handle(self, event_type, payload, metadata=None):
        """Applies one notification; returns what happened (the counter's name)."""
        if event_type not in EVENTS:
            return None
        outcome = self._handle(event_type, payload, metadata)
        self.counters[outcome] += 1
        return outcome

    def _handle(self, event_type, payload, metadata):
        data = mapping.payload_data(payload)
        vm_id = data.get('uuid')
        at = _event_time(metadata, data)
        place = event_type in PLACE_EVENTS
        host = mapping.host_of_payload(data) if place else None
        with self._lock:
            seen = self._seen.get(vm_id)
        if seen is not None:
            seen_at, what, seen_host = seen
            if what == 'released' and place and event_type != 'instance.unshelve.end':
                LOG.info('lifetime_alloc: %s of %s ignored: the instance was released already',
                         event_type, vm_id)
                return 'after_release'
            if at is not None and seen_at is not None and at < seen_at:
                LOG.info('lifetime_alloc: %s of %s ignored: older than the last event applied',
                         event_type, vm_id)
                return 'stale'
            if (what, seen_host) == (('placed', host) if place else ('released', None)):
                return 'duplicate'
        if self.client is None:
            return 'skipped'
        try:
            if place:
                if not host:
                    raise mapping.MappingError('the payload names no host')
                mapping.check_id(host, 'the host (node) id')
                request = mapping.request_from_payload(data, self.zone, self.max_features,
                                                       self.send_times)
                # The allocator takes a resized server's new demand where it is (no exit).
                answer = self.client.record(vm_id, host, request)
                recorded = (answer or {}).get('recorded')
                LOG.info('lifetime_alloc: %s: %s on %s (%s)', event_type, vm_id, host, recorded)
                outcome = 'recorded'
            else:
                mapping.check_id(vm_id, 'the instance uuid')
                ended = (mapping.ended_at(data, self.send_times)
                         if event_type == 'instance.delete.end' else None)
                gone = self.client.release(vm_id, ended)
                LOG.info('lifetime_alloc: %s: %s released%s', event_type, vm_id,
                         '' if gone else ' (it was not placed)')
                outcome = 'released'
        except mapping.MappingError as exc:
            LOG.warning('lifetime_alloc: %s of %s skipped: %s', event_type, vm_id, exc.reason)
            return 'skipped'
        except client_mod.ControlError as exc:
            LOG.warning('lifetime_alloc: %s of %s not applied (%s): %s; the reconciliation '
                        'will heal it', event_type, vm_id, exc.outcome, exc)
            if self.on_failure is not None:
                self.on_failure()
            return 'failed'
        with self._lock:
            self._remember(vm_id, at, 'placed' if place else 'released', host)
        return outcome


class ListenerService(object):
    """The listener and the periodic reconciliation, as the console script runs them:
    ``start()`` reconciles once, then listens; ``stop()`` ends both."""

    def __init__(self, conf, transport, placement=None, reconcile=True):
        self.conf = conf
        group = conf.lifetime_alloc
        self.client = client_mod.ControlClient.from_conf(group)
        self.endpoint = NotificationEndpoint(
            self.client, group.zone, group.remember_instances, group.send_event_times,
            group.max_features, on_failure=self.reconcile_soon)
        targets = [oslo_messaging.Target(topic=topic) for topic in group.notification_topics]
        self.listener = oslo_messaging.get_notification_listener(
            transport, targets, [self.endpoint], executor='threading',
            pool=group.listener_pool or None)
        # Watcher's migrate actions, when the allocator's admin URL is given.
        self.outcomes = self.watcher_listener = None
        if group.allocator_url:
            admin = consolidation.AllocatorAdmin(group.allocator_url, group.allocator_admin_token,
                                                 group.allocator_timeout)
            self.outcomes = consolidation.MigrationOutcomes(admin)
            self.watcher_listener = consolidation.outcomes_listener(
                transport, self.outcomes, group.watcher_notification_topics, group.listener_pool)
        self._reconcile = reconcile
        self._placement = placement
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._next_at = None
        self._thread = None
        self.reports = []

    def reconcile_now(self):
        """One reconciliation from Placement; its report (also logged)."""
        if self.client is None:
            return None
        if self._placement is None:
            self._placement = reconcile_mod.PlacementReader.from_conf(self.conf)
        group = self.conf.lifetime_alloc
        report = reconcile_mod.reconcile(
            self.client, self._placement, grace_s=group.reservation_grace,
            remove_unknown_hosts=group.remove_unknown_hosts,
            released_by_listener=self.endpoint.released)
        self.reports.append(report)
        return report

    def reconcile_soon(self):
        delay = self.conf.lifetime_alloc.reconcile_after_error
        soon = time.monotonic() + delay
        if self._next_at is None or soon < self._next_at:
            self._next_at = soon
            self._wake.set()

    def _loop(self):
        interval = self.conf.lifetime_alloc.reconcile_interval
        while not self._stopping.is_set():
            now = time.monotonic()
            if self._next_at is not None and now >= self._next_at:
                self._next_at = now + interval if interval > 0 else None
                try:
                    self.reconcile_now()
                except Exception as exc:  # Placement or the control service away: try again
                    LOG.warning('lifetime_alloc: reconciliation failed: %s', exc)
                    self._next_at = time.monotonic() + max(
                        self.conf.lifetime_alloc.reconcile_after_error, 1.0)
            wait = None if self._next_at is None else max(self._next_at - time.monotonic(), 0.0)
            self._wake.wait(timeout=wait if wait is not None else 3600.0)
            self._wake.clear()

    def start(self):
        self.listener.start()
        if self.watcher_listener is not None:
            self.watcher_listener.start()
        if self._reconcile:
            self._next_at = time.monotonic()
            self._thread = threading.Thread(target=self._loop, name='lifetime-alloc-reconcile',
                                            daemon=True)
            self._thread.start()

    def stop(self):
        self._stopping.set()
        self._wake.set()
        for listener in filter(None, (self.listener, self.watcher_listener)):
            listener.stop()
            listener.wait()
        if self._thread is not None:
            self._thread.join(timeout=10)


def load_conf(argv, prog, cli_opts=()):
    """``nova.conf`` (``--config-file``) with the ``[lifetime_alloc]`` and ``[placement]``
    options (and ``cli_opts``) registered, and logging set up from it."""
    conf = cfg.ConfigOpts()
    conf.register_cli_opts(list(cli_opts))
    conf_mod.register_opts(conf)
    reconcile_mod.register_placement_opts(conf)
    logging.register_options(conf)
    conf(argv, project='nova', prog=prog)
    logging.setup(conf, prog)
    return conf


def main(argv=None):
    """``lifetime-alloc-nova-listener --config-file /etc/nova/nova.conf``: listens to Nova's
    versioned notifications on nova.conf's transport and reconciles from Placement at start and
    every ``[lifetime_alloc] reconcile_interval``, until SIGTERM or SIGINT."""
    conf = load_conf(sys.argv[1:] if argv is None else argv, 'lifetime-alloc-nova-listener')
    if not conf.lifetime_alloc.control_url:
        LOG.error('lifetime_alloc: [lifetime_alloc] control_url is not set in the configuration')
        return 2
    transport = oslo_messaging.get_notification_transport(conf)
    service = ListenerService(conf, transport)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    service.start()
    LOG.info('lifetime_alloc: listening on %s (pool %s), control service %s, zone %s',
             ', '.join(conf.lifetime_alloc.notification_topics), conf.lifetime_alloc.listener_pool,
             conf.lifetime_alloc.control_url, conf.lifetime_alloc.zone)
    if service.outcomes is not None:
        LOG.info('lifetime_alloc: and on Watcher\'s %s, allocator %s',
                 ', '.join(conf.lifetime_alloc.watcher_notification_topics), conf.lifetime_alloc.allocator_url)
    while not stop.wait(1.0):
        pass
    service.stop()
    LOG.info('lifetime_alloc: listener stopped; %s%s', dict(service.endpoint.counters),
             '' if service.outcomes is None else '; Watcher: %s' % dict(service.outcomes.counters))
    return 0


if __name__ == '__main__':
    sys.exit(main())
