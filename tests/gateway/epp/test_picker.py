"""The endpoint picker's decisions and its ext_proc conversation, in process: real pools,
balancers and breakers, the messages Envoy sends (built from the vendored protos), a clock
passed in. Through a real Envoy: test_envoy.py."""

from __future__ import annotations

import json
import random

import pytest

from surge.gateway.balancers import make_balancer
from surge.gateway.config import BreakerConfig, DegradeConfig, GatewayConfig, UpstreamConfig
from surge.gateway.epp import messages as m
from surge.gateway.epp.config import EppConfig
from surge.gateway.epp.flow import Flow
from surge.gateway.epp.picker import Pick, Picker, PickRequest, Refusal, endpoint_of
from surge.gateway.epp.proto import base_pb2 as core
from surge.gateway.epp.proto import external_processor_pb2 as pb
from surge.gateway.epp.proto import processing_mode_pb2 as mode_pb
from surge.gateway.upstreams import FALLBACK, PRIMARY, RouteKey, ScrapedLoad, UpstreamPool

URLS = ("http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000")
Mode = mode_pb.ProcessingMode


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_picker(**overrides: object) -> tuple[Picker, UpstreamPool, Clock]:
    config = GatewayConfig(upstreams=tuple(UpstreamConfig(u) for u in URLS), **overrides)  # type: ignore[arg-type]
    pool = UpstreamPool(config)
    rng = random.Random(0)
    balancers = {g: make_balancer(config.policy, config.prefix, rng) for g in (PRIMARY, FALLBACK)}
    clock = Clock()
    return Picker(config, pool, balancers, clock), pool, clock


def test_endpoint_of_gives_host_and_port() -> None:
    assert endpoint_of("http://10.0.0.1:8000") == "10.0.0.1:8000"
    assert endpoint_of("http://[fd00::1]:8000") == "[fd00::1]:8000"
    assert endpoint_of("https://10.0.0.1") == "10.0.0.1:443"


def test_pick_holds_one_in_flight_until_released_and_lists_fallbacks() -> None:
    picker, pool, _ = make_picker(epp=EppConfig(fallbacks=2))
    pool.get(URLS[2]).load = ScrapedLoad(num_waiting=3, num_running=1)  # type: ignore[union-attr]
    pick = picker.pick(PickRequest(RouteKey()))
    assert isinstance(pick, Pick)
    assert pick.primary.in_flight == 1
    others = [u.url for u in pick.fallbacks]
    assert sorted([pick.primary.url, *others]) == sorted(URLS)
    assert others[-1] == URLS[2] or pick.primary.url == URLS[2]  # the loaded one comes last
    assert pick.endpoints == ",".join(endpoint_of(u) for u in [pick.primary.url, *others])
    picker.report(pick, 200)
    picker.release(pick)
    picker.release(pick)  # once only
    assert pick.primary.in_flight == 0


def test_no_fallbacks_by_default_for_an_original_dst_cluster() -> None:
    picker, _, _ = make_picker()
    pick = picker.pick(PickRequest(RouteKey()))
    assert isinstance(pick, Pick) and pick.fallbacks == () and "," not in pick.endpoints


def test_subset_hint_is_honoured_and_an_empty_one_is_503() -> None:
    picker, _, _ = make_picker(epp=EppConfig(fallbacks=2))
    for _ in range(5):
        pick = picker.pick(PickRequest(RouteKey(), subset=frozenset({"10.0.0.2:8000"})))
        assert isinstance(pick, Pick) and pick.endpoints == "10.0.0.2:8000"
    for subset in (frozenset(), frozenset({"10.9.9.9:8000"})):
        refusal = picker.pick(PickRequest(RouteKey(), subset=subset))
        assert isinstance(refusal, Refusal)
        assert (refusal.error.status_code, refusal.reason) == (503, "subset_empty")


def test_none_in_rotation_is_503_with_retry_after() -> None:
    picker, pool, _ = make_picker()
    for u in pool.all():
        u.health.healthy = False
    refusal = picker.pick(PickRequest(RouteKey()))
    assert isinstance(refusal, Refusal) and refusal.error.status_code == 503
    assert refusal.error.headers["Retry-After"] == "1"


