"""Which ``pip install`` brings a missing module: qkan-pack's own extras for the optional
libraries its commands use, else the package itself (at the version an artifact recorded,
when it did). One table, so that every "not installed" message gives the same line (the
releases a seam into a library's internals supports are ``_supported``'s)."""

from __future__ import annotations

from collections.abc import Mapping

#: Module (top-level import name) -> the qkan-pack extra that installs it.
EXTRAS = {
    "qkan": "qkan",
    "ray": "serve", "orjson": "serve", "starlette": "serve", "uvicorn": "serve",
    "prometheus_client": "serve",
    "matplotlib": "bench",
    "tritonclient": "grpc",
    "model_signing": "sign", "OpenSSL": "sign", "sigstore": "sign", "sigstore_models": "sign",
    "mkdocs": "docs",
}
#: Import names whose distribution is named otherwise.
DISTRIBUTIONS = {"PIL": "pillow", "sklearn": "scikit-learn", "cv2": "opencv-python",
                 "yaml": "pyyaml", "OpenSSL": "pyopenssl", "google": "protobuf",
                 "grpc": "grpcio", "rapidjson": "python-rapidjson"}


def missing_module(error: BaseException | None) -> str | None:
    """The top-level name of the module whose absence caused ``error`` (its cause chain
    searched), else None. A module set to None in ``sys.modules`` counts as missing."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, ModuleNotFoundError) and error.name:
            return error.name.split(".")[0]
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def install_hint(module: str, recorded: Mapping[str, str] | None = None) -> str:
    """The one line that installs ``module``: ``pip install 'qkan-pack[serve]'``, or
    ``pip install transformers==4.57.1`` where the artifact recorded that version."""
    top = module.split(".")[0]
    if top in EXTRAS:
        return f"pip install 'qkan-pack[{EXTRAS[top]}]'"
    name = DISTRIBUTIONS.get(top, top)
    version = (recorded or {}).get(top) or (recorded or {}).get(name)
    return f"pip install {name}=={version}" if version else f"pip install {name}"
