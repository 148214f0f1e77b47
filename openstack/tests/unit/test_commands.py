"""The console scripts as an operator runs them: ``--config-file nova.conf``, SIGTERM."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

BIN = os.path.dirname(sys.executable)


def closed_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class CommandsTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.conf = os.path.join(self.dir.name, 'nova.conf')
        port = closed_port()
        with open(self.conf, 'w') as f:
            f.write('[DEFAULT]\ntransport_url = fake:/\n'
                    '[lifetime_alloc]\ncontrol_url = http://127.0.0.1:%d\ntimeout = 0.2\n'
                    'reconcile_after_error = 0.5\n'
                    '[placement]\nauth_type = admin_token\nendpoint = http://127.0.0.1:%d/placement\n'
                    'token = t\n' % (port, port))

    def run_command(self, *args, **kwargs):
        return subprocess.run([os.path.join(BIN, args[0])] + list(args[1:]), capture_output=True,
                              text=True, timeout=60, **kwargs)

    def test_the_listener_runs_until_sigterm_and_retries_its_reconciliation(self):
        process = subprocess.Popen(
            [os.path.join(BIN, 'lifetime-alloc-nova-listener'), '--config-file', self.conf],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(3.0)
            self.assertIsNone(process.poll())
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        self.assertEqual(0, process.returncode, output)
        self.assertIn('listening on versioned_notifications (pool lifetime-alloc)', output)
        self.assertGreaterEqual(output.count('reconciliation failed'), 2, output)
        self.assertIn('listener stopped', output)

    def test_the_listener_without_a_control_url_says_so(self):
        with open(self.conf, 'w') as f:
            f.write('[DEFAULT]\ntransport_url = fake:/\n')
        result = self.run_command('lifetime-alloc-nova-listener', '--config-file', self.conf)
        self.assertEqual(2, result.returncode)
        self.assertIn('control_url is not set', result.stdout + result.stderr)

    def test_the_reconciliation_reports_a_placement_it_cannot_reach(self):
        result = self.run_command('lifetime-alloc-nova-reconcile', '--config-file', self.conf, '--dry-run')
        self.assertEqual(1, result.returncode)
        self.assertIn('lifetime-alloc-nova-reconcile: failed: ', result.stderr)


if __name__ == '__main__':
    unittest.main()
