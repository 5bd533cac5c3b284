"""Signed artifacts: ``qkan-pack sign`` (builder) and the check with trusted keys (runtime).

Every refusal happens before any of the artifact's code runs (the sentinel model's trace
stays empty); a re-signed edit by a trusted key is accepted: that is the trust boundary (a
signature says who vouches for the files, not that the code is safe).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import qkan_pack
from qkan_pack import ArtifactError, ArtifactSignatureError, Predictor, QkanPackError, read_artifact
from qkan_pack.cli import cli

from ..conftest import MODELS, ROOT
from .test_tamper import REF0, SOURCE, WEIGHTS, flip, resign

SIG = "model.sig"
signing = pytest.importorskip("model_signing", reason="needs the [sign] extra")

from cryptography import x509  # noqa: E402 - after the skip: cryptography comes with [sign]
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

# ---------------------------------------------------------------------------
# Keys and certificates, made here (nothing leaves the machine)
# ---------------------------------------------------------------------------


def write_key(folder: Path, name: str, curve: ec.EllipticCurve | None = None,
              password: bytes | None = None) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(curve or ec.SECP256R1())
    encryption = (serialization.BestAvailableEncryption(password) if password
                  else serialization.NoEncryption())
    (folder / f"{name}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    (folder / f"{name}.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key


def certificate(folder: Path, name: str, key: ec.EllipticCurvePrivateKey,
                issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
                ca: bool | None, *,
                usages: tuple[x509.ObjectIdentifier, ...] | None = None,
                key_usage: tuple[str, ...] | None = None) -> x509.Certificate:
    """A certificate for ``key``. ``ca``: basicConstraints CA:TRUE/FALSE, or none at all.
    ``usages``: extended key usages (default: none for a CA, codeSigning for a leaf);
    ``key_usage``: the keyUsage bits set (default: keyCertSign + cRLSign for a CA, none)."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer[0].subject if issuer else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(days=1))
               .not_valid_after(now + dt.timedelta(days=30)))
    if ca is not None:
        builder = builder.add_extension(x509.BasicConstraints(ca=ca, path_length=None),
                                        critical=True)
    if key_usage is None and ca:
        key_usage = ("key_cert_sign", "crl_sign")
    if key_usage is not None:
        bits = dict.fromkeys(("digital_signature", "content_commitment", "key_encipherment",
                              "data_encipherment", "key_agreement", "key_cert_sign", "crl_sign",
                              "encipher_only", "decipher_only"), False)
        bits.update(dict.fromkeys(key_usage, True))
        builder = builder.add_extension(x509.KeyUsage(**bits), critical=True)
    if usages is None and not ca:
        usages = (ExtendedKeyUsageOID.CODE_SIGNING,)
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert


#: Certificates under ``root`` that must not sign code: how each is made (in ``keys``), and
#: what the refusal says about it.
NOT_FOR_CODE: dict[str, tuple[dict[str, Any], str]] = {
    # an ordinary TLS server certificate
    "tls": (dict(ca=False, usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
                 key_usage=("digital_signature", "key_encipherment")), "serverAuth"),
    # an intermediate CA signing with its own key
    "ca2": (dict(ca=True, key_usage=("digital_signature", "key_cert_sign", "crl_sign")),
            "CA:TRUE"),
    # a CA that also carries codeSigning: still a CA
    "cacode": (dict(ca=True, usages=(ExtendedKeyUsageOID.CODE_SIGNING,),
                    key_usage=("digital_signature", "key_cert_sign")), "CA:TRUE"),
    # a leaf that may be used for anything (no extended key usage): not a code-signing identity
    "anyuse": (dict(ca=False, usages=(), key_usage=("digital_signature",)),
               "no extended key usage"),
    # codeSigning, but its key usage forbids signatures
    "keyenc": (dict(ca=False, key_usage=("key_encipherment",)), "digitalSignature"),
    # codeSigning without basicConstraints, but its key may sign certificates
    "certsign": (dict(ca=None, key_usage=("digital_signature", "key_cert_sign")),
                 "keyCertSign"),
}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """a, b: key pairs; root -> intermediate -> leaf, an unrelated root2; root -> each of
    ``NOT_FOR_CODE``, and root -> codesign, bare (proper code-signing leaves)."""
    folder = tmp_path_factory.mktemp("keys")
    write_key(folder, "a")
    write_key(folder, "b", ec.SECP384R1())
    write_key(folder, "locked", password=b"s3cret")
    root_key = write_key(folder, "root")
    root = certificate(folder, "root", root_key, None, ca=True)
    mid_key = write_key(folder, "mid")
    mid = certificate(folder, "mid", mid_key, (root, root_key), ca=True)
    leaf_key = write_key(folder, "leaf")
    certificate(folder, "leaf", leaf_key, (mid, mid_key), ca=False)
    other_key = write_key(folder, "root2")
    certificate(folder, "root2", other_key, None, ca=True)
    for name, (kind, _says) in NOT_FOR_CODE.items():
        certificate(folder, name, write_key(folder, name), (root, root_key), **kind)
    # proper code-signing leaves straight under the root: with key usage, and with neither
    # key usage nor basicConstraints (RFC 5280: not a CA)
    certificate(folder, "codesign", write_key(folder, "codesign"), (root, root_key), ca=False,
                key_usage=("digital_signature",))
    certificate(folder, "bare", write_key(folder, "bare"), (root, root_key), ca=None)
    return folder


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> qkan_pack.BuildResult:
    saved = os.environ.pop("QKAN_PACK_SENTINEL", None)
    try:
        return qkan_pack.build(MODELS / "sentinel_model.py", "1x2,4x2",
                               output=tmp_path_factory.mktemp("golden") / "art")
    finally:
        if saved is not None:
            os.environ["QKAN_PACK_SENTINEL"] = saved


