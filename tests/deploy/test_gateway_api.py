"""The gateway-api component (deploy/k8s/components/gateway-api, in the cpu-gateway-api
overlay): an InferencePool of the server pods whose Endpoint Picker is `surge gateway
--ext-proc-port`, its InferenceObjectives and an HTTPRoute, each validated against the vendored
CRDs (deploy/k8s/schemas/SOURCES.md), and what they must agree on."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.deploy.cli_args import check_surge_argv
from tests.deploy.k8s import by_kind, container, named, render, validate

OVERLAY = "cpu-gateway-api"


def docs() -> tuple[dict[str, Any], ...]:
    return render(OVERLAY)


def test_pool_selects_the_servers_and_names_the_picker() -> None:
    (pool,) = by_kind(docs(), "InferencePool")
    server = named(docs(), "Deployment", "surge-server")
    labels = server["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["containerPort"] for p in container(server)["ports"]}
    assert {p["number"] for p in pool["spec"]["targetPorts"]} <= ports
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["failureMode"] == "FailOpen"  # the replicas protect themselves (see the file)
    svc = named(docs(), "Service", ref["name"])
    (grpc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert grpc_port["appProtocol"] == "kubernetes.io/h2c"  # gRPC without TLS
    epp = named(docs(), "Deployment", "surge-epp")
    assert svc["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
    c = container(epp)
    target = next(p for p in c["ports"] if p["name"] == grpc_port["targetPort"])
    config = check_surge_argv(c["args"])  # the CLI accepts the picker's command line
    assert config.epp.port == target["containerPort"] == ref["port"]["number"]
    assert config.host == "0.0.0.0" and config.epp.fallbacks == 0  # one address per request
    assert list(config.discover) == ["dns://surge-replicas:8000"]


def test_picker_probes_ask_its_grpc_health_services() -> None:
    from surge.gateway.epp.server import Health

    c = container(named(docs(), "Deployment", "surge-epp"))
    config = check_surge_argv(c["args"])
    health = Health(ready=lambda: True)
    for probe in ("livenessProbe", "readinessProbe"):
        grpc = c[probe]["grpc"]
        assert grpc["port"] == config.epp.port
        assert health.status(grpc["service"]) is not None  # a service the picker serves


def test_objectives_match_the_pickers_priorities() -> None:
    objectives = {o["metadata"]["name"]: o["spec"]["priority"]
                  for o in by_kind(docs(), "InferenceObjective")}  # fmt: skip
    assert any(p < 0 for p in objectives.values())  # a sheddable class
    for o in by_kind(docs(), "InferenceObjective"):
        assert (
            o["spec"]["poolRef"]["name"] == by_kind(docs(), "InferencePool")[0]["metadata"]["name"]
        )
    config = check_surge_argv(container(named(docs(), "Deployment", "surge-epp"))["args"])
    assert config.epp.priorities == objectives


def test_route_sends_the_api_to_the_pool() -> None:
    (route,) = by_kind(docs(), "HTTPRoute")
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"]) == ("inference.networking.k8s.io", "InferencePool")
    assert backend["name"] == by_kind(docs(), "InferencePool")[0]["metadata"]["name"]
    assert rule["matches"][0]["path"]["value"] == "/v1"


WRONG = [
    ("InferencePool", lambda d: d["spec"].__setitem__("targetPort", [{"number": 8000}])),
    ("InferencePool", lambda d: d["spec"]["endpointPickerRef"].__setitem__("failureMode", "Open")),
    ("InferencePool", lambda d: d["spec"]["targetPorts"][0].__setitem__("number", 0)),
    ("InferenceObjective", lambda d: d["spec"].__setitem__("priority", "high")),
    ("InferenceObjective", lambda d: d["spec"].pop("poolRef")),
    ("HTTPRoute", lambda d: d["spec"]["rules"][0].__setitem__("backendRef", [])),
    ("HTTPRoute", lambda d: d["spec"]["rules"][0]["matches"][0]["path"].update(type="Glob")),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "spoil"), WRONG, ids=[k for k, _ in WRONG])
def test_a_wrong_field_fails_validation(kind: str, spoil: Any) -> None:
    doc = copy.deepcopy(by_kind(docs(), kind)[0])
    validate(doc)
    spoil(doc)
    with pytest.raises(Exception):  # noqa: B017 (jsonschema's error)
        validate(doc)
