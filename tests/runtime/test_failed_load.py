"""A failed load lets go of what it built, even while the caller keeps the error.

The error's traceback reaches the load's frames, whose locals are the model, its weights
(on a GPU), sample inputs and captured graphs with their pools: an error kept for logging
or re-raising must not pin them (the GPU figures are in ``test_gpu_faults.py``).
"""

from __future__ import annotations

import gc
import sys
import traceback
from pathlib import Path

import pytest

from qkan_pack import ModelSourceError, Predictor, SelfTestError, build

from ..conftest import MODELS
from .test_tamper import REF0, resign

PROBE = "_qkan_pack_model_probe"


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An artifact whose first reference output was edited and re-hashed: the load builds the
    model, then the reference self-test refuses it."""
    path = build(MODELS / "probe_model.py", "1x4,8x4",
                 output=tmp_path_factory.mktemp("refused") / "art").path
    data = bytearray((path / REF0).read_bytes())
    data[-1] ^= 0x40
    (path / REF0).write_bytes(bytes(data))
    resign(path, REF0)
    return path


def _built_models() -> list:
    return sys.modules[PROBE].models if PROBE in sys.modules else []


def test_a_kept_error_does_not_keep_the_model(refused: Path) -> None:
    before = len(_built_models())
    with pytest.raises(SelfTestError) as caught:
        Predictor.load(refused)
    kept = caught.value  # as a caller that logs or re-raises it later would
    gc.collect()
    built = _built_models()[before:]
    assert len(built) == 1 and built[0]() is None, "the failed load's model is still alive"
    printed = "".join(traceback.format_exception(kept))
    assert "SelfTestError" in printed and "_load.py" in printed  # tracebacks still print


def test_errors_chained_behind_a_cause_are_cleared_too(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Model code whose failure is only the ``__context__`` of an error raised ``from``
    another (as when torch's ``capture_end`` fails in ``__exit__``), reached through frames
    of closures over the model (a frame keeps its function, and so the closure's cells,
    even once cleared). Measured on an H200: a capture failure kept the whole model
    allocated (100,700,160 bytes: the wide test model's parameters)."""
    path = build(MODELS / "probe_model.py", "1x4", output=tmp_path / "art").path
    monkeypatch.setenv("QKAN_PACK_PROBE_FAIL", "1")
    before = len(_built_models())
    with pytest.raises(ModelSourceError) as caught:
        Predictor.load(path)
    kept = caught.value  # noqa: F841 - kept, as a caller would
    gc.collect()
    built = _built_models()[before:]
    assert len(built) == 1 and built[0]() is None, "a context behind a cause pins the model"


def test_the_error_being_handled_by_the_caller_is_left_alone(refused: Path) -> None:
    def callers_frame() -> None:
        kept_by_the_caller = [1, 2, 3]  # noqa: F841 - what clearing must not touch
        raise KeyError("the caller's own error")

    try:
        callers_frame()
    except KeyError as outer:
        with pytest.raises(SelfTestError) as caught:
            Predictor.load(refused)
        assert caught.value.__context__ is outer
        frame = outer.__traceback__.tb_next.tb_frame
        assert frame.f_locals.get("kept_by_the_caller") == [1, 2, 3]


def test_a_model_source_that_fails_to_import_leaves_none_of_its_includes_behind() -> None:
    """Audit: only the model's own module left ``sys.modules`` on failure; the includes it had
    imported stayed there, re-homed under its name, with everything they held."""
    from qkan_pack.runtime import content_name, import_model_source

    sources = {"m/model.py": b"import helper_for_failed_import\nraise RuntimeError('fails')\n",
               "m/helper_for_failed_import.py": b"HELD = bytearray(1000)\n"}
    with pytest.raises(ModelSourceError, match="fails"):
        import_model_source("m/model.py", sources)
    name = content_name(sources)
    assert [n for n in sys.modules if n == name or n.startswith(name + ".")] == []
    assert "helper_for_failed_import" not in sys.modules


def test_model_source_errors_carry_their_stage_and_file(tmp_path: Path) -> None:
    """Audit: syntax errors, a missing or wrong factory and a failing call on the CPU raised
    ``ModelSourceError`` with ``path`` (and ``stage``) unset, or named the file "model"."""
    import torch

    from qkan_pack.runtime import call_factory, entry_function, import_model_source

    with pytest.raises(ModelSourceError) as syntax:
        import_model_source("m/bad.py", {"m/bad.py": b"def broken(:\n"})
    assert (syntax.value.stage, syntax.value.path) == ("import", "m/bad.py")
    module = import_model_source("m/none.py", {"m/none.py": b"VALUE = 1\n"})
    with pytest.raises(ModelSourceError) as missing:
        entry_function(module, "build_model", "m/none.py")
    assert missing.value.path == "m/none.py"
    with pytest.raises(ModelSourceError) as wrong:
        call_factory(lambda: 3, {}, "m/none.py", "build_model", None)
    assert (wrong.value.stage, wrong.value.path) == ("factory", "m/none.py")

    source = tmp_path / "embed.py"
    source.write_text("import torch\n\n\ndef build_model():\n"
                      "    return torch.nn.Embedding(10, 4)\n")
    artifact = build(source, "1x3", output=tmp_path / "a", dtype="int64",
                     input_range=(0, 10)).path
    with Predictor.load(artifact, "cpu", progress=False) as predictor, \
            pytest.raises(ModelSourceError) as call:
        predictor(torch.tensor([[1, 2, 99]]))
    assert (call.value.stage, call.value.path) == ("call", predictor.manifest.model.source)
