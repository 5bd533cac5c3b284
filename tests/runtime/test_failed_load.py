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
