"""``qkan-pack sign``: sign every file of an artifact with the OpenSSF model-signing library.

The artifact is read back verified first (a damaged artifact is never signed), then
rewritten through the atomic writer with the same bytes, its manifest and so its digest
unchanged, plus ``model.sig``. The read and the write happen under the target's writer
lock: a concurrent ``build --force`` installs either before (and is what gets signed) or
after (and stays unsigned), never in between, where the old artifact would overwrite it.
The signature is made by the library's public signing API (``model_signing.signing.Config``)
over the staged directory, so what is signed is exactly what is installed; the writer then
fsyncs it with the rest and swaps the directory in. Key and certificate are loaded, and the
certificate must be a code-signing leaf (what a load with trusted keys demands), before
anything on disk changes. Needs ``qkan-pack[sign]``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ArtifactSignatureError
from ..format import MANIFEST_NAME, SIGNATURE_NAME
from ..runtime import code_signing_problem, read_artifact
from ._writer import install_artifact, locked_target


@dataclass(frozen=True)
class SignResult:
    path: Path
    digest: str  # unchanged by signing: the signature sits beside the manifest, not in it
    signer: str


def sign(path: str | os.PathLike[str], private_key: str | os.PathLike[str], *,
         certificate: str | os.PathLike[str] | None = None,
         chain: Sequence[str | os.PathLike[str]] = (), password: str | None = None) -> SignResult:
    """Sign the artifact at ``path`` with an EC private key (PEM), or with a key and its
    signing certificate plus the chain up to (not necessarily including) a root.

    Replaces an existing signature. Verify with ``Predictor.load(..., trusted_keys=[...])``
    or ``qkan-pack verify --key``: the public key, or the root certificate.
    """
    config = _signing_config(str(path), private_key, certificate, chain, password)
    with locked_target(path):
        artifact = read_artifact(path)
        files = {**artifact.files, MANIFEST_NAME: artifact.manifest_bytes}
        install_artifact(path, files, force=True,
                         derived=lambda staging: {SIGNATURE_NAME: _signature(config, staging)})
    signer = f"certificate {certificate}" if certificate is not None else f"key {private_key}"
    return SignResult(path=Path(path), digest=artifact.digest, signer=signer)


def _signing_config(where: str, private_key: str | os.PathLike[str],
                    certificate: str | os.PathLike[str] | None,
                    chain: Sequence[str | os.PathLike[str]], password: str | None) -> Any:
    """The library's signing configuration: one sha256 per file (what the loader checks),
    no symlinks, nothing ignored but the signature itself (not even .git paths)."""
    try:
        import model_signing
    except ImportError as exc:
        raise ArtifactSignatureError(path=where, problem="unavailable", detail=str(exc)) from None
    hashing = (model_signing.hashing.Config()
               .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
               .set_ignored_paths(paths=[SIGNATURE_NAME], ignore_git_paths=False))
    config = model_signing.signing.Config().set_hashing_config(hashing)
    if certificate is not None:  # checked outside the try: its errors are already ours
        if not chain:
            raise ArtifactSignatureError(path=where, problem="signing key", detail=(
                "--chain: give the intermediate (or root) certificate(s)"))
        _check_signing_certificate(where, Path(certificate))
    try:
        if certificate is None:
            # the library types the password as str but hands it to cryptography, which
            # needs bytes (1.1.1: a str fails with "Cannot convert ... to a buffer")
            config.use_elliptic_key_signer(
                private_key=private_key,
                password=None if password is None else password.encode())  # type: ignore[arg-type]
        else:
            config.use_certificate_signer(private_key=private_key, signing_certificate=certificate,
                                          certificate_chain=list(chain))
    except (ValueError, TypeError, OSError, AttributeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise ArtifactSignatureError(path=where, problem="signing key",
                                     detail=f"{private_key}: {reason}") from None
    return config


def _check_signing_certificate(where: str, certificate: Path) -> None:
    """Refuse, before anything is signed, a certificate that a load would refuse: one that
    is not a code-signing leaf (a TLS server's, a CA's)."""
    from cryptography import x509

    try:
        leaf = x509.load_pem_x509_certificate(certificate.read_bytes())
        problem = code_signing_problem(leaf)
    except (ValueError, OSError, x509.DuplicateExtension) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise ArtifactSignatureError(path=where, problem="signing key",
                                     detail=f"{certificate}: {reason}") from None
    if problem is not None:
        raise ArtifactSignatureError(
            path=where, problem="signing key",
            detail=f"{certificate} ({leaf.subject.rfc4514_string()}) may not sign code: "
                   f"{problem}; sign with {ArtifactSignatureError.CODE_SIGNING_LEAF}")


def _signature(config: Any, staging: Path) -> bytes:
    """Sign the staged artifact; the library writes the bundle to a scratch file, whose bytes
    the writer then puts in place like every other file (O_EXCL, fsync)."""
    with tempfile.TemporaryDirectory(prefix="qkan-pack-sign-") as scratch:
        out = Path(scratch) / SIGNATURE_NAME
        config.sign(staging, out)
        return out.read_bytes()
