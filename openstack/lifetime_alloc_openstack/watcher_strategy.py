"""``lifetime_consolidation``: an OpenStack Watcher strategy of the ``server_consolidation`` goal
that carries out the zone allocator's consolidation (issue 59; docs/openstack.md, "Watcher").

The allocator plans: it keeps the migration budget, chooses the hosts to empty (its chooser, the
lifetime-aware ``lifetime`` by default) and, for each VM it starts moving, the host it goes to
(its placement policy), reserving the VM's demand there. The strategy only turns that plan into
Watcher's action plan. Each audit:

1. sets the audit's parameters (``budget_per_host_day``, ``chooser``, ``max_in_flight``) on the
   allocator's consolidation, keeping its other settings;
2. asks for a round now (``POST /v1/consolidation/rounds``): within the budget, hosts leave
   scheduling and their first VMs start migrating, at most ``max_in_flight`` at once;
3. adds a live ``migrate`` action for every migration the allocator has in flight, from its source
   to the target it reserved, when the compute model holds the VM on that source and the target.

The applier's outcomes reach the allocator through Watcher's action notifications
(:class:`lifetime_alloc_openstack.consolidation.MigrationOutcomes`, which the listener runs), or
through Nova's own: a completed move starts the next VM of the host (found by the next audit), a
failed one gives its host back to service. One audit's plan is meant to be carried out before
the next audit runs: an action plan left unapplied keeps its migrations' targets reserved.

Registered through the ``watcher_strategies`` entry point; its options are the
``[watcher_strategies.lifetime_consolidation]`` section of watcher.conf.
"""

from oslo_config import cfg
from oslo_log import log

from watcher._i18n import _
from watcher.common import exception
from watcher.decision_engine.strategy.strategies import base

from lifetime_alloc_openstack import client as client_mod
from lifetime_alloc_openstack import consolidation

LOG = log.getLogger(__name__)


class LifetimeConsolidation(base.ServerConsolidationBaseStrategy):
    """Carries out the lifetime-aware allocator's consolidation: see the module's doc."""

    def __init__(self, config, osc=None):
        super().__init__(config, osc)
        self.started_hosts = []
        self.migrations = 0
        self.released_nodes = 0

    @classmethod
    def get_name(cls):
        return 'lifetime_consolidation'

    @classmethod
    def get_display_name(cls):
        return _('Lifetime-aware consolidation')

    @classmethod
    def get_translatable_display_name(cls):
        return 'Lifetime-aware consolidation'

    @classmethod
    def get_config_opts(cls):
        return [
            cfg.URIOpt('allocator_url', schemes=['http', 'https'],
                       help='Base URL of the zone\'s allocator service, e.g. http://10.0.0.6:8081.'),
            cfg.StrOpt('admin_token', secret=True,
                       help='The allocator\'s admin token (its [admin] token), sent as the bearer.'),
            cfg.FloatOpt('timeout', default=10.0, min=0.1,
                         help='Seconds to wait for the allocator to answer one call.'),
        ]

    @classmethod
    def get_schema(cls):
        return {
            'properties': {
                'budget_per_host_day': {
                    'description': 'Migrations allowed per host of the zone per day (the allocator '
                                   'accrues them into a bucket one day deep).',
                    'type': 'number',
                    'minimum': 0,
                    'maximum': consolidation.MAX_BUDGET,
                    'default': 0.1,
                },
                'chooser': {
                    'description': 'How the allocator chooses the hosts to empty: lifetime (the '
                                   'model\'s remaining lifetimes), age-batches (the same rules '
                                   'without a model: as good on the test traces, and the one to '
                                   'run without a model), age, fewest-vms (Watcher\'s own order), '
                                   'least-used.',
                    'type': 'string',
                    'enum': list(consolidation.CHOOSERS),
                    'default': 'lifetime',
                },
                'max_in_flight': {
                    'description': 'Most migrations in flight at once: "auto" (enough to carry out '
                                   'the budget on the zone) or a number.',
                    'oneOf': [
                        {'type': 'string', 'enum': ['auto']},
                        {'type': 'integer', 'minimum': 1, 'maximum': consolidation.MAX_IN_FLIGHT},
                    ],
                    'default': 'auto',
                },
            },
            'additionalProperties': False,
        }

    def admin(self):
        if not self.config.allocator_url:
            raise exception.WatcherException(
                'lifetime_consolidation: set [watcher_strategies.lifetime_consolidation] allocator_url '
                '(and admin_token) in watcher.conf')
        return consolidation.AllocatorAdmin(self.config.allocator_url, self.config.admin_token,
                                            self.config.timeout)

    def pre_execute(self):
        self._pre_execute()

    def do_execute(self, audit=None):
        params = self.input_parameters
        admin = self.admin()
        try:
            report = admin.report()
            settings = consolidation.settings_with(report and report.get('config'), params.budget_per_host_day,
                                                   params.chooser, params.max_in_flight)
            admin.configure(settings)
            self.started_hosts = admin.round()
            report = admin.report() or {}
        except ValueError as error:
            raise exception.WatcherException('lifetime_consolidation: %s' % error)
        except client_mod.ControlError as error:
            raise exception.WatcherException('lifetime_consolidation: the allocator: %s' % error)
        model = self.compute_model
        moving = {m['vm_id'] for m in report.get('in_flight', [])}
        for migration in report.get('in_flight', []):
            try:
                instance = model.get_instance_by_uuid(migration['vm_id'])
                source = model.get_node_by_name(migration['source'])
                target = model.get_node_by_name(migration['target'])
            except (exception.InstanceNotFound, exception.ComputeNodeNotFound) as error:
                # The allocator and the cloud disagree (the listener or the reconciliation will
                # make them agree): no action for it.
                LOG.warning('lifetime_consolidation: no action for %s: %s', migration['vm_id'], error)
                continue
            if model.get_node_by_instance_uuid(instance.uuid).uuid != source.uuid:
                LOG.warning('lifetime_consolidation: %s is not on %s in the compute model', instance.uuid,
                            migration['source'])
                continue
            self.add_action_migrate(instance, 'live', source, target)
            self.migrations += 1
        # A host all of whose VMs this plan moves is released by it.
        for host in self.started_hosts:
            if host.get('moves') and all(vm in moving for vm in host['moves']):
                self.released_nodes += 1
        budget_left = report.get('budget')
        LOG.info('lifetime_consolidation: %d hosts started, %d migrations planned, budget left %s',
                 len(self.started_hosts), self.migrations, budget_left)

    def post_execute(self):
        enabled = [n for n in self.compute_model.get_all_compute_nodes().values() if n.status == 'enabled']
        self.solution.set_efficacy_indicators(
            compute_nodes_count=len(enabled),
            released_compute_nodes_count=self.released_nodes,
            instance_migrations_count=self.migrations,
        )
