"""The ``[lifetime_alloc]`` option group of ``nova.conf``, registered with oslo.config.

The weigher (in nova-scheduler), the notification listener and the reconciliation read the same
group, so one ``nova.conf`` section configures all three. ``list_opts`` is the
``oslo.config.opts`` entry point, so ``oslo-config-generator --namespace lifetime_alloc``
writes the section with its help texts.
"""

from oslo_config import cfg

GROUP_NAME = 'lifetime_alloc'

GROUP_TITLE = 'Lifetime-aware allocation'
GROUP_HELP = ('The lifetime-aware allocator (lifetime-alloc-openstack): where its control '
              'service is, how long the scheduler waits for it, and how the notification listener '
              'and the reconciliation from Placement run.')
group = cfg.OptGroup(GROUP_NAME, title=GROUP_TITLE, help=GROUP_HELP)

client_opts = [
    cfg.URIOpt('control_url', schemes=['http', 'https'],
               help='Base URL of the control service, e.g. http://10.0.0.5:8080. Unset: the '
                    'weigher gives neutral weights and the listener does nothing.'),
    cfg.StrOpt('token', secret=True,
               help='Sent as "Authorization: Bearer <token>" to the control service: an operator '
                    'key (it acts for every project and may send request times).'),
    cfg.FloatOpt('timeout', default=0.5, min=0.001,
                 help='Seconds to wait for the control service to connect and to answer (each). '
                      'The weigher is on the critical path of every boot: past this, Nova\'s '
                      'other weighers decide.'),
    cfg.StrOpt('zone', default='zone-1',
               help='The allocator zone that holds this cloud\'s (or cell\'s) compute nodes.'),
]

weigher_opts = [
    cfg.FloatOpt('weight_multiplier', default=1000.0,
                 help='Multiplier of the weigher\'s 0..1 score. Nova adds every weigher\'s '
                      'multiplier x score; the default dominates the stock weighers (their '
                      'multipliers are about 1), so the allocator\'s host wins. 0 turns the '
                      'weigher\'s influence off while it still records (a shadow run).'),
    cfg.BoolOpt('send_candidates', default=True,
                help='Send the candidates Nova\'s filters left, so that the allocator chooses among '
                     'them. False is for control services older than the candidates field: the '
                     'allocator then chooses among all its hosts, and a choice outside the '
                     'candidates gives neutral weights.'),
    cfg.IntOpt('max_features', default=64, min=0, max=64,
               help='Most features sent per request (the control service takes at most 64).'),
]

listener_opts = [
    cfg.ListOpt('notification_topics', default=['versioned_notifications'],
                help='Topics of Nova\'s versioned notifications ([notifications] '
                     'versioned_notifications_topics of nova.conf).'),
    cfg.StrOpt('listener_pool', default='lifetime-alloc',
               help='Listener pool: every pool gets its own copy of each notification, so the '
                    'listener takes none away from other consumers of the topic.'),
    cfg.BoolOpt('send_event_times', default=True,
                help='Send each server\'s launched_at and terminated_at as the request and exit '
                     'times. Set it to false when the allocator runs on the request clock of a '
                     'trace replay (its times are not the wall clock).'),
    cfg.IntOpt('remember_instances', default=100000, min=100,
               help='How many instances\' last events the listener remembers, to ignore '
                    'duplicated, late and reordered notifications.'),
    cfg.FloatOpt('reconcile_interval', default=600.0, min=0.0,
                 help='Seconds between reconciliations from Placement in the listener (one runs '
                      'at start; 0: only at start).'),
    cfg.FloatOpt('reconcile_after_error', default=30.0, min=0.0,
                 help='A notification that could not be applied (the control service away) '
                      'brings the next reconciliation this close.'),
    cfg.FloatOpt('reservation_grace', default=300.0, min=0.0,
                 help='Seconds during which a VM the allocator placed but Placement does not '
                      'hold yet (a boot in flight) is left alone by the reconciliation.'),
    cfg.BoolOpt('remove_unknown_hosts', default=True,
                help='The reconciliation removes the allocator\'s empty hosts that are no '
                     'resource provider of Placement (a host with VMs is never removed).'),
]

watcher_opts = [
    cfg.URIOpt('allocator_url', schemes=['http', 'https'],
               help='Base URL of the zone\'s allocator service. Set, the listener also reads '
                    'OpenStack Watcher\'s action notifications and applies the outcome of each '
                    'migrate action to the allocator\'s consolidation (the lifetime_consolidation '
                    'strategy\'s plans: completed, or failed and given back). Unset: it does not.'),
    cfg.StrOpt('allocator_admin_token', secret=True,
               help='The allocator\'s admin token, sent as the bearer of those calls.'),
    cfg.FloatOpt('allocator_timeout', default=10.0, min=0.001,
                 help='Seconds to wait for the allocator to answer one of those calls.'),
    cfg.ListOpt('watcher_notification_topics', default=['watcher_notifications'],
                help='Topics of Watcher\'s versioned notifications ([oslo_messaging_notifications] '
                     'topics of watcher.conf).'),
]

ALL_OPTS = client_opts + weigher_opts + listener_opts + watcher_opts


def register_opts(conf):
    """Registers the ``[lifetime_alloc]`` group and its options on ``conf`` (idempotent). Each
    configuration gets a group object of its own: oslo.config keeps overrides in it."""
    conf.register_group(cfg.OptGroup(GROUP_NAME, title=GROUP_TITLE, help=GROUP_HELP))
    conf.register_opts(ALL_OPTS, group=GROUP_NAME)


def list_opts():
    """The ``oslo.config.opts`` entry point: ``[(group, options)]``."""
    return [(group, ALL_OPTS)]
