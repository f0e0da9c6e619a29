"""The gateway as an Endpoint Picker for Kubernetes' inference gateway (Envoy ext_proc, the
Gateway API Inference Extension's protocol): `surge gateway --ext-proc-port N`. Importing
this package needs nothing beyond the gateway's own dependencies; its gRPC server and stubs
(grpcio, protobuf: the `epp` extra) load only when the port is given."""
