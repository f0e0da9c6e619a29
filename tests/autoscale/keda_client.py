"""A KEDA-side client: Python stubs generated at test time from the vendored externalscaler.proto
(not the committed ones), as KEDA's own client is generated from the same file."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().parents[2] / "surge/autoscale/keda/externalscaler.proto"


def generate(out: Path, proto_rel: str = "externalscaler.proto") -> list[Path]:
    """Run grpc_tools.protoc on a copy of the proto placed at `out/proto_rel`; the files made."""
    from grpc_tools import protoc

    target = out / proto_rel
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROTO, target)
    args = ["protoc", f"-I{out}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", str(target)]  # fmt: skip
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {target}")
    stem = target.with_suffix("")
    return [Path(f"{stem}_pb2.py"), Path(f"{stem}_pb2.pyi"), Path(f"{stem}_pb2_grpc.py")]


def client_modules(out: Path) -> tuple[ModuleType, ModuleType]:
    """(messages, stubs) generated into `out` and imported from there."""
    generate(out)
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("externalscaler_pb2"), importlib.import_module(
            "externalscaler_pb2_grpc"
        )
    finally:
        sys.path.remove(str(out))
