"""Clients of the three services' HTTP APIs (``docs/api.md``; each serves its OpenAPI document at
``GET /openapi.json``).

The request and answer bodies are the services' JSON as dicts, shaped as their OpenAPI documents
say. An error answer's RFC 9457 problem body is raised as :class:`~lifetime_alloc.errors.ServiceError`
carrying its ``status``, ``type`` and ``errors`` (``field`` is the first offending field and
``fix`` what the service says of it); a service that cannot be reached raises
:class:`~lifetime_alloc.errors.ServiceUnavailableError` (a ``ConnectionError``) naming the URL.

>>> from lifetime_alloc.client import ControlClient
>>> control = ControlClient("http://127.0.0.1:8080")
>>> control.allocate({"vm_id": "vm-1", "tenant_id": "t-1", "vm_type": "D2",
...                   "demand": {"cores": 2, "memory_gib": 8}})
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .errors import ServiceError, ServiceUnavailableError

Json = Dict[str, Any]


class _Client:
    """JSON over HTTP with an optional bearer token, problems raised as exceptions."""

    def __init__(self, base_url: str, *, token: Optional[str] = None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: Any = None, query: Optional[Mapping[str, Any]] = None) -> Any:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        headers = {"accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                text = answer.read()
                if "json" in answer.headers.get("content-type", ""):
                    return json.loads(text)
                # Probes and metrics answer text.
                return text.decode("utf-8", "replace") if text else None
        except urllib.error.HTTPError as error:
            raise _problem(error, method, path) from None
        except (urllib.error.URLError, socket.timeout, ConnectionError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ServiceUnavailableError(
                f"{method} {url}: the service cannot be reached ({reason})",
                field="base_url",
                fix=f"start the service or correct the address ({self.base_url}); scripts/stack.sh up starts the stack",
            ) from None

    def health(self) -> bool:
        """True when ``GET /readyz`` answers 2xx."""
        try:
            self._request("GET", "/readyz")
            return True
        except ServiceError:
            return False

    def openapi(self) -> Json:
        """The service's OpenAPI document."""
        return self._request("GET", "/openapi.json")


def _problem(error: "urllib.error.HTTPError", method: str, path: str) -> ServiceError:
    try:
        problem = json.loads(error.read() or b"{}")
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    errors: List[Json] = list(problem.get("errors") or [])
    first = errors[0] if errors else {}
    detail = problem.get("detail") or problem.get("title") or error.reason
    kind = problem.get("type", f"HTTP {error.code}")
    message = f"{method} {path}: {error.code} {kind}: {detail}"
    if errors:
        message += "; " + "; ".join(f"{e.get('field')}: {e.get('message')}" for e in errors)
    fix = first.get("message") or (
        "retry later" if error.code in (429, 502, 503, 504) else None)
    return ServiceError(message, status=error.code, problem=problem, field=first.get("field"), fix=fix)


class ControlClient(_Client):
    """The control service, the public front door (``docs/control-service.md``)."""

    def allocate(self, vm: Optional[Json] = None, *, gang: Optional[Json] = None) -> Json:
        """``POST /allocate``: one VM (``{"vm_id", "tenant_id", "vm_type", "demand", ...}``) or a gang."""
        body = {"gang": gang} if gang is not None else {"vm": vm}
        return self._request("POST", "/allocate", body)

    def release(self, vm_id: str, *, ended_at_s: Optional[float] = None) -> Any:
        """``DELETE /allocate/{vm_id}``."""
        return self._request("DELETE", f"/allocate/{urllib.parse.quote(vm_id, safe='')}",
                             query={"ended_at_s": ended_at_s})

    def lookup(self, vm_id: str) -> Json:
        """``GET /allocate/{vm_id}``: where a VM runs."""
        return self._request("GET", f"/allocate/{urllib.parse.quote(vm_id, safe='')}")

    def stats(self) -> Json:
        """``GET /v1/stats``: cache, fallbacks, safeguard, realized quality, each zone's stats."""
        return self._request("GET", "/v1/stats")

    def zones(self) -> Json:
        """``GET /v1/zones``."""
        return self._request("GET", "/v1/zones")

    def explain(self, zone: str, vm: Json, *, why_not: Optional[str] = None, top: Optional[int] = None) -> Json:
        """``POST /v1/zones/{zone}/explain``: why the zone's allocator would choose a host."""
        body: Json = {"vm": vm}
        if why_not is not None:
            body["why_not"] = why_not
        if top is not None:
            body["top"] = top
        return self._request("POST", f"/v1/zones/{urllib.parse.quote(zone, safe='')}/explain", body)


