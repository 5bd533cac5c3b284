"""The model-signing seam: the private names it relies on exist in the pinned release, and
another release is refused with the supported one named."""

from __future__ import annotations

import datetime as dt
from importlib import metadata
from pathlib import Path

import pytest

from qkan_pack import ArtifactSignatureError
from qkan_pack.runtime._signing_compat import (
    SUPPORTED,
    PemFile,
    signing_modules,
    unsupported_release,
)

pytest.importorskip("model_signing")


def test_the_private_names_relied_on_exist() -> None:
    assert unsupported_release() is None, metadata.version("model-signing")
    modules = signing_modules("test", "/a", lambda record: True)
    assert callable(modules.ec.Verifier) and callable(modules.certificate.Verifier)
    assert hasattr(modules.ec.Verifier, "verify") and hasattr(modules.certificate.Verifier, "verify")
    assert callable(modules.pb.Signature) and callable(modules.bundle.Bundle.from_dict)
    assert issubclass(modules.invalid, Exception) and issubclass(modules.chain_error, Exception)


def test_another_release_is_refused_naming_the_supported_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version",
                        lambda name: "1.2.0" if name == "model-signing" else real(name))
    with pytest.raises(ArtifactSignatureError) as info:
        signing_modules("signature", "/artifact", lambda record: True)
    assert info.value.problem == "unavailable"
    assert f"model-signing 1.2.0 is outside the supported range {SUPPORTED};" in str(info.value)
    assert "supported range 1.1.1; qkan-pack verifies signatures with internals" in str(info.value)
    assert "pip install 'qkan-pack[sign]'" in str(info.value)


def test_the_verifiers_take_key_bytes_read_once() -> None:
    """The verifiers read their keys with ``read_bytes()``: given a ``PemFile`` they use the
    bytes read (through the bounded reader), and never open the path again."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    modules = signing_modules("test", "/a", lambda record: True)
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    gone = Path("/nonexistent/qkan-pack-key.pem")
    modules.ec.Verifier(PemFile(gone, public))
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "root")])
    now = dt.datetime.now(dt.timezone.utc)
    root = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    modules.certificate.Verifier([PemFile(gone, root.public_bytes(serialization.Encoding.PEM))])
    assert str(PemFile(gone, b"")) == str(gone)
