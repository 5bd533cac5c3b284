"""``qkan_pack.serve:app_builder``: an artifact as a Ray Serve application builder, for a Serve
config file (``serve run config.yaml``, ``serve deploy``) and a KubeRay ``RayService``'s
``serveConfigV2``, where Ray, not ``qkan-pack serve``, runs the deployment::

    applications:
      - name: qkan-pack
        route_prefix: /
        import_path: qkan_pack.serve:app_builder
        args: {artifact: /models/qkan_mlp, digest: "sha256:...", token_file: /secrets/token}

The builder runs in Ray's controller: it verifies the artifact there (its digest when given,
its signature with ``keys``) and pins every replica to that digest, as the command does. What
the command adds around a deployment and a builder cannot, because Ray and its proxies start
before it runs: the HAProxy wrapper (retries of a request whose replica died, admission at
the ingress, JSON 503s), the token gate in front of Ray's own routes, the loopback node. The
replicas' own checks stay: the digest, the bearer token on every app route, admission bounds,
strict inputs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ServeError
from ..format import PRECISIONS, SHA256_HEX
from ._app import ServeOptions, app_for
from ._auth import read_token_file, token_digest
from ._http import HttpLimits
from ._launch import load_options

if TYPE_CHECKING:
    from ray.serve import Application


def _boolean(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    if str(text).lower() in ("true", "1", "yes"):
        return True
    if str(text).lower() in ("false", "0", "no"):
        return False
    raise ValueError("not true or false")


def _finite(text: Any) -> float:
    if isinstance(text, bool):
        raise ValueError("not a number")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _integer(text: Any) -> int:
    """A whole number: 2 or "2", never 1.7 (which ``int`` would truncate) or true."""
    if isinstance(text, bool) or not (isinstance(text, int) or str(text).strip().isdigit()):
        raise ValueError("not a whole number")
    return int(text)


def _text(value: Any) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ValueError("not text")
    return str(value)


def _within(low: float, high: float) -> Callable[[Any], float]:
    def read(text: Any) -> float:
        value = _finite(text)
        if not low <= value <= high:
            raise ValueError(f"outside [{low:g}, {high:g}]")
        return value
    return read


#: Each argument the builder takes and how its text (a YAML value, or ``key=value`` of
#: ``serve run``) is read.
ARGS: Mapping[str, Callable[[Any], Any]] = {
    "artifact": _text, "digest": _text, "keys": _text, "token_file": _text,
    "token_sha256": _text, "name": _text, "replicas": _integer, "gpus_per_replica": _finite,
    "cpus_per_replica": _finite, "device": _text, "max_batch_size": _integer,
    "max_batch_wait_ms": _finite, "exact": _boolean, "max_ongoing_requests": _integer,
    "max_queued_requests": _integer, "max_body_mb": _within(0.001, 65536.0),
    "body_timeout_s": _within(0.1, 86400.0), "grace_s": _finite, "precision": _text,
}


def read_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The builder's arguments, each read as ``ARGS`` says; ServeError naming the first one
    that is unknown, missing or unreadable."""
    unknown = sorted(set(args) - set(ARGS))
    if unknown:
        raise ServeError(f"app_builder: unknown argument(s) {unknown}; it takes {sorted(ARGS)}")
    if "artifact" not in args:
        raise ServeError("app_builder: give the artifact's directory (args: {artifact: PATH})")
    read = {}
    for key, value in args.items():
        try:
            read[key] = ARGS[key](value)
        except (TypeError, ValueError) as exc:
            raise ServeError(f"app_builder: argument {key}={value!r}: {exc}") from None
    if read.get("precision", "recorded") not in ("recorded", *PRECISIONS):
        raise ServeError(f"app_builder: precision {read['precision']!r}; give recorded or one "
                         f"of {', '.join(PRECISIONS)}")
    return read


def options_from(read: Mapping[str, Any]) -> ServeOptions:
    """The deployment's options from the read arguments (``ServeOptions`` checks ranges)."""
    token = read.get("token_sha256")
    if token is not None:
        token = token.removeprefix("sha256:")
        if not SHA256_HEX.match(token):
            raise ServeError("app_builder: token_sha256 must be the token's sha256, 64 "
                             "lowercase hex digits (sha256sum of the token without newline)")
    if "token_file" in read:
        if token is not None:
            raise ServeError("app_builder: give token_file or token_sha256, not both")
        token = token_digest(read_token_file(read["token_file"]))
    limits = HttpLimits(max_ongoing=read.get("max_ongoing_requests"),
                        max_queued=read.get("max_queued_requests"), token_sha256=token)
    if "max_body_mb" in read:
        limits = dataclasses.replace(limits, max_body_bytes=int(read["max_body_mb"] * 2**20))
    if "body_timeout_s" in read:
        limits = dataclasses.replace(limits, body_timeout_s=read["body_timeout_s"])
    fields = {key: read[key] for key in ("replicas", "gpus_per_replica", "cpus_per_replica",
                                         "device", "max_batch_size", "max_batch_wait_ms",
                                         "exact", "grace_s") if key in read}
    return ServeOptions(**fields, limits=limits, model_name=read.get("name"),
                        grpc=importlib.util.find_spec("tritonclient") is not None)


def app_builder(args: dict[str, Any]) -> Application:
    """The Ray Serve application of the artifact ``args["artifact"]`` (see the module
    docstring for the arguments), verified here before any replica starts."""
    from ..runtime import read_artifact

    read = read_args(args)
    options = options_from(read)
    keys = [key for key in read.get("keys", "").split(",") if key]
    expected = read.get("digest")
    artifact = read_artifact(read["artifact"], expected_digest=expected, trusted_keys=keys)
    return app_for(dataclasses.replace(artifact, files={}), options,
                   predictor_options=load_options(keys, read.get("precision", "recorded")))
