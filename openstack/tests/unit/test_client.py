"""client: the control service's routes, the bearer token, the timeout and the typed errors,
against a local HTTP server that answers what each test scripts."""

import http.server
import json
import socket
import threading
import time
import unittest

from lifetime_alloc_openstack import client


class Script(object):
    """What the server answers: ``(status, body, delay_s)`` per ``(method, path)``."""

    def __init__(self):
        self.answers = {}
        self.seen = []
        # The client's address of each request (its connection), and whether the server drops a
        # kept-alive connection after answering (an idle close, with no ``Connection: close``).
        self.peers = []
        self.drop_after_answer = False


def make_handler(script):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'

        def log_message(self, *args):
            pass

        def _answer(self):
            length = int(self.headers.get('Content-Length') or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            path = self.path.split('?')[0]
            script.seen.append((self.command, self.path, dict(self.headers), body))
            script.peers.append(self.client_address)
            status, answer, delay = script.answers.get((self.command, path), (404, {'type': 'urn:problem:not-found', 'detail': 'no route'}, 0))
            if delay:
                time.sleep(delay)
            data = b'' if status == 204 else json.dumps(answer).encode()
            try:
                self._send(status, data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                pass
            if script.drop_after_answer:
                self.close_connection = True

        def _send(self, status, data):
            self.send_response(status)
            if data:
                self.send_header('Content-Type', 'application/problem+json' if status >= 400 else 'application/json')
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _answer
    return Handler


def serve(test, script):
    """A local server answering ``script`` for ``test`` (stopped at its cleanup); its base URL."""
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), make_handler(script))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    test.addCleanup(server.server_close)
    test.addCleanup(server.shutdown)
    test.server = server
    return 'http://127.0.0.1:%d' % server.server_address[1]


