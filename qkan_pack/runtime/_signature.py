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
of what was read. The lower layer is private API: every access to it is in
``_signing_compat``, which checks the installed release against the one it was written for;
``model-signing`` is pinned exactly (``[sign]`` extra, ``==1.1.1``) and the tests exercise
every path through it.

What the library leaves to its caller is done here: the bundle's shape is checked before
the library indexes into it (one signature, a non-empty certificate chain), so a malformed
bundle is an ``ArtifactSignatureError`` and never a raw ``IndexError``; the unsigned key hint
never picks the key (every trusted key is tried); and a certificate must be a code-signing
leaf, not merely one whose key may sign (the library's only check), or any TLS server key
under a trusted root could ship code. Nothing here lets the library print: its one
``print`` (a bundle without key hint) is never reached, and a ``print`` to the process's
stdout would corrupt ``inspect --json``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..errors import ArtifactSignatureError, FileReadError, LoadOptionError
from ..format import MANIFEST_NAME, SIGNATURE_NAME, loads_strict
from ._files import read_regular_file
from ._signing_compat import MALFORMED, PemFile, signing_modules

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["code_signing_problem"]



#: A trusted key file is read up to this size (a PEM public key is a few hundred bytes, a
#: root certificate a few KiB; a bundle of roots stays far below it).
MAX_KEY_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Trust:
    """Parsed trusted keys: EC public keys and root certificates (trust anchors), each with
    the bytes read from its file."""

    keys: tuple[PemFile, ...]
    anchors: tuple[PemFile, ...]


def load_trust(paths: Sequence[Path]) -> Trust:
    """Sort trusted PEM files into public keys and certificates; refuse anything else (before
    the artifact is touched: a wrong key file is a wrong option). Each file is read once,
    as every supplied file is (``read_regular_file``: a regular file, bounded, never waiting
    on a FIFO), and only those bytes are used."""
    modules, pem = _library("trusted keys", str(paths[0]) if paths else "")
    keys, anchors = [], []
    for path in paths:
        file = PemFile(path, _key_bytes(path))
        if _parses(pem.load_pem_public_key, file.data):
            try:
                modules.ec.Verifier(file)  # an EC key on a curve the library supports
            except (ValueError, AttributeError, TypeError) as exc:
                raise LoadOptionError(option="trusted_keys", value=str(path),
                                      expected=f"an EC P-256/384/521 public key ({exc})") from None
            keys.append(file)
        elif _parses(pem.load_pem_x509_certificates, file.data):
            anchors.append(file)
        else:
            raise LoadOptionError(
                option="trusted_keys", value=str(path),
                expected="PEM files holding an EC public key or (root) certificates")
    return Trust(keys=tuple(keys), anchors=tuple(anchors))


def _key_bytes(path: Path) -> bytes:
    try:
        return read_regular_file(path, limit=MAX_KEY_FILE_BYTES)
    except FileReadError as exc:
        raise LoadOptionError(option="trusted_keys", value=str(path),
                              expected=f"a PEM file (an EC public key or root certificates) of "
                                       f"at most {MAX_KEY_FILE_BYTES} bytes; this one "
                                       f"{exc.problem}") from None


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
    _check_envelope(bundle.bundle, where)
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
    """(model_signing's modules through the one seam, ``_signing_compat``; cryptography's
    PEM loaders), or a clear error."""
    modules = signing_modules(purpose, where, _drop_usage_warnings)
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    pem = SimpleNamespace(load_pem_public_key=serialization.load_pem_public_key,
                          load_pem_x509_certificates=x509.load_pem_x509_certificates)
    return modules, pem


def _drop_usage_warnings(record: logging.LogRecord) -> bool:
    """A filter for model-signing's certificate module, whose only log lines are warnings
    that a certificate lacks keyUsage or extendedKeyUsage (and fingerprints, never asked
    for here): ``code_signing_problem`` decides on both and says why, so they are noise,
    and on stdout wherever an application logs there. Added once (the same function)."""
    return False


def _parse_bundle(data: bytes, modules: Any, where: str) -> Any:
    """The bundle from the bytes read (strict JSON: a duplicate key is refused, never
    resolved one way here and another way by some other verifier), read as the library's
    own ``Signature.read`` reads it: bundles of older model-signing versions lack the key
    hint and the transparency-log list, and may carry key bytes that are ignored."""
    try:
        raw = loads_strict(data)
        material = raw["verificationMaterial"]
        material.setdefault("tlogEntries", [])
        if isinstance(material.get("publicKey"), dict):
            material["publicKey"].setdefault("hint", None)
            for ignored in ("rawBytes", "keyDetails"):
                material["publicKey"].pop(ignored, None)
        return modules.pb.Signature(modules.bundle.Bundle.from_dict(raw))
    except MALFORMED as exc:  # a ManifestError (unreadable JSON) is a ValueError
        raise ArtifactSignatureError(path=where, problem="invalid",
                                     detail=f"{SIGNATURE_NAME} is not a signature bundle: "
                                            f"{str(exc)[:120]}") from None


def _check_envelope(bundle: Any, where: str) -> None:
    """What the library takes for granted: a DSSE envelope with exactly one signature (it
    checks ``signatures[0]`` and would ignore any other, so a second one vouches for
    nothing), and a non-empty certificate chain when certificates are named."""
    envelope = bundle.dsse_envelope
    if envelope is None:
        raise ArtifactSignatureError(path=where, problem="invalid",
                                     detail="the bundle holds no DSSE envelope")
    if len(envelope.signatures) != 1:
        raise ArtifactSignatureError(
            path=where, problem="invalid",
            detail=f"the envelope holds {len(envelope.signatures)} signatures, not one")
    chain = bundle.verification_material.x509_certificate_chain
    if chain is not None and not chain.certificates:
        raise ArtifactSignatureError(path=where, problem="invalid",
                                     detail="the certificate chain is empty")


def _verify_with_keys(bundle: Any, trust: Trust, modules: Any,
                      where: str) -> tuple[dict[str, str], str]:
    """Try every trusted key, in sorted order, until one verifies the ECDSA signature over
    the DSSE envelope. The bundle's key hint is not signed, so it picks nothing: each key
    is tried with the hint set to its own (the library then checks the signature alone,
    and never reaches its ``print`` for a bundle without hint). The hint only names the
    refusal: "invalid" when it claims a trusted key that does not verify (altered after
    signing), else "untrusted"."""
    fingerprints = {key: _fingerprint(key) for key in sorted(trust.keys)}
    for key, fingerprint in fingerprints.items():
        try:
            manifest = modules.ec.Verifier(key).verify(_hinted(bundle, fingerprint, modules))
        except modules.invalid:
            continue
        except modules.malformed as exc:
            raise _invalid(where, exc) from None
        return _digests(manifest, where), f"key {key} (sha256 {fingerprint[:16]}…)"
    claimed = bundle.bundle.verification_material.public_key.hint
    named = [key for key, fingerprint in fingerprints.items() if fingerprint == claimed]
    if named:
        raise ArtifactSignatureError(path=where, problem="invalid",
                                     detail=f"it names the trusted key {named[0]}, which does "
                                            "not verify it")
    raise ArtifactSignatureError(path=where, problem="untrusted",
                                 detail=f"signed by a key that is not among {len(trust.keys)} "
                                        "trusted key(s): none of them verifies it")


def _fingerprint(key: PemFile) -> str:
    """The key's hint as model-signing writes it: sha256 of its SubjectPublicKeyInfo PEM."""
    from cryptography.hazmat.primitives import serialization

    public = serialization.load_pem_public_key(key.data)
    return hashlib.sha256(public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def _hinted(bundle: Any, fingerprint: str, modules: Any) -> Any:
    """A copy of ``bundle`` whose (unsigned) key hint names ``fingerprint``."""
    material = bundle.bundle.verification_material
    key = material.public_key.model_copy(update={"hint": fingerprint})
    return modules.pb.Signature(bundle.bundle.model_copy(update={
        "verification_material": material.model_copy(update={"public_key": key})}))


def _verify_with_anchors(bundle: Any, trust: Trust, modules: Any,
                         where: str) -> tuple[dict[str, str], str]:
    """A certificate-signed bundle: the signing certificate must be a code-signing leaf
    (checked first: what it may do does not depend on who issued it), and its chain must
    lead to one of the trusted root certificates (never to the system's default roots)."""
    if not trust.anchors:
        raise ArtifactSignatureError(path=where, problem="untrusted",
                                     detail="signed with a certificate, and no trusted key is "
                                            "a certificate")
    leaf = _leaf(bundle, where)
    subject = leaf.subject.rfc4514_string()
    problem = _code_signing_problem(leaf, where)
    if problem is not None:
        raise ArtifactSignatureError(path=where, problem="certificate use",
                                     detail=f"{subject}: {problem}")
    try:
        manifest = modules.certificate.Verifier(list(trust.anchors)).verify(bundle)
    except modules.chain_error as exc:
        raise ArtifactSignatureError(path=where, problem="untrusted",
                                     detail=f"certificate chain: {exc}") from None
    except (modules.invalid, *modules.malformed) as exc:
        raise _invalid(where, exc) from None
    return _digests(manifest, where), f"certificate {subject}"


def _leaf(bundle: Any, where: str) -> Any:
    """The signing certificate: the first of the chain (``_check_envelope`` saw one)."""
    from cryptography import x509

    chain = bundle.bundle.verification_material.x509_certificate_chain.certificates
    try:
        return x509.load_der_x509_certificate(chain[0].raw_bytes)
    except ValueError as exc:
        raise _invalid(where, exc) from None


def _code_signing_problem(certificate: Any, where: str) -> str | None:
    """``code_signing_problem``, a certificate whose extensions cannot be read being an
    invalid signature."""
    from cryptography import x509

    try:
        return code_signing_problem(certificate)
    except (x509.DuplicateExtension, ValueError) as exc:
        raise _invalid(where, exc) from None


#: Extended key usages by the names openssl and RFC 5280 give them.
_USAGE_NAMES = {"1.3.6.1.5.5.7.3.1": "serverAuth", "1.3.6.1.5.5.7.3.2": "clientAuth",
                "1.3.6.1.5.5.7.3.3": "codeSigning", "1.3.6.1.5.5.7.3.4": "emailProtection",
                "1.3.6.1.5.5.7.3.8": "timeStamping", "1.3.6.1.5.5.7.3.9": "OCSPSigning",
                "2.5.29.37.0": "anyExtendedKeyUsage"}


def code_signing_problem(certificate: Any) -> str | None:
    """Why ``certificate`` (a ``cryptography`` ``x509.Certificate``) may not sign code, or
    None when it may.

    A code-signing identity is a leaf whose issuer said it is for code signing:
    extendedKeyUsage names codeSigning (``anyExtendedKeyUsage`` or none at all says
    nothing of the kind; a TLS server's certificate is a web server's identity);
    basicConstraints is CA:FALSE, or absent, which RFC 5280 reads as not a CA; and
    keyUsage, when present, allows digitalSignature and not keyCertSign (a key that may
    sign certificates is a CA's, whatever basicConstraints says). model-signing 1.1.1
    checks only that the key may make signatures, so an intermediate CA's key, or any TLS
    server key under a trusted root, would otherwise pass.
    """
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    problems = []
    constraints = _extension(certificate, x509.BasicConstraints)
    if constraints is not None and constraints.ca:
        problems.append("it is a CA certificate (basicConstraints CA:TRUE)")
    usage = _extension(certificate, x509.KeyUsage)
    if usage is not None and not usage.digital_signature:
        problems.append("its keyUsage does not allow digitalSignature")
    if usage is not None and usage.key_cert_sign:
        problems.append("its keyUsage allows keyCertSign (a CA's key)")
    purposes = _extension(certificate, x509.ExtendedKeyUsage)
    if purposes is None or not list(purposes):
        problems.append("it has no extended key usage (codeSigning is required)")
    elif ExtendedKeyUsageOID.CODE_SIGNING not in purposes:
        names = ", ".join(_USAGE_NAMES.get(oid.dotted_string, oid.dotted_string)
                          for oid in purposes)
        problems.append(f"its extended key usage is {names}, not codeSigning")
    return "; ".join(problems) or None


def _extension(certificate: Any, kind: type) -> Any:
    from cryptography import x509

    try:
        return certificate.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


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