class AllocatorClient(_Client):
    """An allocator (``docs/allocator.md``); ``token`` is its service token when it has one."""

    def allocate(self, vm: Optional[Json] = None, *, gang: Optional[Json] = None) -> Json:
        """``POST /v1/allocations``."""
        body = {"gang": gang} if gang is not None else {"vm": vm}
        return self._request("POST", "/v1/allocations", body)

    def release(self, vm_id: str, *, ended_at_s: Optional[float] = None) -> Any:
        """``DELETE /v1/allocations/{vm_id}``."""
        return self._request("DELETE", f"/v1/allocations/{urllib.parse.quote(vm_id, safe='')}",
                             query={"ended_at_s": ended_at_s})

    def explain(self, vm: Json, *, why_not: Optional[str] = None, top: Optional[int] = None) -> Json:
        """``POST /v1/explain``: a dry run of the placement, with the best hosts and why."""
        body: Json = {"vm": vm}
        if why_not is not None:
            body["why_not"] = why_not
        if top is not None:
            body["top"] = top
        return self._request("POST", "/v1/explain", body)

    def stats(self) -> Json:
        """``GET /v1/stats``: packing density, empty hosts, rejections, ..."""
        return self._request("GET", "/v1/stats")

    def hosts(self, **query: Any) -> Json:
        """``GET /v1/hosts``."""
        return self._request("GET", "/v1/hosts", query=query)


class InferenceClient(_Client):
    """An inference server (``docs/inference-server.md``); ``admin_token`` opens the rollout routes."""

    def __init__(self, base_url: str, *, token: Optional[str] = None, admin_token: Optional[str] = None,
                 timeout_s: float = 10.0) -> None:
        super().__init__(base_url, token=token, timeout_s=timeout_s)
        self.admin_token = admin_token

    def predict(self, instances: Sequence[Json], *, interval_class: bool = False) -> List[Json]:
        """``POST /v1/predict`` (at most 1024 instances a call; larger lists are sent in batches).

        ``instances``: ``PredictInstance`` dicts, e.g. :func:`lifetime_alloc.models.predict_instances`
        of a trace frame. Returns one prediction per instance, in order.
        """
        out: List[Json] = []
        for start in range(0, len(instances), 1024):
            body = {"instances": list(instances[start:start + 1024]), "interval_class": interval_class}
            out.extend(self._request("POST", "/v1/predict", body)["predictions"])
        return out

    def models(self) -> Json:
        """``GET /v1/models``: the bundles and the rollout."""
        return self._request("GET", "/v1/models")

    def _admin(self, path: str, body: Any = None) -> Any:
        saved = self.token
        self.token = self.admin_token or self.token
        try:
            return self._request("POST", path, body if body is not None else {})
        finally:
            self.token = saved

    def set_canary(self, bundle: str, share: float, *, auto: bool = False) -> Json:
        """``POST /v1/models/canary``: serve ``bundle`` to ``share`` of the traffic."""
        body: Json = {"bundle": bundle, "share": share}
        if auto:
            body["auto"] = True
        return self._admin("/v1/models/canary", body)

    def promote(self) -> Json:
        """``POST /v1/models/promote``."""
        return self._admin("/v1/models/promote")

    def rollback(self) -> Json:
        """``POST /v1/models/rollback``."""
        return self._admin("/v1/models/rollback")

    def reload(self) -> Json:
        """``POST /v1/models/reload``."""
        return self._admin("/v1/models/reload")


__all__ = ["ControlClient", "AllocatorClient", "InferenceClient"]
