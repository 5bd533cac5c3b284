"""The model in float64: how far its float32 outputs are from float64's (the rounding noise
every self-test and proof is measured against), and float64 runs the row proof compares.

A float64 copy is the model's parameters and buffers widened, bound like its forward. It is
float64 throughout only where the model's code keeps it so: a model that builds a
``complex64`` tensor or calls ``.float()`` computes part of its arithmetic in float32 even
then (``float64_throughout`` tells), and its float64 runs agree across batch sizes only to
float32's rounding.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._calling import bind_forward
from ._progress import progress_bar
from ._selftest import deviation
from ._tree import flatten

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["float64_forward", "float64_noise", "float64_outputs", "float64_throughout"]


def float64_noise(model: torch.nn.Module, names: Sequence[str], call: str,
                  samples: Sequence[Sequence[torch.Tensor]],
                  outputs: Sequence[Sequence[torch.Tensor]], *,
                  progress: bool | None = False) -> list[float | None]:
    """Per sample: how far ``outputs`` (the model's float32 outputs on it, flat) are from a
    float64 copy of the model on the same inputs, as a share of each output's scale
    (``compare``'s ``max_rel``), rounded to two digits. None where that cannot be measured:
    the copy or its forward fails (an op without float64, float32 state outside parameters
    and buffers), a floating output is computed in float32 even there (a constant float32
    output, the same in both runs, is skipped), none is left to compare, a non-float output
    differs, or the copy narrows to float32 somewhere (``_Narrowing``) and agrees exactly
    (``x.float()`` first in forward: both runs are float32). The copy is freed before
    returning; ``progress`` as ``progress_bar``'s."""
    forward = float64_forward(model, names, call)
    if forward is None:
        return [None] * len(samples)
    noises: list[float | None] = []
    try:
        for inputs, narrow in progress_bar(zip(samples, outputs, strict=True),
                                           desc="reference noise (float64)",
                                           total=len(samples), enabled=progress):
            wide, narrowed = _watched_outputs(forward, inputs, widen=False)
            noise = None if wide is None else deviation(narrow, wide)
            if noise == 0 and narrowed:
                noise = None  # float32 throughout where it matters: nothing was measured
            noises.append(None if noise is None else float(f"{noise:.2g}"))
    finally:
        del forward
    return noises


def float64_forward(model: torch.nn.Module, names: Sequence[str],
                    call: str) -> Callable[..., Any] | None:
    """A float64 copy of ``model``, bound like its forward; None when it cannot be made."""
    try:
        # eval() again after the cast: modules that fold weights into eval-time caches
        # (QKAN) rebuild them from the float64 parameters
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wide = copy.deepcopy(model).double().train(model.training)
    except Exception:
        return None
    return bind_forward(wide, names, call)


def float64_outputs(forward: Callable[..., Any],
                    inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """The float64 copy's flat outputs on ``inputs`` (floating inputs widened); None when
    its forward fails."""
    widened = [t.double() if t.is_floating_point() else t for t in inputs]
    try:
        # the float32 run already showed the model code's warnings; this is a measurement
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return flatten(forward(*widened))
    except Exception:
        return None


#: Bits of precision per floating dtype: an op whose output has fewer than its widest
#: floating input narrows the arithmetic.
_PRECISION = {torch.float64: 64, torch.complex128: 64, torch.float32: 32, torch.complex64: 32,
              torch.float16: 16, torch.bfloat16: 16, torch.complex32: 16}


#: ``_Narrowing(widen=True)``: a cast of a 64-bit value to these computes in the other instead.
_WIDENED = {torch.float32: torch.float64, torch.float16: torch.float64,
            torch.bfloat16: torch.float64, torch.complex64: torch.complex128,
            torch.complex32: torch.complex128}


# torch leaves TorchDispatchMode's __init_subclass__ and __init__ unannotated
class _Narrowing(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the first op that computes below the precision of its inputs (a cast to
    ``complex64``, a copy into a float32 buffer). Constants made in float32 and used
    beside float64 values narrow nothing: the same constant rounds alike in every run.
    With ``widen``, a cast of a float64 (complex128) value to a narrower dtype (``x.float()``
    to accept any input, ``.to(torch.bfloat16)`` on the way out, a rotary table's
    ``.float()``) casts to float64 (complex128) instead, and only what still narrows is
    recorded."""

    def __init__(self, widen: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.found: str | None = None
        self.widen = widen

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self.widen and func is torch.ops.aten._to_copy.default:
            kwargs = _widened_cast(args, kwargs)
        result = func(*args, **kwargs)
        if self.found is None:
            widest = max((_PRECISION.get(t.dtype, 0) for t in _tensors((args, kwargs))),
                         default=0)
            narrowest = min((_PRECISION.get(t.dtype, 64) for t in _tensors(result)),
                            default=64)
            if narrowest < widest:
                self.found = func._schema.name
        return result


def _widened_cast(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``aten._to_copy``'s keywords with a narrowing target dtype of a 64-bit source widened
    (``_WIDENED``)."""
    source, target = args[0] if args else None, kwargs.get("dtype")
    if (isinstance(source, torch.Tensor) and _PRECISION.get(source.dtype) == 64
            and target in _WIDENED):
        return {**kwargs, "dtype": _WIDENED[target]}
    return kwargs


def _tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts of op arguments or results."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


def float64_throughout(forward: Callable[..., Any],
                       inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """``float64_outputs``, with the model's casts of float64 values to narrower dtypes made
    float64 too, where no op of the run then computes below float64 (``_Narrowing``); None
    otherwise, or where the forward fails (code that needs the narrower dtype)."""
    outputs, narrowed = _watched_outputs(forward, inputs, widen=True)
    return None if narrowed else outputs


def _watched_outputs(forward: Callable[..., Any], inputs: Sequence[torch.Tensor], *,
                     widen: bool) -> tuple[list[torch.Tensor] | None, bool]:
    """``float64_outputs`` under ``_Narrowing(widen)``, and whether some op narrowed."""
    watch = _Narrowing(widen=widen)
    with watch:
        outputs = float64_outputs(forward, inputs)
    return outputs, watch.found is not None
