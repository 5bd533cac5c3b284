"""Fixtures and helpers shared by the runtime tests."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch


@pytest.fixture
def sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Arm the sentinel model's trace (``tests/models/sentinel_model.py``), and forget cached
    imports so a load would execute the source again: a refused artifact leaves no file."""
    path = tmp_path / "sentinel.log"
    monkeypatch.setenv("QKAN_PACK_SENTINEL", str(path))
    for name in [n for n in sys.modules if n.startswith("qkan_pack_model_")]:
        monkeypatch.delitem(sys.modules, name)
    return path


def outcome(call: Callable[[], Any]) -> Any:
    """A call's outcome as comparable data: ("answered", the result ``described``) or
    ("refused", the error's class, its text)."""
    try:
        result = call()
    except Exception as exc:
        return ("refused", type(exc), str(exc))
    return ("answered", described(result))


def described(result: Any) -> Any:
    """A result as comparable data: containers as themselves, a dict's keys in order, leaves
    as (kind, dtype, device, shape, bytes); no leaf may require grad."""
    if isinstance(result, dict):
        return ("dict", [(key, described(value)) for key, value in result.items()])
    if isinstance(result, (tuple, list)):
        return (type(result).__name__, [described(value) for value in result])
    if isinstance(result, np.ndarray):
        return ("numpy", str(result.dtype), result.shape, result.tobytes())
    assert type(result) is torch.Tensor, type(result)
    assert not result.requires_grad
    return ("tensor", result.dtype, result.device, tuple(result.shape),
            result.detach().contiguous().view(torch.uint8).tolist())


def both_paths(predictor: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(the call as users make it, the general path on the same values: checked, not
    remembered)."""
    fast = outcome(lambda: predictor(*args, **kwargs))
    general = outcome(lambda: predictor._first_call(None, args, kwargs))
    return fast, general
