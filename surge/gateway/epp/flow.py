"""One HTTP request's ext_proc stream: what to answer to each message the data plane sends.

NOTE: when the picker decides, by the request body mode (ProtocolConfiguration, first message)

    no body (headers end the stream), NONE  -> at the headers: a HeadersResponse that routes
    STREAMED                                -> at the headers too (the route is taken before
                                               any body), unless the data plane sends the body
                                               without waiting: then as FULL_DUPLEX below
    BUFFERED, BUFFERED_PARTIAL, not said    -> headers: go on; the whole body: a BodyResponse
                                               whose header mutation routes (BUFFERED applies it)
    FULL_DUPLEX_STREAMED (GIE's)            -> nothing until the body ends (or its trailers
                                               come); then the HeadersResponse that routes and
                                               the body, sent back by the picker

Routing = `x-gateway-destination-endpoint` set (the client's own overwritten) and the same value
in the `envoy.lb` dynamic metadata. A refusal is an ImmediateResponse (429 shed, 503 none ready).
On the way back the response headers report the status to the breakers and name the endpoint
that served (x-surge-upstream, host:port, as the HTTP gateway does); the response body is
passed on (sent back in FULL_DUPLEX_STREAMED); the stream's end releases the in-flight count.
"""

from __future__ import annotations

import json
import time
from typing import Any

from surge.gateway.config import GatewayConfig, Policy
from surge.gateway.degrade import DEGRADED_HEADER, cap_max_tokens
from surge.gateway.epp import messages as m
from surge.gateway.epp.picker import Pick, Picker, PickRequest, Refusal, endpoint_of
from surge.gateway.epp.proto import external_processor_pb2 as pb
from surge.gateway.epp.proto import processing_mode_pb2 as mode_pb
from surge.gateway.hop_headers import UPSTREAM_HEADER
from surge.gateway.prefix_affinity import route_key
from surge.gateway.retry import parse_retry_after
from surge.http.unicode_check import body_has_lone_surrogate

Mode = mode_pb.ProcessingMode
PRIORITY_HEADER = "x-surge-priority"  # Surge's: lower runs sooner (GIE's: higher matters more)
TENANT_HEADER = "x-surge-tenant"


