"""Serving over HTTP on Ray Serve: one ``Predictor`` per replica, rows batched into the
captured shapes. Ray is imported only where a deployment is built or run."""

from ._app import (
    DEFAULT_MAX_BODY_BYTES,
    ArtifactServer,
    build_app,
    describe_artifact,
    row_plan,
    serve_forever,
    signature_text,
)
from ._wire import encode_outputs, fit, parse_request, parse_tensor

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ArtifactServer", "build_app", "describe_artifact",
           "encode_outputs", "fit", "parse_request", "parse_tensor", "row_plan",
           "serve_forever", "signature_text"]
