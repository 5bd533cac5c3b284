"""Verify an artifact's signature (``model.sig``) against trusted keys, before anything of it
is parsed or run. Only imported when trusted keys are given: the serving path without keys
never pays for ``model_signing`` (about 0.5 s of imports: sigstore, pydantic, OpenSSL).

The signature is an OpenSSF model-signing bundle (``qkan-pack sign`` writes it with the
library's public signing API). Verification uses the library's lower layer on purpose: its
public ``verifying.Config().verify(dir, sig)`` walks and hashes the directory again, from
disk, so the bytes it checks would not be the bytes ``read_artifact`` already read, hashed
and hands to the loader (a window to swap a file, and every byte read twice). Here the
library checks the signature itself (``Verifier.verify(Signature)``: DSSE envelope, ECDSA,
certificate chain) and returns the signed file digests; those are compared with the digests
of what was read. The lower layer is private API, so ``model-signing`` is pinned exactly
(``[sign]`` extra, ``==1.1.1``) and the tests exercise every path through it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ArtifactSignatureError, LoadOptionError, ManifestError
from ..format import MANIFEST_NAME, SIGNATURE_NAME, loads_strict


@dataclass(frozen=True)
class Trust:
    """Parsed trusted keys: EC public keys (by file) and root certificates (trust anchors)."""

    keys: tuple[Path, ...]
    anchors: tuple[Path, ...]


def load_trust(paths: Sequence[Path]) -> Trust:
    """Sort trusted PEM files into public keys and certificates; refuse anything else (before
    the artifact is touched: a wrong key file is a wrong option)."""
    modules, pem = _library("trusted keys", str(paths[0]) if paths else "")
    keys, anchors = [], []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise LoadOptionError(option="trusted_keys", value=str(path),
                                  expected=f"a readable PEM file ({exc.strerror})") from None
        if _parses(pem.load_pem_public_key, data):
            try:
                modules.ec.Verifier(path)  # an EC key on a curve the library supports
            except (ValueError, AttributeError, TypeError) as exc:
                raise LoadOptionError(option="trusted_keys", value=str(path),
                                      expected=f"an EC P-256/384/521 public key ({exc})") from None
            keys.append(path)
        elif _parses(pem.load_pem_x509_certificates, data):
            anchors.append(path)
        else:
            raise LoadOptionError(
                option="trusted_keys", value=str(path),
                expected="PEM files holding an EC public key or (root) certificates")
    return Trust(keys=tuple(keys), anchors=tuple(anchors))


def _parses(loader: Any, data: bytes) -> bool:
    try:
        loader(data)
    except (ValueError, TypeError):
        return False
    return True


def verify_signature(root: Path, signature: bytes | None, manifest_bytes: bytes,
                     trust: Trust) -> tuple[dict[str, str], str]:
    """Check the signature with the trusted keys; return the signed ``{path: sha256 hex}``
    and who signed. The caller compares the digests with what it reads."""
    where = str(root)
    if signature is None:
        raise ArtifactSignatureError(path=where, problem="missing", name=SIGNATURE_NAME)
    modules = _library("signature", where)[0]
    bundle = _parse_bundle(signature, modules, where)
    material = bundle.bundle.verification_material
    if material.public_key is not None:
        signed, signer = _verify_with_keys(bundle, trust, modules, where)
    elif material.x509_certificate_chain is not None:
        signed, signer = _verify_with_anchors(bundle, trust, modules, where)
    else:
        raise ArtifactSignatureError(path=where, problem="invalid",
                                     detail="the bundle names neither a key nor certificates")
    expected = hashlib.sha256(manifest_bytes).hexdigest()
    if signed.get(MANIFEST_NAME) != expected:
        raise ArtifactSignatureError(path=where, problem="mismatch",
                                     detail=f"{MANIFEST_NAME} differs from the signed one")
    return signed, signer


def check_signed_files(root: Path, signed: Mapping[str, str], files: Mapping[str, str]) -> None:
    """The signed digests must be exactly ``files`` (``{path: sha256 hex}``, manifest included)."""
    changed = sorted(n for n in set(signed) & set(files) if signed[n] != files[n])
    unsigned = sorted(set(files) - set(signed))
    dropped = sorted(set(signed) - set(files))
    if changed or unsigned or dropped:
        parts = [f"{label}: {', '.join(names[:5])}" for label, names in
                 (("changed", changed), ("not signed", unsigned), ("signed but absent", dropped))
                 if names]
        raise ArtifactSignatureError(path=str(root), problem="mismatch", detail="; ".join(parts))


def _library(purpose: str, where: str) -> tuple[Any, Any]:
    """(model_signing's modules, cryptography.x509 + serialization), or a clear error."""
    try:
        from types import SimpleNamespace

        from cryptography import exceptions, x509
        from cryptography.hazmat.primitives import serialization
        from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb
        from OpenSSL import crypto
        from sigstore_models.bundle import v1 as bundle_pb
    except ImportError as exc:
        raise ArtifactSignatureError(path=where, problem="unavailable",
                                     detail=f"{purpose}: {exc}") from None
    modules = SimpleNamespace(ec=sign_ec_key, certificate=sign_certificate,
                              pb=sign_sigstore_pb, bundle=bundle_pb,
                              invalid=exceptions.InvalidSignature,
                              chain_error=crypto.X509StoreContextError)
    pem = SimpleNamespace(load_pem_public_key=serialization.load_pem_public_key,
                          load_pem_x509_certificates=x509.load_pem_x509_certificates)
    return modules, pem


def _parse_bundle(data: bytes, modules: Any, where: str) -> Any:
    """The bundle from the bytes read (strict JSON: a duplicate key is refused, never
    resolved one way here and another way by some other verifier)."""
    try:
        raw = loads_strict(data)
        return modules.pb.Signature(modules.bundle.Bundle.from_dict(raw))
    except (ManifestError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ArtifactSignatureError(path=where, problem="invalid",
                                     detail=f"{SIGNATURE_NAME} is not a signature bundle: "
                                            f"{str(exc)[:120]}") from None


def _verify_with_keys(bundle: Any, trust: Trust, modules: Any,
                      where: str) -> tuple[dict[str, str], str]:
    """Try each trusted key; the bundle's key hint picks the one that signed (the library
    checks the hint, then the ECDSA signature over the DSSE envelope)."""
    hint = bundle.bundle.verification_material.public_key.hint or "none"
    for key in trust.keys:
        try:
            manifest = modules.ec.Verifier(key).verify(bundle)
        except ValueError as exc:
            if "Key mismatch" in str(exc):
                continue
            raise _invalid(where, exc) from None
        except (modules.invalid, KeyError, AttributeError, TypeError) as exc:
            raise _invalid(where, exc) from None
        return _digests(manifest, where), f"key {key} (sha256 {hint[:16]}…)"
    raise ArtifactSignatureError(path=where, problem="untrusted",
                                 detail=f"signed by the key with sha256 {hint[:16]}…, which is "
                                        f"not among {len(trust.keys)} trusted key(s)")


def _verify_with_anchors(bundle: Any, trust: Trust, modules: Any,
                         where: str) -> tuple[dict[str, str], str]:
    """A certificate-signed bundle: its chain must lead to one of the trusted root
    certificates (never to the system's default roots)."""
    if not trust.anchors:
        raise ArtifactSignatureError(path=where, problem="untrusted",
                                     detail="signed with a certificate, and no trusted key is "
                                            "a certificate")
    try:
        manifest = modules.certificate.Verifier(list(trust.anchors)).verify(bundle)
    except modules.chain_error as exc:
        raise ArtifactSignatureError(path=where, problem="untrusted",
                                     detail=f"certificate chain: {exc}") from None
    except (modules.invalid, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise _invalid(where, exc) from None
    return _digests(manifest, where), _subject(bundle)


def _subject(bundle: Any) -> str:
    from cryptography import x509

    chain = bundle.bundle.verification_material.x509_certificate_chain.certificates
    leaf = x509.load_der_x509_certificate(chain[0].raw_bytes)
    return f"certificate {leaf.subject.rfc4514_string()}"


def _digests(manifest: Any, where: str) -> dict[str, str]:
    """The signed ``{path: sha256 hex}``; only per-file sha256 serialization is accepted."""
    kind = dict(manifest.serialization_type)
    if kind.get("method") != "files" or kind.get("hash_type") != "sha256":
        raise ArtifactSignatureError(path=where, problem="invalid",
                                     detail=f"signed with {kind}, expected files/sha256")
    return {str(item.identifier): item.digest.digest_hex for item in manifest.resource_descriptors()}


def _invalid(where: str, exc: BaseException) -> ArtifactSignatureError:
    reason = str(exc).strip() or type(exc).__name__
    return ArtifactSignatureError(path=where, problem="invalid", detail=reason[:160])