class ClientTest(unittest.TestCase):

    def setUp(self):
        self.script = Script()
        self.base = serve(self, self.script)
        self.client = client.ControlClient(self.base + '/', token='secret', timeout=0.3, zone='zone-1')

    def test_allocate_posts_the_vm_with_the_bearer_token(self):
        decision = {'status': 'placed', 'placements': [{'vm_id': 'v1', 'host_id': 'host2'}]}
        self.script.answers[('POST', '/v1/allocate')] = (201, decision, 0)
        self.assertEqual(self.client.allocate({'vm_id': 'v1'}), decision)
        method, path, headers, body = self.script.seen[-1]
        self.assertEqual(body, {'vm': {'vm_id': 'v1'}})
        self.assertEqual(headers['Authorization'], 'Bearer secret')

    def test_record_release_lookup_and_hosts_use_the_zone(self):
        self.script.answers[('PUT', '/v1/allocate/v1')] = (200, {'recorded': 'moved'}, 0)
        self.script.answers[('DELETE', '/v1/allocate/v1')] = (204, None, 0)
        self.script.answers[('GET', '/v1/allocate/v1')] = (200, {'host_id': 'host1'}, 0)
        self.assertEqual(self.client.record('v1', 'host1', {'vm_id': 'v1'}), {'recorded': 'moved'})
        self.assertEqual(self.script.seen[-1][3], {'host_id': 'host1', 'request': {'vm_id': 'v1'}})
        self.assertIn('zone=zone-1', self.script.seen[-1][1])
        self.assertTrue(self.client.release('v1', ended_at_s=12.5))
        self.assertIn('ended_at_s=12.5', self.script.seen[-1][1])
        self.assertEqual(self.client.lookup('v1'), {'host_id': 'host1'})
        self.assertFalse(self.client.release('v2'))  # 404: nothing left to release
        self.assertIsNone(self.client.lookup('v2'))

    def test_hosts_are_read_page_by_page(self):
        pages = iter([{'total': 3, 'offset': 0, 'hosts': [{'host_id': 'a', 'vms': []}, {'host_id': 'b', 'vms': []}]},
                      {'total': 3, 'offset': 2, 'hosts': [{'host_id': 'c', 'vms': ['v']}]}])

        class Pages(dict):
            def get(self, key, default=None):
                if key == ('GET', '/v1/zones/zone-1/hosts'):
                    return (200, next(pages), 0)
                return dict.get(self, key, default)
        self.script.answers = Pages()
        hosts = self.client.hosts(page=2)
        self.assertEqual([h['host_id'] for h in hosts], ['a', 'b', 'c'])

    def test_host_changes(self):
        self.script.answers[('PUT', '/v1/zones/zone-1/hosts/host1')] = (200, {'host_id': 'host1'}, 0)
        self.script.answers[('DELETE', '/v1/zones/zone-1/hosts/host1')] = (409, {'type': 'urn:problem:host-not-empty', 'detail': 'VMs on it'}, 0)
        self.client.put_host('host1', {'cores': 8.0, 'memory_gib': 7.5}, 'unavailable')
        self.assertEqual(self.script.seen[-1][3], {'capacity': {'cores': 8.0, 'memory_gib': 7.5}, 'state': 'unavailable'})
        with self.assertRaises(client.Conflict) as caught:
            self.client.delete_host('host1')
        self.assertEqual(caught.exception.problem_type, 'urn:problem:host-not-empty')
        self.assertFalse(self.client.delete_host('host9'))

    def test_problems_are_typed_errors(self):
        for status, kind in [(422, client.Refused), (401, client.Refused), (409, client.Conflict),
                             (502, client.ServerError), (503, client.ServerError)]:
            self.script.answers[('POST', '/v1/allocate')] = (status, {'type': 't', 'detail': 'd%d' % status}, 0)
            with self.assertRaises(kind) as caught:
                self.client.allocate({})
            self.assertEqual(caught.exception.status, status)
            self.assertIn('d%d' % status, str(caught.exception))

    def test_a_slow_answer_is_a_timeout_within_the_limit(self):
        self.script.answers[('POST', '/v1/allocate')] = (201, {}, 1.0)
        started = time.monotonic()
        with self.assertRaises(client.Timeout) as caught:
            self.client.allocate({})
        self.assertLess(time.monotonic() - started, 0.9)
        self.assertEqual(caught.exception.outcome, 'timeout')

    def test_one_connection_is_kept_alive_across_calls(self):
        self.script.answers[('GET', '/v1/allocate/vm-1')] = (200, {'vm_id': 'vm-1', 'host_id': 'h1'}, 0)
        for _ in range(3):
            self.assertEqual('h1', self.client.lookup('vm-1')['host_id'])
        self.assertEqual(1, len(set(self.script.peers)), self.script.peers)

    def test_a_connection_the_service_closed_while_idle_is_replaced(self):
        self.script.answers[('GET', '/v1/allocate/vm-1')] = (200, {'vm_id': 'vm-1', 'host_id': 'h1'}, 0)
        self.script.drop_after_answer = True
        self.assertEqual('h1', self.client.lookup('vm-1')['host_id'])
        time.sleep(0.1)  # the server's close reaches the client's socket
        self.script.drop_after_answer = False
        self.assertEqual('h1', self.client.lookup('vm-1')['host_id'])
        self.assertEqual(2, len(self.script.seen), 'each call sent once')
        self.assertEqual(2, len(set(self.script.peers)), 'a new connection for the second call')

    def test_a_closed_port_is_unreachable(self):
        sock = socket.socket()
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
        sock.close()
        closed = client.ControlClient('http://127.0.0.1:%d' % port, timeout=0.3)
        with self.assertRaises(client.Unreachable) as caught:
            closed.allocate({})
        self.assertEqual(caught.exception.outcome, 'unreachable')

    def test_ids_outside_the_charset_are_refused_before_any_call(self):
        with self.assertRaises(ValueError):
            self.client.record('has space', 'host1', {})
        self.assertEqual(self.script.seen, [])


if __name__ == '__main__':
    unittest.main()
