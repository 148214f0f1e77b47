"""A small client of the control service's HTTP API: every call bounded by the configured
timeout, every failure one of the typed errors below (never a transport exception).

Routes (docs/openstack.md): ``POST /v1/allocate`` (a reservation among candidates), ``PUT
/v1/allocate/{vm_id}`` (the VM is on that host), ``DELETE``/``GET /v1/allocate/{vm_id}``, and the
zone's hosts: ``GET /v1/zones/{zone}/hosts``, ``PUT``/``DELETE /v1/zones/{zone}/hosts/{host_id}``.

The weigher calls it on the scheduler's critical path, so a plain ``http://`` URL that no proxy
applies to (the usual set-up) is served by the standard library's ``http.client`` on kept-alive
connections: one ``send`` per request and about 0.4x the CPU of ``requests`` (0.35 against 0.85
ms a call on the 2-core development machine; docs/benchmarks.md, "Issue 57: the Nova weigher").
``https://``, a proxy from the environment, or credentials in the URL go through ``requests``,
which handles them.
"""

import http.client
import json
import queue
import select
import socket
import time
import urllib.parse

import requests

from lifetime_alloc_openstack import mapping


class ControlError(Exception):
    """A call that did not succeed. ``outcome`` is the counter it is filed under."""

    outcome = 'error'

    def __init__(self, message, status=None, problem=None):
        super().__init__(message)
        self.status = status
        self.problem = problem or {}

    @property
    def problem_type(self):
        return self.problem.get('type')


class Unreachable(ControlError):
    """No connection to the control service."""

    outcome = 'unreachable'


class Timeout(ControlError):
    """The control service did not answer within the timeout (the call may still take effect)."""

    outcome = 'timeout'


class Refused(ControlError):
    """A 4xx answer: the request was read and refused (``problem`` is its RFC 9457 body)."""

    outcome = 'refused'


class ServerError(ControlError):
    """A 5xx answer, or an answer that could not be read."""

    outcome = 'server_error'


class NotFound(Refused):
    """404: no such VM or host."""

    outcome = 'not_found'


class Conflict(Refused):
    """409: the change does not fit or contradicts what the allocator holds."""

    outcome = 'conflict'


