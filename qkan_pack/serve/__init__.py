"""Serving over HTTP on Ray Serve: one ``Predictor`` per replica, rows batched into the
captured shapes, bounded admission, JSON everywhere. Ray is imported only where a deployment
is built or run."""

from ._app import ArtifactServer, NoopServer, ServeOptions, build_app
from ._auth import check_token, read_token_file, token_digest
from ._builder import app_builder
from ._http import DEFAULT_MAX_BODY_BYTES, HttpLimits
from ._launch import INGRESSES, Listen, ReplicaLoad, replica_device_text, serve_forever
from ._oip_grpc import add_inference_service
from ._rows import describe_artifact, row_plan, signature_text
from ._wire import encode_outputs, fit, parse_request, parse_tensor

__all__ = ["DEFAULT_MAX_BODY_BYTES", "INGRESSES", "ArtifactServer", "HttpLimits", "Listen",
           "NoopServer", "ReplicaLoad", "ServeOptions", "add_inference_service", "app_builder", "build_app",
           "check_token", "describe_artifact", "encode_outputs", "fit", "parse_request",
           "parse_tensor", "read_token_file", "replica_device_text", "row_plan",
           "serve_forever", "signature_text", "token_digest"]
