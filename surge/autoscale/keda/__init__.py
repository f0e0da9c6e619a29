"""KEDA's external scaler for `surge autoscale --keda-external-scaler-port`.

externalscaler.proto is KEDA's (Apache-2.0, see its header); the *_pb2*.py modules beside it are
generated from it, with grpcio-tools==1.85.1 (the `dev` extra), from the repository root:

    python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \\
        surge/autoscale/keda/externalscaler.proto

tests/autoscale/test_keda_stubs.py regenerates them and fails if they differ from these.
"""
