"""Envoy's ext_proc protocol and gRPC's health protocol, vendored (see each .proto's header for
its source, licence and what was trimmed); the *_pb2*.py(i) modules beside them are generated,
with grpcio-tools==1.85.1 (the `dev` extra), from the repository root:

    python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \\
        surge/gateway/epp/proto/base.proto surge/gateway/epp/proto/processing_mode.proto \\
        surge/gateway/epp/proto/http_status.proto
    python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \\
        surge/gateway/epp/proto/external_processor.proto surge/gateway/epp/proto/health.proto

tests/gateway/epp/test_stubs.py regenerates them and fails if they differ from these.
"""
