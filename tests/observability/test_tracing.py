"""The tracing module: config, propagation, export to real OTLP receivers (HTTP and gRPC)."""

from __future__ import annotations

import time

import httpx
import pytest
from opentelemetry import trace

from surge.cli.main import main as surge_main
from surge.gateway.cli import build_parser, config_from_args
from surge.gateway.hop_headers import forward_headers
from surge.observability.tracing import (
    Tracing,
    TracingConfig,
    endpoint_from_env,
    extract,
    inject,
    wall_ns,
)
from tests.gateway.processes import GatewayProcess
from tests.observability.otlp_receiver import OtlpGrpcReceiver, OtlpReceiver


def test_endpoint_urls() -> None:
    assert TracingConfig().traces_url is None
    assert TracingConfig("http://127.0.0.1:4318").traces_url == "http://127.0.0.1:4318/v1/traces"
    assert TracingConfig("http://c:4318/").traces_url == "http://c:4318/v1/traces"
    assert TracingConfig("https://c/otlp/v1/traces").traces_url == "https://c/otlp/v1/traces"
    for bad in ("127.0.0.1:4318", "grpc://c:4317", "http://"):
        with pytest.raises(ValueError, match="http"):
            TracingConfig(bad)


def test_endpoint_defaults_to_opentelemetry_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert endpoint_from_env() is None
    args = build_parser().parse_args(["--upstream", "http://127.0.0.1:9"])
    assert config_from_args(args).otlp_traces_endpoint is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")
    assert endpoint_from_env() == "http://c:4318"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4318/v1/traces")
    assert endpoint_from_env() == "http://t:4318/v1/traces"
    assert config_from_args(args).otlp_traces_endpoint == "http://t:4318/v1/traces"
    flagged = build_parser().parse_args(
        ["--upstream", "http://127.0.0.1:9", "--otlp-traces-endpoint", "http://f:4318"]
    )
    assert config_from_args(flagged).otlp_traces_endpoint == "http://f:4318"


def test_a_bad_endpoint_is_refused_before_serving(capsys: pytest.CaptureFixture[str]) -> None:
    from surge.gateway.cli import main as gateway_main

    assert gateway_main(["--upstream", "http://127.0.0.1:9", "--otlp-traces-endpoint", "c"]) == 2
    assert "otlp endpoint must be an http(s) URL" in capsys.readouterr().err
    assert surge_main(["serve", "--otlp-traces-endpoint", "c:4318"]) == 2
    assert "otlp endpoint must be an http(s) URL" in capsys.readouterr().err


def test_off_costs_nothing_and_passes_no_headers() -> None:
    off = Tracing.off()
    assert not off.enabled
    span = off.tracer.start_span("x")
    assert not span.is_recording()
    assert inject(span) == {}
    off.shutdown()


def test_spans_reach_a_collector_and_join_across_a_hop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "renamed")
    with OtlpReceiver() as receiver:
        tracing = Tracing.start(TracingConfig(receiver.url, "surge-test", "127.0.0.1:1"))
        assert tracing.enabled
        caller = tracing.tracer.start_span("caller", start_time=wall_ns(time.monotonic() - 1))
        headers = inject(caller)
        assert set(headers) == {"traceparent"}
        callee = tracing.tracer.start_span("callee", context=extract(headers))
        callee.end()
        caller.end()
        tracing.shutdown()  # flushes what is batched
        trace_id = f"{caller.get_span_context().trace_id:032x}"
        spans = {s.name: s for s in receiver.wait_for(trace_id, 2, timeout_s=5)}
    assert spans["callee"].parent_span_id == spans["caller"].span_id
    assert spans["caller"].parent_span_id == ""
    assert spans["caller"].service == "renamed"  # OTEL_SERVICE_NAME wins, as in OTel's SDKs
    assert spans["caller"].resource["service.instance.id"] == "127.0.0.1:1"
    # Started a second ago by the monotonic clock: so by the wall clock too.
    took_s = (spans["caller"].end_ns - spans["caller"].start_ns) / 1e9
    assert 0.95 < took_s < 1.5


def test_spans_reach_a_grpc_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTLP over gRPC (a collector's port 4317): through the library, and from `surge gateway
    --otlp-traces-protocol grpc`, which traces each request."""
    with OtlpGrpcReceiver() as receiver:
        config = TracingConfig(receiver.url, "surge-test", otlp_protocol="grpc")
        assert config.traces_url == receiver.url  # no /v1/traces: gRPC names the service
        tracing = Tracing.start(config)
        span = tracing.tracer.start_span("over-grpc")
        span.end()
        tracing.shutdown()
        trace_id = f"{span.get_span_context().trace_id:032x}"
        assert [s.name for s in receiver.wait_for(trace_id, 1, timeout_s=5)] == ["over-grpc"]
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")  # the default's source
        gateway = GatewayProcess("--upstream", "http://127.0.0.1:9", "--health-interval", "0",
                                 "--otlp-traces-endpoint", receiver.url)  # fmt: skip
        try:
            gateway.wait_ready()
            r = httpx.post(gateway.url + "/v1/completions", json={"prompt": "x"}, timeout=10)
            assert r.status_code in (502, 503)
            found = receiver.wait_until(
                lambda s: s.service == "surge-gateway" and s.kind == "server", timeout_s=10
            )
        finally:
            gateway.stop()
    assert found.name == "POST /v1/completions"
    with pytest.raises(ValueError, match="protocol"):
        TracingConfig("http://c:4317", otlp_protocol="thrift")


def test_extract_without_a_header_starts_a_new_trace() -> None:
    assert not trace.get_current_span(extract({})).get_span_context().is_valid
    bad = extract({"traceparent": "00-zz-01"})
    assert not trace.get_current_span(bad).get_span_context().is_valid


def test_the_gateway_forwards_the_client_s_trace_only_when_not_tracing_itself() -> None:
    headers = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "k=v",
               "authorization": "Bearer x", "connection": "keep-alive"}  # fmt: skip
    assert forward_headers(headers) == {
        "traceparent": headers["traceparent"],
        "tracestate": "k=v",
        "authorization": "Bearer x",
    }
    assert forward_headers(headers, tracing=True) == {"authorization": "Bearer x"}
