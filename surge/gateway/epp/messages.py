"""GIE's endpoint-picker protocol in ext_proc messages: the names it fixes, what a request
brings (headers, the subset hint, the endpoint that served) and the answers the picker sends
(the destination in a header and in `envoy.lb` metadata, an immediate 429/503)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from google.protobuf import struct_pb2

from surge.gateway.epp.proto import base_pb2 as core
from surge.gateway.epp.proto import external_processor_pb2 as pb
from surge.gateway.errors import GatewayError

# docs/proposals/004-endpoint-picker-protocol of kubernetes-sigs/gateway-api-inference-extension
DESTINATION = "x-gateway-destination-endpoint"
NAMESPACE = "envoy.lb"  # where the destination goes in the response's dynamic metadata
SERVED = "x-gateway-destination-endpoint-served"  # in `envoy.lb`, on the response path
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET = "x-gateway-destination-endpoint-subset"
OBJECTIVE = "x-gateway-inference-objective"  # an InferenceObjective's name: its priority
FAIRNESS = "x-gateway-inference-fairness-id"  # who the request is for (Surge's tenant)
# Envoy attributes the filter may be asked to send with the response headers
# (response_attributes): the address that served, and why the response is what it is
# ("via_upstream" when the endpoint answered, else the data plane's own reply).
UPSTREAM_ADDRESS = "upstream.address"
CODE_DETAILS = "response.code_details"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"

_OVERWRITE = core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_dict(headers: core.HeaderMap) -> dict[str, str]:
    """Lower-cased names to values (raw_value, where Envoy puts them; else value)."""
    out: dict[str, str] = {}
    for h in headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out[h.key.lower()] = value
    return out


def subset_hint(metadata: core.Metadata) -> frozenset[str] | None:
    """The endpoints the data plane allows (`envoy.lb.subset_hint`), or None when it says
    nothing. An empty set is a hint too: nothing may be picked."""
    ns = metadata.filter_metadata.get(SUBSET_NAMESPACE)
    if ns is None or SUBSET not in ns.fields:
        return None
    value = ns.fields[SUBSET]
    if value.HasField("list_value"):
        items = [v.string_value for v in value.list_value.values if v.HasField("string_value")]
    else:  # a comma-separated string, as some data planes send it
        items = value.string_value.split(",")
    return frozenset(i.strip() for i in items if i.strip())


def served_endpoint(msg: pb.ProcessingRequest) -> str | None:
    """The endpoint that answered: GIE's served key in `envoy.lb`, else Envoy's
    upstream.address attribute, else None (then it is the one picked)."""
    ns = msg.metadata_context.filter_metadata.get(NAMESPACE)
    if ns is not None and SERVED in ns.fields and ns.fields[SERVED].string_value:
        return ns.fields[SERVED].string_value
    value = _attribute(msg, UPSTREAM_ADDRESS)
    return value or None


def via_upstream(msg: pb.ProcessingRequest) -> bool:
    """False when the data plane says the response is its own (it could not reach the
    endpoint); True when it says the endpoint answered, or says nothing."""
    details = _attribute(msg, CODE_DETAILS)
    return not details or details == "via_upstream"


def _attribute(msg: pb.ProcessingRequest, name: str) -> str:
    for attrs in msg.attributes.values():  # keyed by the filter's name
        if name in attrs.fields:
            return attrs.fields[name].string_value
    return ""


def header_options(headers: Mapping[str, str]) -> list[core.HeaderValueOption]:
    """Set (overwriting whatever the client sent) each header."""
    options = []
    for k, v in headers.items():
        value = core.HeaderValue(key=k, raw_value=v.encode())
        options.append(core.HeaderValueOption(header=value, append_action=_OVERWRITE))
    return options


def destination_metadata(endpoints: str) -> struct_pb2.Struct:
    """`{"envoy.lb": {"x-gateway-destination-endpoint": endpoints}}`, the header's value."""
    md = struct_pb2.Struct()
    md.fields[NAMESPACE].struct_value.fields[DESTINATION].string_value = endpoints
    return md


def routed(
    headers: Mapping[str, str], remove: Iterable[str] = (), body: bytes | None = None
) -> pb.CommonResponse:
    """Go on with these headers set (the route recomputed, so the cluster sees them) and,
    when given, this body instead of the client's."""
    common = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(
            set_headers=header_options(headers), remove_headers=list(remove)
        ),
        clear_route_cache=True,
    )
    if body is not None:
        common.body_mutation.body = body
    return common


def immediate(error: GatewayError) -> pb.ProcessingResponse:
    """The data plane answers the client itself: status, OpenAI error body, Retry-After."""
    headers = {"content-type": "application/json"}
    headers.update((k.lower(), v) for k, v in error.headers.items())
    reply = pb.ImmediateResponse(
        headers=pb.HeaderMutation(set_headers=header_options(headers)),
        body=json.dumps(error.body()).encode(),
        details=f"surge_epp_{error.code}",
    )
    reply.status.code = error.status_code  # type: ignore[assignment]  # an enum of the codes
    return pb.ProcessingResponse(immediate_response=reply)


def streamed_body(body: bytes, end_of_stream: bool) -> pb.BodyResponse:
    """A body chunk passed on, in FULL_DUPLEX_STREAMED mode (the picker sends the body)."""
    common = pb.CommonResponse()
    common.body_mutation.streamed_response.body = body
    common.body_mutation.streamed_response.end_of_stream = end_of_stream
    return pb.BodyResponse(response=common)
