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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ServeError
from ..format import SHA256_HEX
from ._app import ServeOptions, app_for
from ._auth import read_token_file, token_digest
from ._http import HttpLimits
from ._settings import READERS, apply_settings, load_options, text_value

if TYPE_CHECKING:
    from ray.serve import Application


#: Each argument the builder takes and how its text (a YAML value, or ``key=value`` of
#: ``serve run``) is read: the deployment settings (``_settings``) and where the artifact,
#: its pins and the token are.
ARGS: Mapping[str, Callable[[Any], Any]] = {
    "artifact": text_value, "digest": text_value, "keys": text_value, "token_file": text_value,
    "token_sha256": text_value, "name": text_value, **READERS,
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
    return apply_settings(ServeOptions(limits=HttpLimits(token_sha256=token),
                                       model_name=read.get("name"),
                                       grpc=importlib.util.find_spec("tritonclient") is not None),
                          read)


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
                   predictor_options=load_options(keys, read.get("precision", "recorded"),
                                                  read.get("compiled", "auto")))
