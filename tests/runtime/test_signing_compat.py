"""The model-signing seam: the private names it relies on exist in the pinned release, and
another release is refused with the supported one named."""

from __future__ import annotations

from importlib import metadata

import pytest

from qkan_pack import ArtifactSignatureError
from qkan_pack.runtime._signing_compat import SUPPORTED, signing_modules, unsupported_release

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
    assert "model-signing 1.2.0 is installed" in str(info.value)
    assert f"internals of {SUPPORTED};" in str(info.value) and "internals of 1.1.1;" in \
        str(info.value)
    assert "pip install 'qkan-pack[sign]'" in str(info.value)