class Flow:
    def __init__(self, picker: Picker, config: GatewayConfig, on_decision: Any = None) -> None:
        self.picker = picker
        self.config = config
        self.on_decision = on_decision  # (seconds, result label) for the metrics, or None
        self.request_mode: int | None = None  # BodySendMode; None: the data plane did not say
        self.response_mode: int | None = None
        self.defer_headers = False  # the headers' answer waits for the body
        self.headers: dict[str, str] = {}
        self.subset: frozenset[str] | None = None
        self.body = bytearray()
        self.chunks = 0  # STREAMED body chunks answered late (send_body_without_waiting)
        self.decided = False
        self.pick: Pick | None = None

    def handle(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if msg.HasField("protocol_config"):
            cfg = msg.protocol_config
            self.request_mode, self.response_mode = cfg.request_body_mode, cfg.response_body_mode
            self.defer_headers = cfg.request_body_mode == Mode.FULL_DUPLEX_STREAMED or (
                cfg.request_body_mode == Mode.STREAMED
                and cfg.send_body_without_waiting_for_header_response
            )
        kind = msg.WhichOneof("request")
        if kind is None:
            return []
        out: list[pb.ProcessingResponse] = getattr(self, "_" + kind)(getattr(msg, kind), msg)
        return [] if msg.observability_mode else out

    def close(self) -> None:
        """The stream ended (the request is over, or the data plane gave up on it)."""
        if self.pick is not None:
            self.picker.release(self.pick)

    # --- the request ---

    def _request_headers(self, h: pb.HttpHeaders, msg: pb.ProcessingRequest) -> list[Any]:
        self.headers = m.header_dict(h.headers)
        self.subset = m.subset_hint(msg.metadata_context)
        no_body = h.end_of_stream or self.request_mode == Mode.NONE
        if no_body or (self.request_mode == Mode.STREAMED and not self.defer_headers):
            return self._decide(None, phase="headers")
        if self.defer_headers:
            return []
        return [pb.ProcessingResponse(request_headers=pb.HeadersResponse())]

    def _request_body(self, b: pb.HttpBody, msg: pb.ProcessingRequest) -> list[Any]:
        if self.decided:  # STREAMED, routed at the headers: pass each chunk on
            return [pb.ProcessingResponse(request_body=pb.BodyResponse())]
        self.body += b.body
        self.chunks += 1
        if not b.end_of_stream and self.defer_headers:
            return []
        if self.request_mode == Mode.FULL_DUPLEX_STREAMED or self.defer_headers:
            return self._decide(bytes(self.body), phase="duplex", end_of_stream=b.end_of_stream)
        return self._decide(bytes(self.body), phase="body")

    def _request_trailers(self, t: pb.HttpTrailers, msg: pb.ProcessingRequest) -> list[Any]:
        out = []
        if not self.decided:  # the body ended without end_of_stream: trailers close it
            out = self._decide(bytes(self.body), phase="duplex", end_of_stream=False)
            if out and out[0].HasField("immediate_response"):
                return out
        return [*out, pb.ProcessingResponse(request_trailers=pb.TrailersResponse())]

    def _decide(self, body: bytes | None, phase: str, end_of_stream: bool = True) -> list[Any]:
        self.decided = True
        started = time.perf_counter()
        parsed = _json_object(body) if body else None
        prefix = self.config.prefix if self.config.policy is Policy.PREFIX else None
        kv = self.config.kv if self.config.policy is Policy.KV_AWARE else None
        key = route_key(parsed, self.headers.get(self.config.session_header), prefix, kv)
        model = (parsed or {}).get("model")
        priority = self.picker.priority_of(self.headers.get(m.OBJECTIVE))
        request = PickRequest(key, model if isinstance(model, str) else None, priority, self.subset)
        result = self.picker.pick(request)
        if self.on_decision is not None:
            label = "routed" if isinstance(result, Pick) else result.reason
            self.on_decision(time.perf_counter() - started, label)
        if isinstance(result, Refusal):
            return [m.immediate(result.error)]
        self.pick = result
        forwarded = body
        if result.cap_max_tokens is not None and parsed is not None and body is not None:
            forwarded = json.dumps(cap_max_tokens(parsed, result.cap_max_tokens)).encode()
        headers = {m.DESTINATION: result.endpoints}
        if m.OBJECTIVE in self.headers:
            headers[PRIORITY_HEADER] = str(-priority)
        if (tenant := self.headers.get(m.FAIRNESS)) and TENANT_HEADER not in self.headers:
            headers[TENANT_HEADER] = tenant
        replaced = forwarded is not body and forwarded is not None
        if replaced and phase != "headers":
            headers["content-length"] = str(len(forwarded or b""))
        metadata = m.destination_metadata(result.endpoints)
        if phase == "body":  # BUFFERED: the body's answer carries the headers' mutation
            common = m.routed(headers, body=forwarded if replaced else None)
            return [
                pb.ProcessingResponse(
                    request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata
                )
            ]
        first = pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=m.routed(headers)),
            dynamic_metadata=metadata,
        )
        if phase == "headers":
            return [first]
        if self.request_mode == Mode.FULL_DUPLEX_STREAMED:
            body_out = m.streamed_body(forwarded or b"", end_of_stream)
            return [first, pb.ProcessingResponse(request_body=body_out)]
        # STREAMED, body sent without waiting: answer each chunk, in order, after the headers
        return [first] + [pb.ProcessingResponse(request_body=pb.BodyResponse())] * self.chunks

    # --- the response ---

    def _response_headers(self, h: pb.HttpHeaders, msg: pb.ProcessingRequest) -> list[Any]:
        headers = m.header_dict(h.headers)
        pick = self.pick
        common = pb.CommonResponse()
        if pick is not None:
            served = m.served_endpoint(msg)
            status = int(headers.get(":status", "0") or 0)
            if status:
                retry_after = parse_retry_after(headers.get("retry-after"))
                self.picker.report(pick, status, served, m.via_upstream(msg), retry_after)
            told = {UPSTREAM_HEADER: served or endpoint_of(pick.primary.url)}  # as the gateway's
            if pick.degraded:
                told[DEGRADED_HEADER] = pick.degraded
            common.header_mutation.set_headers.extend(m.header_options(told))
        return [pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=common))]

    def _response_body(self, b: pb.HttpBody, msg: pb.ProcessingRequest) -> list[Any]:
        if self.response_mode == Mode.FULL_DUPLEX_STREAMED:
            return [pb.ProcessingResponse(response_body=m.streamed_body(b.body, b.end_of_stream))]
        return [pb.ProcessingResponse(response_body=pb.BodyResponse())]

    def _response_trailers(self, t: pb.HttpTrailers, msg: pb.ProcessingRequest) -> list[Any]:
        return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]


def _json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None (the model server will say what is wrong)."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if body_has_lone_surrogate(body, parsed):
        return None
    return parsed if isinstance(parsed, dict) else None
