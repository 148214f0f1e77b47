"""consolidation: the allocator's admin routes as Watcher's strategy and the action-notification
endpoint call them (against a local HTTP server that answers what each test scripts), the audit's
parameters and the settings made from them."""

import unittest

from lifetime_alloc_openstack import client
from lifetime_alloc_openstack import consolidation
from tests.unit.test_client import Script
from tests.unit.test_client import serve


def migrate_notification(vm_id='v1', action_type='migrate'):
    """A Watcher ``ActionExecutionPayload`` as oslo.messaging delivers it (a primitive)."""
    return {'watcher_object.data': {
        'uuid': 'a1', 'action_type': action_type, 'state': 'SUCCEEDED',
        'input_parameters': {'resource_id': vm_id, 'migration_type': 'live',
                             'source_node': 'compute-1', 'destination_node': 'compute-2'}}}


class AdminTest(unittest.TestCase):

    def setUp(self):
        self.script = Script()
        self.admin = consolidation.AllocatorAdmin(serve(self, self.script) + '/', 'admin-secret', timeout=2.0)

    def test_the_routes_carry_the_admin_token(self):
        self.script.answers[('GET', '/v1/consolidation')] = (200, {'config': {'chooser': 'age'}}, 0)
        self.script.answers[('POST', '/v1/consolidation/rounds')] = (200, {'started': [{'host': 'h1'}]}, 0)
        self.assertEqual(self.admin.report(), {'config': {'chooser': 'age'}})
        self.assertEqual(self.admin.round(), [{'host': 'h1'}])
        self.assertEqual(self.script.seen[-1][2]['Authorization'], 'Bearer admin-secret')

    def test_consolidation_off_is_no_report_and_a_refusal_says_why(self):
        self.assertIsNone(self.admin.report())  # 404: off
        self.script.answers[('PUT', '/v1/consolidation')] = (
            422, {'type': 'urn:problem:invalid-request', 'detail': 'max_in_flight: must be auto or 1 to 100'}, 0)
        with self.assertRaises(client.Refused) as caught:
            self.admin.configure({'max_in_flight': 0})
        self.assertIn('max_in_flight', str(caught.exception))

    def test_off_is_refused_while_migrations_are_in_flight_and_pause_stops_new_ones(self):
        self.script.answers[('DELETE', '/v1/consolidation')] = (
            409, {'type': 'urn:problem:conflict', 'detail': 'migrations are in flight'}, 0)
        with self.assertRaises(client.Conflict) as caught:
            self.admin.off()
        self.assertIn('in flight', str(caught.exception))
        self.script.answers[('POST', '/v1/consolidation/pause')] = (200, {'paused': True}, 0)
        self.assertEqual(self.admin.pause(), {'paused': True})
        self.script.answers[('DELETE', '/v1/consolidation')] = (204, None, 0)
        self.assertIsNone(self.admin.off())

    def test_outcomes_complete_or_fail_the_allocators_migration(self):
        outcomes = consolidation.MigrationOutcomes(self.admin)
        self.script.answers[('POST', '/v1/migrations/v1/complete')] = (200, {'vm_id': 'v1'}, 0)
        self.script.answers[('POST', '/v1/migrations/v2/fail')] = (200, {'vm_id': 'v2'}, 0)
        self.assertEqual(outcomes.handle('action.execution.end', migrate_notification('v1')), 'completed')
        self.assertEqual(outcomes.handle('action.execution.error', migrate_notification('v2')), 'failed')
        # Already applied through Nova's notification (or not the allocator's plan): nothing to do.
        self.assertEqual(outcomes.handle('action.execution.end', migrate_notification('v3')), 'not_migrating')
        self.assertIsNone(outcomes.handle('action.execution.end', migrate_notification('v1', 'nop')))
        self.assertIsNone(outcomes.handle('action.execution.start', migrate_notification('v1')))
        self.assertEqual(dict(outcomes.counters), {'completed': 1, 'failed': 1, 'not_migrating': 1})

    def test_an_allocator_away_is_an_error_counted_not_raised(self):
        self.server.shutdown()
        self.server.server_close()
        outcomes = consolidation.MigrationOutcomes(consolidation.AllocatorAdmin('http://127.0.0.1:9', None, 0.5))
        self.assertEqual(outcomes.handle('action.cancel.end', migrate_notification()), 'error')


class ParametersTest(unittest.TestCase):

    def test_the_audits_parameters_replace_three_settings_and_keep_the_rest(self):
        current = {'budget_per_host_day': 0.1, 'chooser': 'lifetime', 'max_in_flight': 3, 'every_s': 1800.0}
        settings = consolidation.settings_with(current, 0.25, 'age-batches', 'auto')
        self.assertEqual(settings, {'budget_per_host_day': 0.25, 'chooser': 'age-batches', 'max_in_flight': 'auto',
                                    'every_s': 1800.0})
        self.assertEqual(consolidation.settings_with(None, 0, 'fewest-vms', 7)['max_in_flight'], 7)

    def test_bad_parameters_name_the_parameter(self):
        for bad, name in [((-1, 'age', 'auto'), 'budget_per_host_day'), ((True, 'age', 'auto'), 'budget_per_host_day'),
                          ((0.1, 'best', 'auto'), 'chooser'), ((0.1, 'oracle', 'auto'), 'chooser'),
                          ((0.1, 'age', 0), 'max_in_flight'), ((0.1, 'age', 'many'), 'max_in_flight'),
                          ((0.1, 'age', 2.5), 'max_in_flight')]:
            with self.assertRaises(ValueError) as caught:
                consolidation.check_parameters(*bad)
            self.assertTrue(str(caught.exception).startswith(name), (bad, caught.exception))
