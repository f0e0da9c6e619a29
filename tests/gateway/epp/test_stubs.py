"""The committed ext_proc / health stubs are what protoc makes from the vendored protos, and the
vendored messages keep Envoy's names (the gRPC path and the wire format depend on them)."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = "surge/gateway/epp/proto"
MESSAGES = ("base", "processing_mode", "http_status")
SERVICES = ("external_processor", "health")


def generate(out: Path) -> list[Path]:
    """protoc (grpcio-tools) on copies of the vendored protos under `out`, laid out as in the
    repository (their imports name repository paths); the files made."""
    from grpc_tools import protoc

    (out / PROTO_DIR).mkdir(parents=True)
    for name in (*MESSAGES, *SERVICES):
        shutil.copy(ROOT / PROTO_DIR / f"{name}.proto", out / PROTO_DIR / f"{name}.proto")
    include = str(resources.files("grpc_tools") / "_proto")  # google/protobuf/*.proto
    common = ["protoc", f"-I{out}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}"]
    made = []
    for names, grpc in ((MESSAGES, False), (SERVICES, True)):
        files = [str(out / PROTO_DIR / f"{n}.proto") for n in names]
        extra = [f"--grpc_python_out={out}"] if grpc else []
        assert protoc.main([*common, *extra, *files]) == 0, f"protoc failed on {files}"
        for n in names:
            made += [out / PROTO_DIR / f"{n}_pb2.py", out / PROTO_DIR / f"{n}_pb2.pyi"]
            if grpc:
                made.append(out / PROTO_DIR / f"{n}_pb2_grpc.py")
    return made


def test_committed_stubs_are_what_protoc_makes(tmp_path: Path) -> None:
    made = generate(tmp_path)
    assert len(made) == 3 * 2 + 2 * 3
    for path in made:
        committed = ROOT / path.relative_to(tmp_path)
        assert committed.read_text() == path.read_text(), (
            f"{committed} is not protoc's output: regenerate (surge/gateway/epp/proto/__init__.py)"
        )


def test_service_and_messages_keep_envoys_names() -> None:
    from surge.gateway.epp.proto import external_processor_pb2 as pb
    from surge.gateway.epp.proto import health_pb2

    service = pb.DESCRIPTOR.services_by_name["ExternalProcessor"]
    assert service.full_name == "envoy.service.ext_proc.v3.ExternalProcessor"
    (method,) = service.methods
    assert (method.name, method.input_type.full_name, method.output_type.full_name) == (
        "Process", "envoy.service.ext_proc.v3.ProcessingRequest",
        "envoy.service.ext_proc.v3.ProcessingResponse",
    )  # fmt: skip
    header = pb.HttpHeaders.DESCRIPTOR.fields_by_name["headers"].message_type
    assert header.full_name == "envoy.config.core.v3.HeaderMap"
    value = header.fields_by_name["headers"].message_type
    assert {f.name: f.number for f in value.fields} == {"key": 1, "value": 2, "raw_value": 3}
    assert health_pb2.DESCRIPTOR.services_by_name["Health"].full_name == "grpc.health.v1.Health"