def test_saturated_pool_sheds_sheddable_first() -> None:
    picker, _, _ = make_picker(degrade=DegradeConfig(max_in_flight=1),
                                  epp=EppConfig(objectives=("batch=-1", "chat=10")))  # fmt: skip
    assert picker.priority_of("batch") == -1 and picker.priority_of("chat") == 10
    assert picker.priority_of("-3") == -3 and picker.priority_of("unknown") == 0
    held = [picker.pick(PickRequest(RouteKey())) for _ in URLS]
    assert all(isinstance(p, Pick) for p in held)  # one each: now all saturated
    shed = picker.pick(PickRequest(RouteKey(), priority=picker.priority_of("batch")))
    assert isinstance(shed, Refusal)
    assert (shed.error.status_code, shed.reason) == (429, "sheddable_shed")
    kept = picker.pick(PickRequest(RouteKey(), priority=0))  # not sheddable: queued upstream
    assert isinstance(kept, Pick)
    for p in [*held, kept]:
        assert isinstance(p, Pick)
        picker.release(p)
    again = picker.pick(PickRequest(RouteKey(), priority=-1))
    assert isinstance(again, Pick)  # room again: sheddable requests go through


def test_saturation_from_scraped_queue_and_kv_usage() -> None:
    picker, pool, _ = make_picker(epp=EppConfig(saturation_waiting=5, saturation_kv_usage=0.8))
    for i, u in enumerate(pool.all()):
        u.load = ScrapedLoad(num_waiting=6) if i else ScrapedLoad(kv_cache_usage=0.9)
    assert isinstance(picker.pick(PickRequest(RouteKey(), priority=-1)), Refusal)
    pool.all()[0].load = ScrapedLoad(kv_cache_usage=0.5)
    pick = picker.pick(PickRequest(RouteKey(), priority=-1))
    assert isinstance(pick, Pick) and pick.primary is pool.all()[0]


def test_degrade_shed_applies_to_everyone_when_configured() -> None:
    picker, _, _ = make_picker(degrade=DegradeConfig(action="shed", max_in_flight=1,
                                                     shed_status=503))  # fmt: skip
    for _ in URLS:
        assert isinstance(picker.pick(PickRequest(RouteKey())), Pick)
    refusal = picker.pick(PickRequest(RouteKey(), priority=5))
    assert isinstance(refusal, Refusal) and refusal.error.status_code == 503


def test_report_from_a_fallback_counts_against_the_primary() -> None:
    picker, _, clock = make_picker(epp=EppConfig(fallbacks=1),
                                   breaker=BreakerConfig(failure_threshold=1))  # fmt: skip
    pick = picker.pick(PickRequest(RouteKey()))
    assert isinstance(pick, Pick)
    fallback = pick.fallbacks[0]
    picker.report(pick, 200, served=endpoint_of(fallback.url))  # the data plane moved on
    picker.release(pick)
    assert not pick.primary.breaker.can_attempt(clock.now)  # one failure opens it here
    assert fallback.breaker.can_attempt(clock.now) and fallback.in_flight == 0


def test_data_planes_own_503_is_a_failure_an_upstreams_is_not() -> None:
    picker, pool, clock = make_picker(policy="round_robin")
    up = pool.get(URLS[0])
    assert up is not None
    for _ in range(3):  # the upstream's own 503s: busy, not sick (it asked for a pause)
        pick = picker.pick(PickRequest(RouteKey(), subset=frozenset({endpoint_of(up.url)})))
        assert isinstance(pick, Pick)
        picker.report(pick, 503, via_upstream=True, retry_after_s=3.0)
        picker.release(pick)
    assert up.throttled(clock.now) and up.in_rotation(clock.now)
    for _ in range(3):  # the data plane's own 503 (could not connect): outlier_failures = 3
        pick = picker.pick(PickRequest(RouteKey(), subset=frozenset({endpoint_of(up.url)})))
        assert isinstance(pick, Pick)
        picker.report(pick, 503, via_upstream=False)
        picker.release(pick)
    assert not up.in_rotation(clock.now)


# --- the ext_proc conversation (Flow) ---


def headers_msg(
    headers: dict[str, str], end_of_stream: bool = False, **kw: object
) -> pb.ProcessingRequest:
    hm = core.HeaderMap(headers=[core.HeaderValue(key=k, raw_value=v.encode())
                                 for k, v in headers.items()])  # fmt: skip
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=hm, end_of_stream=end_of_stream), **kw
    )  # type: ignore[arg-type]


def protocol(request: int, response: int) -> pb.ProtocolConfiguration:
    return pb.ProtocolConfiguration(request_body_mode=request, response_body_mode=response)  # type: ignore[arg-type]


