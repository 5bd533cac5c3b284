"""Every access to model-signing's internals, in one place, checked against the release it
was written for.

Verification uses the library's lower layer (``model_signing._signing``: the per-kind
``Verifier`` classes and the bundle wrapper) so that the bytes checked are the bytes already
read (``_signature`` says why), and its bundle model (``sigstore_models``) to parse bundles
as the library does. That layer is private API: ``SUPPORTED`` names the releases it was read
from, and ``signing_modules`` refuses any other with the range and the fix, before anything
is verified (a changed private API could otherwise accept what it should refuse).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from .._supported import MODEL_SIGNING
from ..errors import ArtifactSignatureError

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

#: model-signing releases whose private verifying layer this module was written against
#: (stated in ``_supported``; the ``sign`` extra declares the same).
SUPPORTED = MODEL_SIGNING
#: What the library and the bundle model raise on malformed input (``IndexError`` and
#: ``KeyError`` are ``LookupError``s): each is the bundle's fault, never a crash.
MALFORMED: tuple[type[BaseException], ...] = (ValueError, LookupError, TypeError,
                                              AttributeError)


@dataclass(frozen=True, order=True)
class PemFile:
    """A trusted key or certificate file, read once (``runtime.read_regular_file``).

    The library's verifiers take paths and read each with ``read_bytes()``; they get this
    instead, so they verify with the bytes that were checked and never open the file again
    (by then it could be another file, or a FIFO that blocks the read). Shown as its path."""

    path: Path
    data: bytes = field(repr=False, compare=False)

    def read_bytes(self) -> bytes:
        return self.data

    def __str__(self) -> str:
        return str(self.path)


def unsupported_release() -> str | None:
    """Why the installed model-signing cannot be used, or None."""
    from importlib import metadata  # here: the serving path without keys never pays for it

    try:
        installed = metadata.version("model-signing")
    except metadata.PackageNotFoundError:
        return "model-signing is not installed"
    if not SUPPORTED.admits(installed):
        return SUPPORTED.outside(installed, "qkan-pack verifies signatures with internals of "
                                 "that release; install it: pip install 'qkan-pack[sign]'")
    return None


def signing_modules(purpose: str, where: str,
                    drop_log: Callable[[logging.LogRecord], bool]) -> SimpleNamespace:
    """model-signing's verifiers, bundle model and the errors they raise, as one namespace
    (``ec``, ``certificate``, ``pb``, ``bundle``, ``invalid``, ``chain_error``,
    ``malformed``); the certificate module's log lines go through ``drop_log``. An
    unavailable or unsupported library is ``ArtifactSignatureError(problem="unavailable")``."""
    problem = unsupported_release()
    if problem is not None:
        raise ArtifactSignatureError(path=where, problem="unavailable", detail=f"{purpose}: {problem}")
    try:
        from cryptography import exceptions
        from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb
        from OpenSSL import crypto
        from sigstore_models.bundle import v1 as bundle_pb
    except ImportError as exc:
        raise ArtifactSignatureError(path=where, problem="unavailable",
                                     detail=f"{purpose}: {exc}") from None
    logging.getLogger(sign_certificate.__name__).addFilter(drop_log)
    return SimpleNamespace(ec=sign_ec_key, certificate=sign_certificate, pb=sign_sigstore_pb,
                           bundle=bundle_pb, invalid=exceptions.InvalidSignature,
                           chain_error=crypto.X509StoreContextError,
                           malformed=(*MALFORMED, crypto.Error, exceptions.UnsupportedAlgorithm))
