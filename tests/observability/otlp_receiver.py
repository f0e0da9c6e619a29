"""Real OTLP trace receivers on 127.0.0.1 (HTTP/protobuf, and gRPC): decode the protobuf exports
processes send.

What a collector (Jaeger, Tempo, the OpenTelemetry Collector) would receive; the tests read the
spans back as plain dicts.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

KINDS = {
    SpanProto.SPAN_KIND_INTERNAL: "internal",
    SpanProto.SPAN_KIND_SERVER: "server",
    SpanProto.SPAN_KIND_CLIENT: "client",
}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: dict[str, int]  # name -> time
    status_error: bool
    resource: dict[str, Any]


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _decode(body: bytes) -> list[ReceivedSpan]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=s.name,
                        kind=KINDS.get(s.kind, str(s.kind)),
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        events={e.name: e.time_unix_nano for e in s.events},
                        status_error=s.status.code == s.status.STATUS_CODE_ERROR,
                        resource=resource,
                    )
                )
    return out


class OtlpReceiver:
    """`with OtlpReceiver() as r:` ... `r.url` is the endpoint; `r.wait_for(...)` the spans.

    Exports are decoded when the spans are read, not as they arrive: a benchmark on a box of few
    cores then measures what tracing costs the processes that trace, not this collector.
    """

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._pending: list[bytes] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces"
                if ok:
                    receiver.add(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in arrival order."""
        with self._lock:
            pending, self._pending = self._pending, []
            for body in pending:
                self._spans.extend(_decode(body))
            return list(self._spans)

    def add(self, body: bytes) -> None:
        with self._lock:
            self._pending.append(body)
            self.requests += 1

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    def wait_until(
        self, match: Callable[[ReceivedSpan], bool], timeout_s: float = 20.0
    ) -> ReceivedSpan:
        """The first span that `match`es, once it has arrived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((s for s in self.spans if match(s)), None)
            if found is not None:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no matching span in {timeout_s}s")

    def wait_for(self, trace_id: str, count: int, timeout_s: float = 20.0) -> list[ReceivedSpan]:
        """The trace's spans once at least `count` have arrived (fails the test otherwise)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if len(spans) >= count:
                return spans
            time.sleep(0.05)
        spans = self.trace(trace_id)
        names = [(s.service, s.name) for s in spans]
        raise AssertionError(f"trace {trace_id}: {len(spans)} spans of {count}: {names}")


class OtlpGrpcReceiver(OtlpReceiver):
    """The same, as an OTLP/gRPC TraceService (a collector's port 4317)."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as service

        super().__init__()  # its HTTP server is never started
        receiver = self

        class Servicer(service.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> ExportTraceServiceResponse:
                receiver.add(request.SerializeToString())
                return ExportTraceServiceResponse()

        self._grpc = grpc.server(ThreadPoolExecutor(2))
        service.add_TraceServiceServicer_to_server(Servicer(), self._grpc)
        port = self._grpc.add_insecure_port("127.0.0.1:0")
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> OtlpGrpcReceiver:
        self._grpc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._grpc.stop(grace=None)
        self._server.server_close()