class ControlClient(object):
    """The control service at ``base_url`` for ``zone``, with ``token`` as the bearer."""

    def __init__(self, base_url, token=None, timeout=0.5, zone='zone-1'):
        self.base_url = base_url.rstrip('/')
        self.timeout = timeout
        self.zone = mapping.check_id(zone, 'the zone')
        self.headers = {'Accept': 'application/json'}
        if token:
            self.headers['Authorization'] = 'Bearer %s' % token
        # Called after every answer as observer(method, path, status, headers, seconds); None by
        # default (a benchmark reads the services' Server-Timing headers through it).
        self.observer = None
        # Sessions and connections stay open; one per concurrent caller (the scheduler's
        # threads or green threads), handed back after each call.
        self._sessions = queue.LifoQueue()
        self._connections = queue.LifoQueue()
        self._direct = self._direct_target(self.base_url)
        self._direct_headers = dict(self.headers, **{'User-Agent': 'lifetime-alloc-openstack'})

    @staticmethod
    def _direct_target(url):
        """(host, port, path prefix) when ``url`` can be served by http.client, else None."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port or 80
        except ValueError:
            return None
        if parts.scheme != 'http' or not parts.hostname or parts.username or parts.password:
            return None
        if requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url)):
            return None
        return parts.hostname, port, parts.path

    @classmethod
    def from_conf(cls, conf_group):
        """The client the ``[lifetime_alloc]`` options describe, or None without ``control_url``."""
        if not conf_group.control_url:
            return None
        return cls(conf_group.control_url, conf_group.token, conf_group.timeout, conf_group.zone)

    def _session(self):
        try:
            return self._sessions.get_nowait()
        except queue.Empty:
            session = requests.Session()
            session.headers.update(self.headers)
            # The environment's proxy and CA bundle settings, read once here instead of at every
            # call (requests' trust_env looks up the proxy variables and ~/.netrc per request:
            # about 0.2 ms of the scheduler's critical path). ~/.netrc is left out on purpose:
            # its credentials would replace the bearer token.
            settings = session.merge_environment_settings(self.base_url, {}, None, None, None)
            session.proxies.update(settings.get('proxies') or {})
            session.verify = settings.get('verify', True)
            session.trust_env = False
            return session

    def close(self):
        """Closes the idle connections."""
        for pool in (self._sessions, self._connections):
            while True:
                try:
                    pool.get_nowait().close()
                except queue.Empty:
                    break

    def _via_requests(self, method, path, body, params, limit):
        session = self._session()
        try:
            response = session.request(method, self.base_url + path, json=body, params=params,
                                       timeout=(limit, limit))
        except requests.Timeout as exc:
            session.close()
            raise Timeout('%s %s: no answer within %.3f s (%s)' % (method, path, limit, exc))
        except requests.RequestException as exc:
            session.close()
            raise Unreachable('%s %s: %s' % (method, path, exc))
        self._sessions.put(session)
        return response.status_code, response.headers, response.content

    def _connection(self, limit):
        """A kept-alive connection (one the service closed meanwhile is dropped), or a new one;
        and whether it is a reused open one."""
        host, port, _ = self._direct
        while True:
            try:
                connection = self._connections.get_nowait()
            except queue.Empty:
                return http.client.HTTPConnection(host, port, timeout=limit), False
            if connection.sock is None or _dropped(connection.sock):
                connection.close()
                continue
            connection.timeout = limit
            connection.sock.settimeout(limit)
            return connection, True

    def _via_http_client(self, method, path, body, params, limit):
        target = self._direct[2] + path
        if params:
            target += '?' + urllib.parse.urlencode(params)
        headers = self._direct_headers
        data = None
        if body is not None:
            data = json.dumps(body).encode('utf-8')
            headers = dict(headers, **{'Content-Type': 'application/json'})
        for attempt in (1, 2):
            connection, reused = self._connection(limit)
            try:
                connection.request(method, target, data, headers)
                response = connection.getresponse()
                content = response.read()
            except socket.timeout as exc:
                connection.close()
                raise Timeout('%s %s: no answer within %.3f s (%s)' % (method, path, limit, exc))
            except (ConnectionResetError, BrokenPipeError, http.client.BadStatusLine) as exc:
                connection.close()
                if reused and attempt == 1:
                    # The service closed the kept-alive connection as the request went out: once
                    # more on a new one (every route is idempotent: a VM id placed twice is
                    # answered as replayed).
                    continue
                raise Unreachable('%s %s: %s' % (method, path, exc))
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                raise Unreachable('%s %s: %s' % (method, path, exc))
            if response.will_close:
                connection.close()
            else:
                self._connections.put(connection)
            return response.status, response.headers, content

    def _call(self, method, path, body=None, params=None, timeout=None):
        limit = timeout or self.timeout
        started = time.perf_counter()
        if self._direct is not None:
            status, headers, content = self._via_http_client(method, path, body, params, limit)
        else:
            status, headers, content = self._via_requests(method, path, body, params, limit)
        if self.observer is not None:
            self.observer(method, path, status, headers, time.perf_counter() - started)
        return answer_of(method, path, status, content)

    def _vm_path(self, vm_id):
        return '/v1/allocate/%s' % mapping.check_id(vm_id, 'the VM id')

    def allocate(self, request):
        """``POST /v1/allocate`` of one VM (its ``candidates`` included): the decision, ``status``
        ``placed`` (then ``placements[0].host_id``) or ``rejected``. Placing reserves the host."""
        return self._call('POST', '/v1/allocate', {'vm': request})

    def record(self, vm_id, host_id, request):
        """``PUT /v1/allocate/{vm_id}``: the VM is on ``host_id`` (placed there, or moved there,
        whatever the allocator had decided): ``{"recorded": "unchanged"|"placed"|"moved"}``."""
        body = {'host_id': mapping.check_id(host_id, 'the host id'), 'request': request}
        return self._call('PUT', self._vm_path(vm_id), body, params={'zone': self.zone})

    def release(self, vm_id, ended_at_s=None):
        """``DELETE /v1/allocate/{vm_id}``: True when released, False when it was not placed."""
        params = {'zone': self.zone}
        if ended_at_s is not None:
            params['ended_at_s'] = repr(float(ended_at_s))
        try:
            self._call('DELETE', self._vm_path(vm_id), params=params)
        except NotFound:
            return False
        return True

    def lookup(self, vm_id):
        """``GET /v1/allocate/{vm_id}``: the allocator's record of the VM, or None."""
        try:
            return self._call('GET', self._vm_path(vm_id), params={'zone': self.zone})
        except NotFound:
            return None

    def hosts(self, page=1000, timeout=None):
        """Every host of the zone with its VMs' ids: ``[{"host": {...}, "vms": [...]}]``."""
        hosts, offset = [], 0
        while True:
            answer = self._call('GET', '/v1/zones/%s/hosts' % self.zone,
                                params={'offset': offset, 'limit': page}, timeout=timeout)
            batch = answer.get('hosts', [])
            hosts.extend(batch)
            offset += len(batch)
            if not batch or offset >= answer.get('total', 0):
                return hosts

    def put_host(self, host_id, capacity, state=None, timeout=None):
        """``PUT /v1/zones/{zone}/hosts/{host_id}``: adds the host or sets its capacity/state."""
        body = {'capacity': capacity}
        if state:
            body['state'] = state
        path = '/v1/zones/%s/hosts/%s' % (self.zone, mapping.check_id(host_id, 'the host id'))
        return self._call('PUT', path, body, timeout=timeout)

    def delete_host(self, host_id, timeout=None):
        """``DELETE /v1/zones/{zone}/hosts/{host_id}``: True when removed, False when unknown;
        :class:`Conflict` while VMs are on it."""
        path = '/v1/zones/%s/hosts/%s' % (self.zone, mapping.check_id(host_id, 'the host id'))
        try:
            self._call('DELETE', path, timeout=timeout)
        except NotFound:
            return False
        return True


def answer_of(method, path, status, content):
    """A service's answer (``status``, body bytes ``content``) to ``method path``: its JSON body
    (None for 204 or an empty body), or the typed error its status means, with its problem body."""
    if status == 204:
        return None
    try:
        answer = json.loads(content) if content else None
    except ValueError:
        answer = None
    if status < 300:
        if answer is None and content:
            raise ServerError('%s %s: %d with a body that is not JSON' % (method, path, status), status)
        return answer
    problem = answer if isinstance(answer, dict) else {}
    detail = problem.get('detail') or problem.get('title') or content.decode('utf-8', 'replace')[:200]
    message = '%s %s: %d %s' % (method, path, status, detail)
    if status == 404:
        raise NotFound(message, status, problem)
    if status == 409:
        raise Conflict(message, status, problem)
    if status < 500:
        raise Refused(message, status, problem)
    raise ServerError(message, status, problem)


def _dropped(sock):
    """Whether a kept-alive connection's socket is readable while idle: the service closed it
    (or sent something unasked); either way it is not reused."""
    try:
        poller = select.poll()
    except AttributeError:  # eventlet's green select has no poll
        return bool(select.select([sock], [], [], 0)[0])
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
