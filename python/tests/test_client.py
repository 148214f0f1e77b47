"""The HTTP client: the services' problem bodies raised as exceptions with the field and the fix;
an unreachable service is a ConnectionError naming the address."""

from __future__ import annotations

import pytest

from conftest import free_port
from lifetime_alloc.client import ControlClient, InferenceClient
from lifetime_alloc.errors import ServiceError, ServiceUnavailableError


def test_an_unreachable_service() -> None:
    client = ControlClient(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(ConnectionError) as error:
        client.stats()
    assert isinstance(error.value, ServiceUnavailableError)
    assert error.value.field == "base_url"
    assert "start the service" in error.value.fix


def test_a_problem_body_names_the_field(inference_server: str) -> None:
    client = InferenceClient(inference_server)
    bad = {"tenant_id": "t", "vm_type": "D2", "cores": -2, "memory_gib": 8}
    with pytest.raises(ServiceError) as error:
        client.predict([bad])
    assert error.value.status == 422
    assert error.value.problem["type"] == "urn:problem:invalid-request"
    assert error.value.field == "instances[0].cores"
    assert error.value.fix


def test_models_and_openapi(inference_server: str) -> None:
    client = InferenceClient(inference_server)
    assert client.health()
    assert "/v1/predict" in client.openapi()["paths"]
    assert client.models()
    with pytest.raises(ServiceError) as error:
        client.promote()  # no admin token configured: the admin routes are closed
    assert error.value.status in (401, 403)
