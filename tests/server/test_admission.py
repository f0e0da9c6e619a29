"""Queue bounds (429), draining / not ready (503), and release-exactly-once accounting."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from surge.server.admission import AdmissionController
from surge.server.errors import RateLimitError, ServiceUnavailableError, install_error_handlers


def test_bound_counts_engine_waiting_plus_pending() -> None:
    ac = AdmissionController(max_queued_requests=3)
    a = ac.admit(10, num_waiting=1, waiting_tokens=0)
    b = ac.admit(10, num_waiting=1, waiting_tokens=0)
    assert ac.pending_requests == 2 and ac.pending_tokens == 20
    with pytest.raises(RateLimitError, match="3 requests waiting") as info:
        ac.admit(10, num_waiting=1, waiting_tokens=0)
    assert info.value.status_code == 429 and info.value.code == "queue_full"
    # Once the engine has a request it shows in num_waiting and leaves our pending count.
    a.mark_started()
    assert ac.pending_requests == 1 and ac.pending_tokens == 10
    ac.admit(10, num_waiting=1, waiting_tokens=0)
    b.release()
    assert ac.pending_requests == 1


def test_token_bound_but_empty_queue_always_admits_one() -> None:
    ac = AdmissionController(max_queued_requests=100, max_queued_tokens=1000)
    ac.admit(5000, num_waiting=0, waiting_tokens=0)  # oversize alone: still admitted
    with pytest.raises(RateLimitError, match="prompt tokens waiting"):
        ac.admit(1, num_waiting=0, waiting_tokens=0)
    ac2 = AdmissionController(max_queued_requests=100, max_queued_tokens=1000)
    ac2.admit(400, num_waiting=1, waiting_tokens=500)
    with pytest.raises(RateLimitError):
        ac2.admit(101, num_waiting=1, waiting_tokens=500)
    ac2.admit(100, num_waiting=1, waiting_tokens=500)


def test_draining_and_not_ready_are_503() -> None:
    ac = AdmissionController(max_queued_requests=10, retry_after_s=4.2, ready=False)
    with pytest.raises(ServiceUnavailableError, match="not ready") as info:
        ac.admit(1, 0, 0)
    assert info.value.status_code == 503 and info.value.headers["Retry-After"] == "5"
    ac.set_ready(True)
    ticket = ac.admit(1, 0, 0)
    ac.start_draining()
    assert ac.draining
    with pytest.raises(ServiceUnavailableError, match="shutting down"):
        ac.admit(1, 0, 0)
    assert ac.in_flight == 1  # admitted work keeps running while draining
    ticket.release()
    assert ac.in_flight == 0


def test_release_exactly_once() -> None:
    ac = AdmissionController(max_queued_requests=1)
    t = ac.admit(7, 0, 0)
    t.release()
    t.release()
    t.mark_started()  # late start after release changes nothing
    assert (ac.pending_requests, ac.pending_tokens, ac.in_flight) == (0, 0, 0)
    assert t.released
    started = ac.admit(7, 0, 0)
    started.mark_started()
    started.mark_started()
    assert (ac.pending_requests, ac.in_flight) == (0, 1)
    started.release()
    started.release()
    assert ac.in_flight == 0


def test_context_manager_releases_on_error() -> None:
    ac = AdmissionController(max_queued_requests=1)
    with pytest.raises(RuntimeError), ac.admit(3, 0, 0) as ticket:
        ticket.mark_started()
        raise RuntimeError("client went away")
    assert ac.in_flight == 0 and ac.pending_requests == 0
    with ac.admit(3, 0, 0):
        assert ac.in_flight == 1
    assert ac.in_flight == 0


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        AdmissionController(max_queued_requests=0)
    with pytest.raises(ValueError):
        AdmissionController(max_queued_requests=1, max_queued_tokens=0)


async def test_429_and_503_over_http() -> None:
    ac = AdmissionController(max_queued_requests=1, retry_after_s=2.0)
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/completions")
    async def completions() -> dict[str, bool]:
        ac.admit(1, num_waiting=1, waiting_tokens=0)  # the engine queue is already full
        return {"ok": True}

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        resp = await client.post("/v1/completions")
        assert resp.status_code == 429 and resp.headers["retry-after"] == "2"
        assert resp.json()["error"]["type"] == "rate_limit_error"
        ac.start_draining()
        resp = await client.post("/v1/completions")
        assert resp.status_code == 503 and resp.headers["retry-after"] == "2"
        assert resp.json()["error"]["code"] == "draining"


def test_per_tenant_bound_leaves_room_for_other_tenants() -> None:
    ac = AdmissionController(max_queued_requests=10, max_queued_per_tenant=2)
    a1 = ac.admit(5, tenant="noisy")
    ac.admit(5, tenant="noisy")
    with pytest.raises(RateLimitError, match="for this tenant") as info:
        ac.admit(5, tenant="noisy")
    assert info.value.code == "tenant_queue_full" and info.value.retry_after_s > 0
    ac.admit(5, tenant="quiet")  # the shared queue still has room for everyone else
    assert ac.pending_for("noisy") == 2 and ac.pending_for("quiet") == 1
    a1.mark_started()  # generating: no longer queued, the tenant may queue another
    ac.admit(5, tenant="noisy")
    assert ac.pending_for("noisy") == 2 and ac.pending_requests == 3
