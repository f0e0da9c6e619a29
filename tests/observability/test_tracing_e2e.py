"""Traces across real processes: a client's `traceparent` through `surge gateway` (and its
retries) into `surge serve` (generation and embeddings), every span exported over OTLP/HTTP to a
real receiver and joined into one trace."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.gateway.processes import GatewayProcess
from tests.observability.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.servers import ServerProcess, free_port

EMBED = "test-embed"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def stack(
    receiver: OtlpReceiver, tiny_model_dir: Path, minilm_path: Path
) -> Iterator[dict[str, GatewayProcess | ServerProcess]]:
    procs: dict[str, GatewayProcess | ServerProcess] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # spans leave within 0.1 s, not 5 s
        mp.delenv("OTEL_SERVICE_NAME", raising=False)
        try:
            server = procs["server"] = ServerProcess(
                tiny_model_dir, "--dtype", "float32", "--otlp-traces-endpoint", receiver.url,
                "--embedding-model", str(minilm_path), "--embedding-model-name", EMBED,
            )  # fmt: skip
            trace = ("--otlp-traces-endpoint", receiver.url, "--health-interval", "0")
            procs["gateway"] = GatewayProcess("--upstream", server.url, *trace)
            # A dead upstream first in round-robin order: some requests are retried.
            dead = f"http://127.0.0.1:{free_port()}"
            procs["retrying"] = GatewayProcess(
                "--upstream", dead, "--upstream", server.url, "--policy", "round_robin",
                "--outlier-failures", "100", "--retry-backoff-base", "0.01", *trace,
            )  # fmt: skip
            for name in ("gateway", "retrying"):
                gw = procs[name]
                assert isinstance(gw, GatewayProcess)
                gw.wait_ready()
            yield procs
        finally:
            for p in procs.values():
                p.stop()


def _client(proc: GatewayProcess | ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0)


def _traceparent() -> tuple[str, str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{parent}-01", trace_id, parent


def _one(spans: list[ReceivedSpan], service: str, kind: str) -> ReceivedSpan:
    found = [s for s in spans if s.service == service and s.kind == kind]
    assert len(found) == 1, [(s.service, s.kind, s.name) for s in spans]
    return found[0]


def test_a_chat_request_is_one_trace_from_client_to_engine(
    stack: dict[str, GatewayProcess | ServerProcess], receiver: OtlpReceiver
) -> None:
    header, trace_id, client_span = _traceparent()
    resp = _client(stack["gateway"]).chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=8, temperature=0.0, extra_headers={"traceparent": header},
    )  # fmt: skip
    spans = receiver.wait_for(trace_id, 3)
    gateway = _one(spans, "surge-gateway", "server")
    attempt = _one(spans, "surge-gateway", "client")
    server = _one(spans, "surge-server", "server")
    # The chain: the client's span -> gateway -> its attempt -> the server.
    assert gateway.parent_span_id == client_span
    assert attempt.parent_span_id == gateway.span_id
    assert server.parent_span_id == attempt.span_id
    assert gateway.name == "POST /v1/chat/completions"
    assert gateway.attributes["http.response.status_code"] == 200
    assert attempt.attributes["surge.outcome"] == "success"
    assert attempt.attributes["surge.upstream"] == stack["server"].url
    assert attempt.attributes["surge.retry"] is False
    assert server.name == "chat test-model"
    assert server.resource["service.instance.id"] == f"127.0.0.1:{stack['server'].port}"
    a = server.attributes
    assert resp.usage is not None
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.usage.input_tokens"] == resp.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == resp.usage.completion_tokens
    assert a["gen_ai.response.finish_reasons"] == [resp.choices[0].finish_reason]
    assert a["gen_ai.request.max_tokens"] == 8
    assert 0 < a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]
    assert not server.status_error and not gateway.status_error
    # The server's events fall inside its span, and its span inside the gateway's attempt.
    assert server.start_ns <= server.events["queued"] <= server.events["first_token"]
    assert server.events["first_token"] <= server.end_ns
    slack_ns = 5_000_000  # the two processes stamp from the same clock, converted separately
    assert attempt.start_ns - slack_ns <= server.start_ns
    assert server.end_ns <= attempt.end_ns + slack_ns <= gateway.end_ns + slack_ns


def test_a_streamed_request_s_gateway_span_lasts_until_the_stream_ends(
    stack: dict[str, GatewayProcess | ServerProcess], receiver: OtlpReceiver
) -> None:
    header, trace_id, _ = _traceparent()
    stream = _client(stack["gateway"]).completions.create(
        model="test-model", prompt="Once upon a time", max_tokens=12, temperature=0.0,
        stream=True, stream_options={"include_usage": True},
        extra_headers={"traceparent": header}, extra_body={"guided_regex": "[a-z ]{12,40}"},
    )  # fmt: skip
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
    assert usage is not None
    spans = receiver.wait_for(trace_id, 3)
    gateway = _one(spans, "surge-gateway", "server")
    server = _one(spans, "surge-server", "server")
    assert gateway.name == "POST /v1/completions"
    assert server.name == "text_completion test-model"
    assert server.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert server.attributes["gen_ai.latency.time_per_output_token"] > 0
    assert server.attributes["surge.structured_output"] == "regex"
    # The server records its span before it sends [DONE]; the gateway ends its own after.
    assert gateway.end_ns >= server.end_ns
    assert gateway.end_ns - gateway.start_ns >= server.end_ns - server.start_ns


def test_each_retry_is_a_span_of_its_own(
    stack: dict[str, GatewayProcess | ServerProcess], receiver: OtlpReceiver
) -> None:
    client = _client(stack["retrying"])
    for _ in range(4):  # round robin puts the dead upstream first for every other request
        header, trace_id, _ = _traceparent()
        client.completions.create(model="test-model", prompt="Hi", max_tokens=2,
                                  extra_headers={"traceparent": header})  # fmt: skip
        spans = receiver.wait_for(trace_id, 3)
        attempts = sorted((s for s in spans if s.kind == "client"), key=lambda s: s.start_ns)
        if len(attempts) == 2:
            break
    else:
        pytest.fail("no request went to the dead upstream first")
    spans = receiver.wait_for(trace_id, 4)
    failed, retried = attempts
    gateway = _one(spans, "surge-gateway", "server")
    server = _one(spans, "surge-server", "server")
    assert failed.parent_span_id == retried.parent_span_id == gateway.span_id
    assert failed.status_error and failed.attributes["error.type"] == "connect"
    assert failed.attributes["surge.outcome"] == "failure"
    assert retried.attributes["surge.retry"] is True
    assert retried.attributes["surge.outcome"] == "success"
    assert server.parent_span_id == retried.span_id
    assert gateway.attributes["http.response.status_code"] == 200 and not gateway.status_error


def test_a_request_without_traceparent_starts_a_trace_at_the_gateway(
    stack: dict[str, GatewayProcess | ServerProcess], receiver: OtlpReceiver
) -> None:
    rid = "untraced-" + secrets.token_hex(4)
    _client(stack["gateway"]).completions.create(
        model="test-model", prompt="Hi", max_tokens=2, extra_body={"request_id": rid}
    )

    found = receiver.wait_until(
        lambda s: str(s.attributes.get("gen_ai.request.id", "")).startswith(rid)
    )
    spans = receiver.wait_for(found.trace_id, 3)
    gateway = _one(spans, "surge-gateway", "server")
    assert gateway.parent_span_id == ""  # a root: the trace began here


def test_an_embedding_request_has_its_span(
    stack: dict[str, GatewayProcess | ServerProcess], receiver: OtlpReceiver
) -> None:
    header, trace_id, client_span = _traceparent()
    resp = _client(stack["server"]).embeddings.create(
        model=EMBED, input=["first text", "the second one"], extra_headers={"traceparent": header}
    )
    (span,) = receiver.wait_for(trace_id, 1)
    assert span.name == f"embeddings {EMBED}" and span.kind == "server"
    assert span.parent_span_id == client_span
    assert span.attributes["gen_ai.usage.input_tokens"] == resp.usage.prompt_tokens
    assert span.attributes["surge.embedding.inputs"] == 2
    assert not span.status_error