def set_headers(common: pb.CommonResponse) -> dict[str, str]:
    return {o.header.key: o.header.raw_value.decode() for o in common.header_mutation.set_headers}


BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi " * 200}]}).encode()


def test_full_duplex_answers_after_the_body_and_sends_it_back() -> None:
    picker, _, _ = make_picker(epp=EppConfig(objectives=("chat=3",)))
    flow = Flow(picker, picker.config)
    duplex = protocol(Mode.FULL_DUPLEX_STREAMED, Mode.FULL_DUPLEX_STREAMED)
    client = {":method": "POST", m.OBJECTIVE: "chat", m.DESTINATION: "6.6.6.6:1"}
    first = headers_msg(client, protocol_config=duplex)
    assert flow.handle(first) == []  # nothing until the body is in
    assert flow.handle(pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY[:100]))) == []
    out = flow.handle(
        pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY[100:], end_of_stream=True))
    )
    assert [o.WhichOneof("response") for o in out] == ["request_headers", "request_body"]
    common = out[0].request_headers.response
    headers = set_headers(common)
    assert headers[m.DESTINATION] in {endpoint_of(u) for u in URLS}  # the client's overwritten
    assert headers["x-surge-priority"] == "-3" and common.clear_route_cache
    lb = out[0].dynamic_metadata.fields[m.NAMESPACE].struct_value.fields[m.DESTINATION]
    assert lb.string_value == headers[m.DESTINATION]  # header and metadata agree
    sent = out[1].request_body.response.body_mutation.streamed_response
    assert sent.body == BODY and sent.end_of_stream
    assert flow.pick is not None and flow.pick.primary.in_flight == 1
    status = core.HeaderMap(headers=[core.HeaderValue(key=":status", raw_value=b"200")])
    resp = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=status))
    assert flow.handle(resp)[0].HasField("response_headers")
    chunk = flow.handle(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: x\n\n")))
    assert chunk[0].response_body.response.body_mutation.streamed_response.body == b"data: x\n\n"
    flow.close()
    assert flow.pick.primary.in_flight == 0


def test_buffered_routes_in_the_body_answer() -> None:
    picker, _, _ = make_picker()
    flow = Flow(picker, picker.config)
    out = flow.handle(headers_msg({":method": "POST"},
                                  protocol_config=protocol(Mode.BUFFERED, Mode.NONE)))  # fmt: skip
    assert out[0].HasField("request_headers") and not set_headers(out[0].request_headers.response)
    out = flow.handle(pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True)))
    assert out[0].HasField("request_body") and m.DESTINATION in set_headers(
        out[0].request_body.response
    )


def test_a_request_without_body_is_routed_at_its_headers() -> None:
    picker, _, _ = make_picker()
    out = Flow(picker, picker.config).handle(headers_msg({":method": "GET"}, end_of_stream=True))
    assert m.DESTINATION in set_headers(out[0].request_headers.response)


def test_refusal_is_an_immediate_response_in_openais_shape() -> None:
    picker, pool, _ = make_picker()
    for u in pool.all():
        u.health.healthy = False
    out = Flow(picker, picker.config).handle(headers_msg({":method": "GET"}, end_of_stream=True))
    reply = out[0].immediate_response
    assert reply.status.code == 503
    assert json.loads(reply.body)["error"]["code"] == "no_healthy_upstream"
    headers = {o.header.key: o.header.raw_value.decode() for o in reply.headers.set_headers}
    assert headers["retry-after"] == "1" and headers["content-type"] == "application/json"


def test_subset_hint_from_metadata_and_observability_mode() -> None:
    picker, _, _ = make_picker()
    md = core.Metadata()
    md.filter_metadata[m.SUBSET_NAMESPACE].fields[
        m.SUBSET
    ].list_value.values.add().string_value = "10.0.0.3:8000"
    flow = Flow(picker, picker.config)
    out = flow.handle(headers_msg({}, end_of_stream=True, metadata_context=md))
    assert set_headers(out[0].request_headers.response)[m.DESTINATION] == "10.0.0.3:8000"
    quiet = Flow(picker, picker.config)
    assert quiet.handle(headers_msg({}, end_of_stream=True, observability_mode=True)) == []


@pytest.mark.parametrize("spec", ["batch", "=1", "batch=x"])
def test_bad_objective_spec_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="NAME=PRIORITY"):
        EppConfig(objectives=(spec,))
