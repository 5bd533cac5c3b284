"""Files a build is given (``--reference-inputs``, ``--calibration``, ``--weights``) and
``predict --input`` files are read through the one reader of supplied files
(``runtime.read_regular_file`` / ``open_regular_file``): a FIFO is refused without waiting
for a writer, a device without reading it, and the regular formats still read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qkan_pack import InputFileError, WeightsMismatchError, build
from qkan_pack.predict import read_inputs
from qkan_pack.runtime import read_artifact, rebuild_model

from ..conftest import MODELS

MLP = MODELS / "plain_mlp.py"


#: Opens a FIFO for writing, again and again, after a delay: a reader still waiting on it
#: then sees an empty file and goes on (and one that opens it again is let go again).
_UNBLOCK = """
import os, sys, time
time.sleep(float(sys.argv[2]))
while True:
    try:
        os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader now
        pass
    time.sleep(0.05)
"""


def _refused_without_waiting(call: Callable[[], Any], fifo: Path | None = None,
                             seconds: float = 60) -> Exception:
    """What ``call`` raises. Where it reads ``fifo``, a process lets a reader that waits on it
    go after ``seconds``, and having waited that long fails the test instead of hanging it (a
    thread could not: safetensors opens a file holding the GIL)."""
    helper = None if fifo is None else subprocess.Popen(
        [sys.executable, "-c", _UNBLOCK, str(fifo), str(seconds)], stderr=subprocess.DEVNULL)
    start = time.monotonic()
    try:
        with pytest.raises(Exception) as caught:
            call()
    finally:
        if helper is not None:
            helper.kill()
            helper.wait()
    assert time.monotonic() - start < seconds, f"{fifo} was waited on"
    return caught.value


def _fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _zero(tmp_path: Path, name: str) -> Path:
    """A link named like a weights or arrays file to ``/dev/zero``, which never ends."""
    path = tmp_path / name
    path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize("name", ["ref.npz", "ref.npy", "ref.safetensors"])
def test_reference_inputs_that_are_a_fifo_or_a_device_are_refused(tmp_path: Path,
                                                                  name: str) -> None:
    """A FIFO-backed .npz or .safetensors hung build (the audit's timeout: 60 s)."""
    for path in (_fifo(tmp_path, name), _zero(tmp_path, "zero" + name)):
        error = _refused_without_waiting(lambda p=path: build(  # type: ignore[misc]
            MLP, "2x2", output=tmp_path / "a", reference_inputs=p, progress=False), path)
        assert isinstance(error, InputFileError), error
        assert "is not a regular file (a FIFO, device or directory)" in str(error)
        assert error.path == f"--reference-inputs {path}"
        assert not (tmp_path / "a").exists()


def test_calibration_inputs_that_are_a_fifo_are_refused(tmp_path: Path) -> None:
    path = _fifo(tmp_path, "calibration.npz")
    error = _refused_without_waiting(lambda: build(
        MLP, "2x2", output=tmp_path / "a", precision="bf16", calibration=path,
        progress=False), path)
    assert isinstance(error, InputFileError), error
    assert error.path == f"--calibration {path}" and "not a regular file" in str(error)


@pytest.mark.parametrize("name", ["w.pt", "w.safetensors"])
def test_weights_that_are_a_fifo_or_a_device_are_refused(tmp_path: Path, name: str) -> None:
    """`--weights` a FIFO hung build; `/dev/zero` as .pt read until the process was killed."""
    for path in (_fifo(tmp_path, name), _zero(tmp_path, "zero" + name)):
        error = _refused_without_waiting(lambda p=path: build(  # type: ignore[misc]
            MLP, "2x2", output=tmp_path / "a", weights=p, progress=False), path)
        assert isinstance(error, WeightsMismatchError), error
        assert str(error) == (f"weights from {path}: is not a regular file (a FIFO, device or "
                              "directory): refused without reading it")
        assert not (tmp_path / "a").exists()


def _state(path: Path) -> dict[str, torch.Tensor]:
    artifact = read_artifact(path)
    return rebuild_model(artifact, torch.device("cpu"),
                         dict(artifact.manifest.model.config)).state_dict()


def test_weights_stream_from_the_checked_file_in_both_formats(tmp_path: Path) -> None:
    """A checkpoint is read by torch.load from the descriptor that was checked, a
    safetensors file as bytes: both still build (a checkpoint under "state_dict" too)."""
    from safetensors.torch import save_file

    base = build(MLP, "2x2", output=tmp_path / "base", progress=False).path
    state = {k: torch.full_like(v, 0.25) for k, v in _state(base).items()}
    save_file(state, tmp_path / "w.safetensors")
    torch.save({"state_dict": state}, tmp_path / "w.pt")
    for name in ("w.safetensors", "w.pt"):
        path = build(MLP, "2x2", output=tmp_path / name.replace(".", "_"),
                     weights=tmp_path / name, progress=False).path
        got = _state(path)
        assert all(torch.equal(got[k], state[k]) for k in state), name


def test_predict_input_files_that_are_a_fifo_or_a_device_are_refused(tmp_path: Path) -> None:
    """The CLI checked `is_file()` first; the reader itself (read_inputs) opened the path
    again, so a FIFO swapped in, or the Python API, waited forever."""
    for name in ("x.npy", "x.json", "x.safetensors"):
        for path in (_fifo(tmp_path, name), _zero(tmp_path, "zero" + name)):
            error = _refused_without_waiting(
                lambda p=path: read_inputs([(None, p)], ["x"], {"x": "float32"}), path)
            assert isinstance(error, InputFileError), error
            assert error.path == f"--input {path}" and "not a regular file" in str(error)
    np.save(tmp_path / "ok.npy", np.ones((2, 2), np.float32))
    assert read_inputs([(None, tmp_path / "ok.npy")], ["x"], {"x": "float32"})["x"].shape == (2, 2)
