"""A small client of the control service's HTTP API over ``requests``: every call bounded by the
configured timeout, every failure one of the typed errors below (never a ``requests`` exception).

Routes (docs/openstack.md): ``POST /v1/allocate`` (a reservation among candidates), ``PUT
/v1/allocate/{vm_id}`` (the VM is on that host), ``DELETE``/``GET /v1/allocate/{vm_id}``, and the
zone's hosts: ``GET /v1/zones/{zone}/hosts``, ``PUT``/``DELETE /v1/zones/{zone}/hosts/{host_id}``.
"""

import queue

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
        # Sessions keep their connections open; one per concurrent caller (green threads of the
        # scheduler included), handed back after each call.
        self._sessions = queue.LifoQueue()

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
            return session

    def close(self):
        """Closes the idle connections."""
        while True:
            try:
                self._sessions.get_nowait().close()
            except queue.Empty:
                return

    def _call(self, method, path, body=None, params=None, timeout=None):
        session = self._session()
        url = self.base_url + path
        limit = timeout or self.timeout
        try:
            response = session.request(method, url, json=body, params=params, timeout=(limit, limit))
        except requests.Timeout as exc:
            session.close()
            raise Timeout('%s %s: no answer within %.3f s (%s)' % (method, path, limit, exc))
        except requests.RequestException as exc:
            session.close()
            raise Unreachable('%s %s: %s' % (method, path, exc))
        self._sessions.put(session)
        status = response.status_code
        if status == 204:
            return None
        try:
            answer = response.json() if response.content else None
        except ValueError:
            answer = None
        if status < 300:
            if answer is None and response.content:
                raise ServerError('%s %s: %d with a body that is not JSON' % (method, path, status), status)
            return answer
        problem = answer if isinstance(answer, dict) else {}
        detail = problem.get('detail') or problem.get('title') or response.text[:200]
        message = '%s %s: %d %s' % (method, path, status, detail)
        if status == 404:
            raise NotFound(message, status, problem)
        if status == 409:
            raise Conflict(message, status, problem)
        if status < 500:
            raise Refused(message, status, problem)
        raise ServerError(message, status, problem)

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