@pytest.fixture(scope="module")
def signed(golden: qkan_pack.BuildResult, keys: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The golden artifact signed with key a."""
    from qkan_pack.builder import sign

    target = tmp_path_factory.mktemp("signed") / "art"
    shutil.copytree(golden.path, target)
    result = sign(target, keys / "a.key")
    assert result.digest == golden.digest  # signing changes no byte of the artifact
    return target


def copy(signed: Path, tmp_path: Path) -> Path:
    target = tmp_path / "art"
    shutil.copytree(signed, target, symlinks=True)
    return target


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


# ---------------------------------------------------------------------------
# Round trip
# ---------------------------------------------------------------------------


def test_sign_then_load_with_the_trusted_key(signed: Path, keys: Path, golden: qkan_pack.BuildResult,
                                             sentinel: Path) -> None:
    import torch

    with Predictor.load(signed, trusted_keys=[keys / "b.pub", keys / "a.pub"]) as predictor:
        assert predictor.digest == golden.digest
        assert str(keys / "a.pub") in predictor.signed_by
        assert predictor(torch.zeros(1, 2)).shape == (1, 2)
    assert sentinel.read_text().split()[0] == "import"
    assert sorted(p.name for p in signed.iterdir()) == [
        "manifest.json", SIG, "references", "source", "weights.safetensors"]


def test_without_keys_nothing_changes(signed: Path) -> None:
    """The signature file is known (not an extra file) and, unverified, never trusted."""
    artifact = read_artifact(signed)
    assert artifact.signed_by is None and SIG not in artifact.files
    code, out = invoke("inspect", signed)
    assert code == 0 and "model.sig present, not verified" in out


def test_the_librarys_own_verifier_accepts_what_we_sign(signed: Path, keys: Path) -> None:
    """Interoperability: `model_signing verify` (public API, walks the directory) agrees."""
    signing.verifying.Config().use_elliptic_key_verifier(public_key=keys / "a.pub").verify(
        signed, signed / SIG)


def test_cli_sign_inspect_and_verify(golden: qkan_pack.BuildResult, keys: Path,
                                     tmp_path: Path) -> None:
    art = copy(golden.path, tmp_path)
    code, out = invoke("sign", art, "--key", keys / "b.key")
    assert code == 0, out
    assert out.splitlines()[-1] == f"digest {golden.digest}"
    code, out = invoke("inspect", art, "--key", keys / "b.pub")
    assert code == 0 and "signature  verified, signed by key" in out, out
    code, out = invoke("inspect", "--json", art, "--key", keys / "b.pub")
    assert code == 0 and str(keys / "b.pub") in json.loads(out)["signed_by"]
    code, out = invoke("verify", art, "--key", keys / "b.pub")
    assert code == 0 and "signature verified" in out and out.rstrip().endswith("cpu"), out
    code, out = invoke("verify", art, "--key", keys / "a.pub")
    assert code == 1 and "none of the trusted keys" in out, out


def test_resigning_replaces_the_signature(signed: Path, keys: Path, tmp_path: Path) -> None:
    from qkan_pack.builder import sign

    art = copy(signed, tmp_path)
    sign(art, keys / "b.key")
    assert read_artifact(art, trusted_keys=[keys / "b.pub"]).signed_by
    with pytest.raises(ArtifactSignatureError) as info:
        read_artifact(art, trusted_keys=[keys / "a.pub"])
    assert info.value.problem == "untrusted"


def test_loading_without_keys_does_not_import_model_signing(signed: Path) -> None:
    code = ("import sys; from qkan_pack import Predictor; Predictor.load(sys.argv[1]).close(); "
            "print(sorted(m for m in ('model_signing', 'sigstore', 'OpenSSL') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(signed)], capture_output=True,
                          text=True, cwd=ROOT, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


# ---------------------------------------------------------------------------
# Refusals, all before any artifact code runs
# ---------------------------------------------------------------------------


def flipped(name: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / name).write_bytes(flip(0.6)((root / name).read_bytes()))
    return apply


def flipped_and_rehashed(name: str) -> Callable[[Path], None]:
    """The attacker also rewrites the manifest's size and sha256: integrity checks pass,
    only the signature can tell."""
    def apply(root: Path) -> None:
        flipped(name)(root)
        resign(root, name)
    return apply


def flipped_signature(root: Path) -> None:
    bundle = json.loads((root / SIG).read_text())
    envelope = bundle["dsseEnvelope"]
    raw = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    raw[len(raw) // 2] ^= 0x01
    envelope["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()
    (root / SIG).write_text(json.dumps(bundle))


def edited_payload(root: Path) -> None:
    """A signed digest swapped inside the payload (the signature no longer covers it)."""
    bundle = json.loads((root / SIG).read_text())
    envelope = bundle["dsseEnvelope"]
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["predicate"]["resources"][0]["digest"] = "0" * 64
    envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    (root / SIG).write_text(json.dumps(bundle))


def symlinked_signature(root: Path) -> None:
    outside = root.parent / "outside.sig"
    outside.write_bytes((root / SIG).read_bytes())
    (root / SIG).unlink()
    (root / SIG).symlink_to(outside)


REFUSED: dict[str, tuple[Callable[[Path], None], type[QkanPackError], str]] = {
    # a flipped byte in every file kind
    "weights byte flipped": (flipped(WEIGHTS), ArtifactError, "sha256"),
    "source byte flipped": (flipped(SOURCE), ArtifactError, "sha256"),
    "reference byte flipped": (flipped(REF0), ArtifactError, "sha256"),
    "manifest byte flipped": (flipped("manifest.json"), ArtifactSignatureError, "mismatch"),
    "signature byte flipped": (flipped_signature, ArtifactSignatureError, "invalid"),
    # the same, with the manifest's digests rewritten to match (integrity alone would pass)
    "weights flipped and re-hashed": (flipped_and_rehashed(WEIGHTS), ArtifactSignatureError,
                                      "mismatch"),
    "source flipped and re-hashed": (flipped_and_rehashed(SOURCE), ArtifactSignatureError,
                                     "mismatch"),
    "reference flipped and re-hashed": (flipped_and_rehashed(REF0), ArtifactSignatureError,
                                        "mismatch"),
    # the signature itself
    "signed payload edited": (edited_payload, ArtifactSignatureError, "invalid"),
    "signature deleted": (lambda root: (root / SIG).unlink(), ArtifactSignatureError, "missing"),
    "signature truncated": (lambda root: (root / SIG).write_bytes((root / SIG).read_bytes()[:99]),
                            ArtifactSignatureError, "invalid"),
    "signature empty": (lambda root: (root / SIG).write_bytes(b""), ArtifactSignatureError,
                        "invalid"),
    "signature random bytes": (lambda root: (root / SIG).write_bytes(os.urandom(300)),
                               ArtifactSignatureError, "invalid"),
    "signature is a symlink": (symlinked_signature, ArtifactError, "symlink"),
    "signature is a FIFO": (lambda root: ((root / SIG).unlink(), os.mkfifo(root / SIG)),
                            ArtifactError, "not a regular file"),
    "signature oversized": (lambda root: (root / SIG).write_bytes(b" " * (2 << 20)),
                            QkanPackError, "limit"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_tampered_signed_artifact_is_refused_before_code_runs(signed: Path, keys: Path,
                                                              tmp_path: Path, sentinel: Path,
                                                              case: str) -> None:
    corrupt, error, says = REFUSED[case]
    art = copy(signed, tmp_path)
    corrupt(art)
    with pytest.raises(error) as info:
        Predictor.load(art, trusted_keys=[keys / "a.pub"])
    if isinstance(info.value, ArtifactSignatureError):
        assert info.value.problem == says, info.value
    else:
        assert says in str(info.value), info.value
    assert not sentinel.exists(), f"{case}: artifact code ran: {sentinel.read_text()!r}"


def test_a_signature_by_another_key_is_refused(golden: qkan_pack.BuildResult, keys: Path,
                                               tmp_path: Path, sentinel: Path) -> None:
    """The attacker's artifact, signed with the attacker's own key."""
    from qkan_pack.builder import sign

    art = copy(golden.path, tmp_path)
    (art / SOURCE).write_bytes((art / SOURCE).read_bytes() + b"\n_trace('payload')\n")
    resign(art, SOURCE)
    sign(art, keys / "b.key")
    with pytest.raises(ArtifactSignatureError) as info:
        Predictor.load(art, trusted_keys=[keys / "a.pub"])
    assert info.value.problem == "untrusted" and "not among 1 trusted key" in str(info.value)
    assert not sentinel.exists()


def test_an_unsigned_artifact_is_refused_when_keys_are_given(golden: qkan_pack.BuildResult,
                                                             keys: Path, sentinel: Path) -> None:
    with pytest.raises(ArtifactSignatureError, match="has no signature") as info:
        Predictor.load(golden.path, trusted_keys=[keys / "a.pub"])
    assert info.value.problem == "missing" and not sentinel.exists()


def test_a_resigned_edit_by_a_trusted_key_is_accepted(golden: qkan_pack.BuildResult, keys: Path,
                                                      tmp_path: Path, sentinel: Path) -> None:
    """THE TRUST BOUNDARY: whoever holds a trusted private key can sign anything, and it
    loads and runs. A signature proves who vouched for the files, not that they are safe."""
    from qkan_pack.builder import sign

    art = copy(golden.path, tmp_path)
    (art / SOURCE).write_bytes((art / SOURCE).read_bytes() + b"\n_trace('payload')\n")
    resign(art, SOURCE)
    sign(art, keys / "a.key")
    with Predictor.load(art, trusted_keys=[keys / "a.pub"]) as predictor:
        assert predictor.digest != golden.digest
    assert "payload" in sentinel.read_text().split()


def test_files_added_after_signing_are_refused(signed: Path, keys: Path, tmp_path: Path) -> None:
    art = copy(signed, tmp_path)
    (art / "source" / "sitecustomize.py").write_text("print('x')\n")
    with pytest.raises(ArtifactError, match="does not list"):
        read_artifact(art, trusted_keys=[keys / "a.pub"])


# ---------------------------------------------------------------------------
# Certificate-based signing (offline: a CA made here)
# ---------------------------------------------------------------------------


def test_certificate_chain_round_trip_and_refusals(golden: qkan_pack.BuildResult, keys: Path,
                                                   tmp_path: Path) -> None:
    art = copy(golden.path, tmp_path)
    code, out = invoke("sign", art, "--key", keys / "leaf.key", "--certificate",
                       keys / "leaf.pem", "--chain", keys / "mid.pem")
    assert code == 0, out
    signed_by = read_artifact(art, trusted_keys=[keys / "root.pem"]).signed_by
    assert signed_by == "certificate CN=leaf"
    for trusted, problem in (([keys / "root2.pem"], "untrusted"),  # another CA
                             ([keys / "mid.pem"], "untrusted"),  # no partial chains
                             ([keys / "a.pub"], "untrusted")):  # keys only, no anchors
        with pytest.raises(ArtifactSignatureError) as info:
            read_artifact(art, trusted_keys=trusted)
        assert info.value.problem == problem, (trusted, info.value)


def test_a_key_signed_artifact_is_not_accepted_by_a_certificate(signed: Path, keys: Path) -> None:
    with pytest.raises(ArtifactSignatureError) as info:
        read_artifact(signed, trusted_keys=[keys / "root.pem"])
    assert info.value.problem == "untrusted"


def sign_anyway(art: Path, keys: Path, name: str) -> None:
    """What anyone holding a key under a trusted root can do without qkan-pack's consent:
    sign with model-signing's public API, configured as ``qkan-pack sign`` configures it
    (its own library call), which signs with any certificate whose key may make signatures."""
    hashing = (signing.hashing.Config()
               .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
               .set_ignored_paths(paths=[SIG], ignore_git_paths=False))
    config = signing.signing.Config().set_hashing_config(hashing)
    config.use_certificate_signer(private_key=keys / f"{name}.key",
                                  signing_certificate=keys / f"{name}.pem",
                                  certificate_chain=[keys / "root.pem"])
    config.sign(art, art / SIG)


@pytest.mark.parametrize("name", sorted(NOT_FOR_CODE))
def test_a_certificate_that_may_not_sign_code_is_refused_at_load(
        golden: qkan_pack.BuildResult, keys: Path, tmp_path: Path, sentinel: Path,
        name: str) -> None:
    """A TLS server certificate, an intermediate CA's own key, a leaf for any use... issued
    under a trusted root: none of them is a code-signing identity (model-signing alone
    accepts any certificate whose key usage allows digitalSignature)."""
    art = copy(golden.path, tmp_path)
    sign_anyway(art, keys, name)
    with pytest.raises(ArtifactSignatureError) as info:
        Predictor.load(art, trusted_keys=[keys / "root.pem"])
    message = str(info.value)
    assert info.value.problem == "certificate use", message
    assert f"CN={name}" in message and NOT_FOR_CODE[name][1] in message, message
    assert "codeSigning" in message and "CA:FALSE" in message, message  # how to issue one
    assert not sentinel.exists(), f"artifact code ran: {sentinel.read_text()!r}"
    code, out = invoke("verify", art, "--key", keys / "root.pem")
    assert code == 1 and out.count("\n") == 1 and "unexpected" not in out, out


@pytest.mark.parametrize("name", sorted(NOT_FOR_CODE))
def test_sign_refuses_a_certificate_that_may_not_sign_code(golden: qkan_pack.BuildResult,
                                                           keys: Path, tmp_path: Path,
                                                           name: str) -> None:
    art = copy(golden.path, tmp_path)
    before = {p: p.read_bytes() for p in art.rglob("*") if p.is_file()}
    code, out = invoke("sign", art, "--key", keys / f"{name}.key", "--certificate",
                       keys / f"{name}.pem", "--chain", keys / "root.pem")
    assert code == 1 and out.count("\n") == 1 and "unexpected" not in out, out
    assert NOT_FOR_CODE[name][1] in out and "codeSigning" in out, out
    assert out.count("cannot be signed") == 1, out  # said once, not wrapped in itself
    assert {p: p.read_bytes() for p in art.rglob("*") if p.is_file()} == before


def test_a_certificate_without_chain_is_one_plain_error(golden: qkan_pack.BuildResult,
                                                        keys: Path, tmp_path: Path) -> None:
    """Before: the "give --chain" error was raised inside the block that wraps the library's
    errors, and came out wrapped in itself ("cannot be signed: leaf.key: artifact ...")."""
    art = copy(golden.path, tmp_path)
    code, out = invoke("sign", art, "--key", keys / "leaf.key", "--certificate", keys / "leaf.pem")
    assert code == 1 and out.count("\n") == 1 and "--chain" in out, out
    assert out.count("cannot be signed") == 1 and out.count("refusing it") == 1, out


@pytest.mark.parametrize("name", ["codesign", "bare"])
def test_a_code_signing_leaf_straight_under_the_root_is_accepted(
        golden: qkan_pack.BuildResult, keys: Path, tmp_path: Path, name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """``bare`` has neither key usage nor basicConstraints: RFC 5280 reads that as "not a
    CA, any key usage", and codeSigning is there (model-signing's warning that it lacks
    keyUsage is not passed on: the code-signing check decided)."""
    art = copy(golden.path, tmp_path)
    code, out = invoke("sign", art, "--key", keys / f"{name}.key", "--certificate",
                       keys / f"{name}.pem", "--chain", keys / "root.pem")
    assert code == 0, out
    assert read_artifact(art, trusted_keys=[keys / "root.pem"]).signed_by == f"certificate CN={name}"
    assert [r.getMessage() for r in caplog.records if r.name.startswith("model_signing")] == []


# ---------------------------------------------------------------------------
# Malformed bundles and the unsigned key hint
# ---------------------------------------------------------------------------


def edit_bundle(root: Path, change: Callable[[dict], Any]) -> None:
    """Edit the real signature's JSON in place; a ``change`` returning a list replaces the
    whole bundle with that list (anything else it returns is ignored)."""
    bundle = json.loads((root / SIG).read_text())
    replaced = change(bundle)
    (root / SIG).write_text(json.dumps(replaced if isinstance(replaced, list) else bundle))


def envelope(bundle: dict) -> dict:
    return bundle["dsseEnvelope"]


def material(bundle: dict) -> dict:
    return bundle["verificationMaterial"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def signed_payload(keys: Path, payload: bytes) -> Callable[[dict], None]:
    """A payload the trusted key a really signed, that is no model-signing statement: only
    a key holder can make one, and it must still be a clean refusal."""
    from model_signing._signing.sign_sigstore_pb import pae

    key = serialization.load_pem_private_key((keys / "a.key").read_bytes(), None)

    def apply(bundle: dict) -> None:
        envelope(bundle)["payload"] = b64(payload)
        envelope(bundle)["signatures"] = [
            {"sig": b64(key.sign(pae(payload), ec.ECDSA(hashes.SHA256()))), "keyid": ""}]
    return apply


def statement(**changes: Any) -> bytes:
    base = {"_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": "art", "digest": {"sha256": "0" * 64}}],
            "predicateType": "https://model_signing/signature/v1.0",
            "predicate": {"serialization": {"method": "files", "hash_type": "sha256",
                                            "allow_symlinks": False, "ignore_paths": []},
                          "resources": []}}
    base.update(changes)
    return json.dumps(base).encode()


KEY_BUNDLE_EDITS: dict[str, Callable[[dict], Any]] = {
    "no signatures": lambda b: envelope(b).update(signatures=[]),
    "two signatures": lambda b: envelope(b).update(signatures=envelope(b)["signatures"] * 2),
    "signature without sig": lambda b: envelope(b).update(signatures=[{"keyid": ""}]),
    "signature is a number": lambda b: envelope(b).update(signatures=[5]),
    "sig not base64": lambda b: envelope(b)["signatures"][0].update(sig="!!!"),
    "sig empty": lambda b: envelope(b)["signatures"][0].update(sig=""),
    "payload not base64": lambda b: envelope(b).update(payload="@@@"),
    "payload type": lambda b: envelope(b).update(payloadType="application/json"),
    "media type": lambda b: b.update(mediaType="application/x-other"),
    "no envelope": lambda b: b.pop("dsseEnvelope"),
    "no verification material": lambda b: b.pop("verificationMaterial"),
    "empty verification material": lambda b: b.update(verificationMaterial={}),
    "public key is a number": lambda b: material(b).update(publicKey=5),
    "hint is a number": lambda b: material(b)["publicKey"].update(hint=5),
    "a list": lambda b: [b],
    "an empty list": lambda b: [],
}

SIGNED_PAYLOADS: dict[str, bytes] = {
    "not JSON": b"{not json",
    "a list": b"[]",
    "null": b"null",
    "no _type": statement(_type=None),
    "other predicate": statement(predicateType="https://example.com/other"),
    "no subject": statement(subject=[]),
    "subject a number": statement(subject=5),
    "resources a string": statement(predicate={"serialization": {"method": "files"},
                                               "resources": "x"}),
    "digest not hex": statement(predicate={
        "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                          "ignore_paths": []},
        "resources": [{"name": "a", "algorithm": "sha256", "digest": "zz"}]}),
}

CERTIFICATE_BUNDLE_EDITS: dict[str, Callable[[dict], Any]] = {
    "empty chain": lambda b: material(b)["x509CertificateChain"].update(certificates=[]),
    "chain without certificates": lambda b: material(b).update(x509CertificateChain={}),
    "leaf not DER": lambda b: material(b)["x509CertificateChain"]["certificates"][0].update(
        rawBytes=b64(b"not a certificate")),
    "leaf without bytes": lambda b: material(b)["x509CertificateChain"].update(
        certificates=[{}]),
    "intermediate not DER": lambda b: material(b)["x509CertificateChain"]["certificates"][1]
    .update(rawBytes=b64(b"junk")),
    "no signatures": KEY_BUNDLE_EDITS["no signatures"],
    "sig empty": KEY_BUNDLE_EDITS["sig empty"],
}


@pytest.fixture(scope="module")
def certificate_signed(golden: qkan_pack.BuildResult, keys: Path,
                       tmp_path_factory: pytest.TempPathFactory) -> Path:
    from qkan_pack.builder import sign

    target = tmp_path_factory.mktemp("cert-signed") / "art"
    shutil.copytree(golden.path, target)
    sign(target, keys / "leaf.key", certificate=keys / "leaf.pem", chain=[keys / "mid.pem"])
    return target


def malformed_cases() -> list[tuple[str, str]]:
    return ([("key", name) for name in KEY_BUNDLE_EDITS]
            + [("signed payload", name) for name in SIGNED_PAYLOADS]
            + [("certificate", name) for name in CERTIFICATE_BUNDLE_EDITS])


@pytest.mark.parametrize(("kind", "case"), malformed_cases())
def test_every_malformed_bundle_is_a_signature_error(
        signed: Path, certificate_signed: Path, keys: Path, tmp_path: Path, sentinel: Path,
        capfd: pytest.CaptureFixture[str], kind: str, case: str) -> None:
    """Never a raw IndexError/KeyError/TypeError (the CLI's "unexpected ..."), never a word
    on stdout, never any artifact code run."""
    if kind == "certificate":
        art, trusted = copy(certificate_signed, tmp_path), [keys / "root.pem"]
        edit_bundle(art, CERTIFICATE_BUNDLE_EDITS[case])
    else:
        art, trusted = copy(signed, tmp_path), [keys / "b.pub", keys / "a.pub"]
        edit_bundle(art, KEY_BUNDLE_EDITS[case] if kind == "key"
                    else signed_payload(keys, SIGNED_PAYLOADS[case]))
    with pytest.raises(ArtifactSignatureError) as info:
        Predictor.load(art, trusted_keys=trusted)
    assert info.value.problem == "invalid", info.value
    assert not sentinel.exists()
    code, out = invoke("inspect", art, *[arg for key in trusted for arg in ("--key", key)])
    assert code == 1 and out.count("\n") == 1, out
    assert out.startswith("Error: ") and "unexpected" not in out, out
    assert capfd.readouterr().out == ""


def key_hash(keys: Path, name: str) -> str:
    import hashlib

    return hashlib.sha256((keys / f"{name}.pub").read_bytes()).hexdigest()


HINTS: dict[str, Callable[[Path], Any]] = {
    "removed": lambda keys: ...,
    "null": lambda keys: None,
    "empty": lambda keys: "",
    "another trusted key's": lambda keys: key_hash(keys, "b"),
    "garbage": lambda keys: "zz" * 32,
}


def set_hint(art: Path, keys: Path, hint: str) -> None:
    value = HINTS[hint](keys)
    if value is ...:
        edit_bundle(art, lambda b: material(b)["publicKey"].pop("hint"))
    else:
        edit_bundle(art, lambda b: material(b)["publicKey"].update(hint=value))


@pytest.mark.parametrize("order", ["a b", "b a"])
@pytest.mark.parametrize("hint", sorted(HINTS))
def test_the_unsigned_key_hint_and_the_key_order_never_decide(
        signed: Path, keys: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str],
        hint: str, order: str) -> None:
    """The hint is not covered by the signature: whatever it says, a signature by a trusted
    key verifies, whichever order the keys are given in, and nothing is printed."""
    art = copy(signed, tmp_path)
    set_hint(art, keys, hint)
    artifact = read_artifact(art, trusted_keys=[keys / f"{n}.pub" for n in order.split()])
    assert artifact.signed_by is not None and str(keys / "a.pub") in artifact.signed_by
    assert capfd.readouterr().out == ""


@pytest.mark.parametrize("hint", sorted(HINTS))
def test_no_trusted_key_verifying_is_untrusted_or_invalid_never_by_order(
        golden: qkan_pack.BuildResult, keys: Path, tmp_path: Path, hint: str) -> None:
    """Signed by b, trusted a (and locked): "invalid" only when the hint claims a trusted key
    (the signature says it is that key's and is not), else "untrusted"; in either order."""
    from qkan_pack.builder import sign

    art = copy(golden.path, tmp_path)
    sign(art, keys / "b.key")
    set_hint(art, keys, hint)
    for order in (["a", "locked"], ["locked", "a"]):
        with pytest.raises(ArtifactSignatureError) as info:
            read_artifact(art, trusted_keys=[keys / f"{n}.pub" for n in order])
        assert info.value.problem == "untrusted", (order, info.value)
    a_hash = key_hash(keys, "a")
    edit_bundle(art, lambda b: material(b)["publicKey"].update(hint=a_hash))
    for order in (["a", "locked"], ["locked", "a"]):
        with pytest.raises(ArtifactSignatureError) as info:
            read_artifact(art, trusted_keys=[keys / f"{n}.pub" for n in order])
        assert info.value.problem == "invalid", (order, info.value)


def test_inspect_json_prints_only_json_for_a_signature_without_hint(signed: Path, keys: Path,
                                                                    tmp_path: Path) -> None:
    """Through the real command in a fresh process: model-signing prints a WARNING to
    stdout for a bundle without key hint (which broke `inspect --json`)."""
    art = copy(signed, tmp_path)
    set_hint(art, keys, "removed")
    done = subprocess.run([sys.executable, "-m", "qkan_pack", "inspect", "--json", str(art),
                           "--key", str(keys / "b.pub"), "--key", str(keys / "a.pub")],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert str(keys / "a.pub") in json.loads(done.stdout)["signed_by"], done.stdout


# ---------------------------------------------------------------------------
# Keys and options
# ---------------------------------------------------------------------------


def test_signing_refuses_bad_keys_and_damaged_artifacts(golden: qkan_pack.BuildResult,
                                                        keys: Path, tmp_path: Path) -> None:
    from qkan_pack.builder import sign

    art = copy(golden.path, tmp_path)
    before = {p: p.read_bytes() for p in art.rglob("*") if p.is_file()}
    for key, says in ((keys / "a.pub", "a.pub"), (keys / "locked.key", "(?i)password"),
                      (keys / "root.pem", "root.pem")):
        with pytest.raises(ArtifactSignatureError, match=says) as info:
            sign(art, key)
        assert info.value.problem == "signing key"
    (art / WEIGHTS).write_bytes(flip(0.5)((art / WEIGHTS).read_bytes()))
    with pytest.raises(ArtifactError, match="sha256"):
        sign(art, keys / "a.key")
    before[art / WEIGHTS] = (art / WEIGHTS).read_bytes()
    assert {p: p.read_bytes() for p in art.rglob("*") if p.is_file()} == before


def test_an_encrypted_key_signs_with_its_password(golden: qkan_pack.BuildResult, keys: Path,
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    art = copy(golden.path, tmp_path)
    monkeypatch.setenv("QKAN_PACK_KEY_PASSWORD", "s3cret")
    code, out = invoke("sign", art, "--key", keys / "locked.key", "--password-env",
                       "QKAN_PACK_KEY_PASSWORD")
    assert code == 0, out
    assert read_artifact(art, trusted_keys=[keys / "locked.pub"]).signed_by


def test_trusted_keys_that_are_not_keys_are_option_errors(signed: Path, keys: Path,
                                                          tmp_path: Path) -> None:
    from qkan_pack import LoadOptionError

    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    for bad in (junk, keys / "a.key"):
        with pytest.raises(LoadOptionError, match="trusted_keys"):
            Predictor.load("/no/such/artifact", trusted_keys=[bad])


def _refused_promptly(call: Callable[[], Any], fifo: Path | None, seconds: float = 20.0) -> str:
    """What ``call`` refused with, run in a thread; a call still reading after ``seconds``
    (waiting on a FIFO, reading /dev/zero) fails the test (a writer releases the FIFO)."""
    import threading

    outcome: list[BaseException] = []
    thread = threading.Thread(target=lambda: _into(outcome, call), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
        pytest.fail(f"reading the key file was still going after {seconds} s")
    assert outcome, "the key file was accepted"
    return str(outcome[0])


def _into(outcome: list[BaseException], call: Callable[[], Any]) -> None:
    try:
        call()
    except BaseException as exc:  # handed back to the test thread
        outcome.append(exc)


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_trusted_key_that_is_a_fifo_or_a_device_is_refused_promptly(
        signed: Path, tmp_path: Path, kind: str) -> None:
    """``inspect --key`` on a FIFO blocked and on /dev/zero read gigabytes (verify and load
    checked the path was a file): every key file is read as every supplied file is, a
    regular file opened without blocking and read up to a bound."""
    from qkan_pack import LoadOptionError

    if kind == "fifo":
        key = tmp_path / "key.pub"
        os.mkfifo(key)
    else:
        key = Path(kind)
    fifo = key if kind == "fifo" else None

    def inspect_key() -> None:
        code, out = invoke("inspect", signed, "--key", key)
        raise AssertionError(f"exit {code}: {out}")

    said = _refused_promptly(inspect_key, fifo)
    assert "exit 1" in said and "is not a regular file" in said, said
    said = _refused_promptly(lambda: read_artifact(signed, trusted_keys=[key]), fifo)
    assert "trusted_keys" in said and "is not a regular file" in said, said
    with pytest.raises(LoadOptionError, match="trusted_keys"):
        Predictor.load(signed, trusted_keys=[key])


def test_an_oversized_trusted_key_file_is_refused_unread(signed: Path, tmp_path: Path) -> None:
    from qkan_pack import LoadOptionError
    from qkan_pack.runtime._signature import MAX_KEY_FILE_BYTES

    key = tmp_path / "huge.pem"
    key.write_bytes(b"#" * (MAX_KEY_FILE_BYTES + 1))
    with pytest.raises(LoadOptionError, match="is larger than"):
        read_artifact(signed, trusted_keys=[key])


def test_keys_without_the_extra_are_a_clear_error(signed: Path, keys: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "model_signing" or n.startswith("model_signing.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "model_signing", None)  # import fails as if absent
    with pytest.raises(ArtifactSignatureError, match=r"pip install 'qkan-pack\[sign\]'") as info:
        read_artifact(signed, trusted_keys=[keys / "a.pub"])
    assert info.value.problem == "unavailable"


def test_signing_and_verifying_figures(signed: Path, keys: Path, tmp_path: Path,
                                       golden: qkan_pack.BuildResult) -> None:
    """Figures for SECURITY.md (printed; speed is proved by benchmarks, not asserted)."""
    from qkan_pack.builder import sign

    art = copy(golden.path, tmp_path)
    started = time.perf_counter()
    sign(art, keys / "a.key")
    signed_s = time.perf_counter() - started
    started = time.perf_counter()
    read_artifact(art, trusted_keys=[keys / "a.pub"])
    with_keys = time.perf_counter() - started
    started = time.perf_counter()
    read_artifact(art)
    without = time.perf_counter() - started
    size = sum(p.stat().st_size for p in art.rglob("*") if p.is_file())
    print(f"signing figures: {size} bytes, sign {signed_s * 1e3:.1f} ms, read+verify "
          f"{with_keys * 1e3:.1f} ms, read without keys {without * 1e3:.1f} ms")
