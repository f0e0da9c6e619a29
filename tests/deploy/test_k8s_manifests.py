"""Every kustomize overlay under deploy/k8s, rendered by a real kustomize and checked offline:
each object against its schema (a wrong field fails), then what the objects must agree on
(probes on the endpoints the processes serve, grace period above the drain, one autoscaler per
Deployment, container args the CLI accepts, the metrics the autoscalers query exist).
No cluster is reachable here: nothing is applied."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from surge.gateway.metrics import GatewayMetrics
from surge.http.discovery import DnsTarget
from surge.observability.metrics import ServerMetrics
from tests.deploy.cli_args import check_surge_argv
from tests.deploy.k8s import OVERLAYS, by_kind, container, named, render, validate

KEDA_OVERLAYS = ("cpu-keda", "cpu-keda-external", "gpu")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid(overlay: str) -> None:
    docs = render(overlay)
    assert docs
    for doc in docs:
        validate(doc)


# (kind, where to put a misspelt field): each must fail validation.
WRONG = [
    ("Deployment", lambda d: container(d).__setitem__("livenesProbe", {})),
    ("Deployment", lambda d: container(d)["readinessProbe"]["httpGet"].__setitem__("port", [1])),
    ("Service", lambda d: d["spec"]["ports"][0].__setitem__("targetPrt", 1)),
    ("PodDisruptionBudget", lambda d: d["spec"].__setitem__("maxUnavaliable", 1)),
    ("HorizontalPodAutoscaler", lambda d: d["spec"]["metrics"][0]["pods"]["target"]
     .__setitem__("averageVal", "1")),
    ("ScaledObject", lambda d: d["spec"]["triggers"][0].__setitem__("treshold", "1")),
    ("ScaledObject", lambda d: d["spec"].__setitem__("minReplicaCount", "zero")),
    ("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].__setitem__("prot", "http")),
    ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].__setitem__("intervall", "5s")),
    ("VerticalPodAutoscaler", lambda d: d["spec"]["updatePolicy"].__setitem__("updateMod", "Off")),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "spoil"), WRONG, ids=[k for k, _ in WRONG])
def test_a_wrong_field_fails_validation(kind: str, spoil: Any) -> None:
    docs = render("cpu") + render("cpu-keda")
    doc = copy.deepcopy(by_kind(docs, kind)[0])
    validate(doc)
    spoil(doc)
    with pytest.raises(Exception):  # noqa: B017 (jsonschema's or kubernetes-validate's error)
        validate(doc)


def _scale_targets(docs: tuple[dict[str, Any], ...]) -> list[str]:
    hpas = [d["spec"]["scaleTargetRef"]["name"] for d in by_kind(docs, "HorizontalPodAutoscaler")]
    keda = [d["spec"]["scaleTargetRef"]["name"] for d in by_kind(docs, "ScaledObject")]
    return hpas + keda


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_autoscaler_per_deployment(overlay: str) -> None:
    targets = _scale_targets(render(overlay))
    assert targets == ["surge-server"]  # KEDA's own HPA and ours must never share a target
    scaled = by_kind(render(overlay), "ScaledObject")
    if overlay in KEDA_OVERLAYS:
        assert scaled and scaled[0]["spec"]["minReplicaCount"] == 0  # scale to zero
        gateway = check_surge_argv(container(named(render(overlay), "Deployment",
                                                   "surge-gateway"))["args"])  # fmt: skip
        assert gateway.activation_timeout_s > 0  # ... the gateway holds requests meanwhile
    else:
        assert not scaled


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _port(c: dict[str, Any], name: str) -> int:
    return next(int(p["containerPort"]) for p in c["ports"] if p["name"] == name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_probes_and_shutdown(overlay: str) -> None:
    server = named(render(overlay), "Deployment", "surge-server")
    c = container(server)
    engine, config = check_surge_argv(c["args"])
    assert _port(c, "http") == config.port and config.host == "0.0.0.0"
    assert c["startupProbe"]["httpGet"]["path"] == "/health/startup"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] == "http"
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and int(pre_stop[1]) >= 5  # endpoints update first
    grace = server["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > int(pre_stop[1]) + config.limits.drain_timeout_s
    anti = server["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    if overlay == "gpu":
        assert engine.model.device == "cuda" and c["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_discovers_the_headless_service(overlay: str) -> None:
    docs = render(overlay)
    gateway = named(docs, "Deployment", "surge-gateway")
    c = container(gateway)
    config = check_surge_argv(c["args"])
    assert _port(c, "http") == config.port and config.host == "0.0.0.0"
    (target,) = [DnsTarget.parse(t) for t in config.discover]
    replicas = named(docs, "Service", "surge-replicas")
    assert replicas["spec"]["clusterIP"] == "None"  # one DNS record per ready pod
    assert target.host == "surge-replicas"
    assert target.port == replicas["spec"]["ports"][0]["port"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > pre_stop + config.drain_timeout_s


def _metric_names() -> set[str]:
    """Every sample name a real server and a real gateway registry expose."""
    server = ServerMetrics("m", max_model_len=128)
    server.observe_received()
    gateway = GatewayMetrics()
    text = server.render()[0].decode() + gateway.render()[0].decode()
    return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and ln[0] != "#"}


def test_keda_queries_name_metrics_that_exist() -> None:
    queries = [t["metadata"]["query"] for t in by_kind(render("cpu-keda"), "ScaledObject")[0]
               ["spec"]["triggers"]]  # fmt: skip
    joined = " ".join(queries)
    assert "sum(vllm:num_requests_waiting{" in joined
    assert re.search(r"rate\(surge:requests_received_total\{[^}]*\}\[1m\]\)", joined)
    names = _metric_names()
    for q in queries:
        for metric in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", q):
            assert metric in names, metric


def test_prometheus_adapter_serves_the_hpa_metrics() -> None:
    docs = render("cpu")
    rules = yaml.safe_load(named(docs, "ConfigMap", "adapter-config")["data"]["config.yaml"])
    served = {r["name"]["as"] for r in rules["rules"]}
    hpa = named(docs, "HorizontalPodAutoscaler", "surge-server")
    asked = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert asked == served
    names = _metric_names()
    for rule in rules["rules"]:
        series = rule["seriesQuery"].split("{")[0].strip("'")
        assert series in names and re.fullmatch(rule["name"]["matches"], series)


def test_vpa_only_recommends() -> None:
    (vpa,) = by_kind(render("cpu"), "VerticalPodAutoscaler")
    assert vpa["spec"]["updatePolicy"]["updateMode"] == "Off"
    assert vpa["spec"]["targetRef"]["name"] == "surge-server"


def test_pod_disruption_budgets_and_monitors_select_real_pods() -> None:
    docs = render("cpu")
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
            for d in by_kind(docs, "Deployment")}  # fmt: skip
    for kind in ("PodDisruptionBudget", "PodMonitor", "ServiceMonitor"):
        for obj in by_kind(docs, kind):
            want = obj["spec"]["selector"]["matchLabels"].items()
            if kind == "ServiceMonitor":  # selects the Service, whose selector picks pods
                svc = named(docs, "Service", "surge")
                assert want <= svc["metadata"]["labels"].items()
                want = svc["spec"]["selector"].items()
            assert any(want <= labels.items() for labels in pods.values()), obj["metadata"]


def test_external_scaler_autoscaler_args() -> None:
    docs = render("cpu-keda-external")
    (so,) = by_kind(docs, "ScaledObject")
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "external"
    host, port = trigger["metadata"]["scalerAddress"].rsplit(":", 1)
    assert host.split(".")[0] == "surge-autoscaler"
    svc = named(docs, "Service", "surge-autoscaler")
    assert int(port) == svc["spec"]["ports"][0]["port"]
    args = container(named(docs, "Deployment", "surge-autoscaler"))["args"]
    assert _arg(args, "--keda-external-scaler-port") == port
    # Its gRPC and metrics servers listen on --host: a pod's must be reachable from KEDA.
    assert _arg(args, "--host") == "0.0.0.0"
    assert _arg(args, "--discover").startswith("dns://surge-replicas:")
    check_surge_argv(args)
