"""What a build proves about its references before it writes them.

A load trusts the references to tell the model that was built from any other: its
self-test compares the rebuilt model's outputs with them. That fails open in two ways,
both checked here, at build, where the user can still fix them:

- references that carry no information (an empty output, or outputs that are one value
  throughout: a detector that detects nothing on random inputs) let any weights pass;
- a factory that is not reproducible (an unseeded buffer that is not saved with the
  weights) rebuilds another model at every load, which then fails with a difference the
  user cannot explain.

And one about the model itself, which serving relies on: a forward that changes what later
calls answer (a running statistic, an observer left on) would let one client's inputs reach
another client's answers, batched or not (``check_stateless``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors

from ..errors import (
    FactoryNotReproducibleError,
    ModelSourceError,
    StatefulModelError,
    WeakReferencesError,
)
from ..runtime import (
    call_factory,
    entry_function,
    flatten,
    load_strict,
    proof_agreement,
    uninformative_outputs,
)

#: ``check_stateless`` runs the model on other inputs with their floats these many times as
#: large: as drawn (a state that only plausible values move: calibration that skips
#: outliers), and wider (a running maximum or a min/max observer sees values beyond the
#: references').
INPUT_SCALES = (1.0, 4.0, 16.0)


def check_informative(label: str, outputs: Sequence[torch.Tensor], names: Sequence[str], *,
                      allow: bool) -> list[str]:
    """Refuse (``WeakReferencesError``) a reference with an empty output, or whose outputs
    are all constant: a self-test against it passes whatever the weights. Constant outputs
    beside informative ones are only noted. ``allow``: note instead of refusing. Returns
    the notes."""
    found = uninformative_outputs(outputs, names)
    empty, constant = found.empty, found.constant
    if found.proves_nothing and not allow:
        problem = "; ".join(filter(None, (
            f"{', '.join(empty)} {'has' if len(empty) == 1 else 'have'} no elements"
            if empty else "",
            f"{', '.join(constant)} {'is' if len(constant) == 1 else 'are'} constant"
            if constant and not empty else "")))
        raise WeakReferencesError(shape=label, outputs=[*empty, *constant], problem=problem)
    if not (empty or constant):
        return []
    what = ", ".join([*empty, *constant])
    return [f"shape {label}: reference outputs {what} carry no information: the load "
            "self-test cannot tell a wrong model from this one by them"]


def buffers_before_forward(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of ``model``'s buffers as its factory and weights left them. A forward may
    fill a cache buffer (rotary tables grown to the longest sequence seen), which a fresh
    model fills the same way when it runs: the second build is compared with this state,
    not with the model after the reference runs."""
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}


@dataclass(frozen=True)
class Recipe:
    """How a load rebuilds the model: the imported model source, its factory's name and
    config, the weights as the artifact stores them (safetensors bytes) and the tied
    groups; ``path`` (the model file) names it in messages."""

    module: Any
    entry: str
    config: Mapping[str, Any]
    weights: bytes
    tied: Sequence[Sequence[str]]
    path: Path


@dataclass(frozen=True)
class RepeatedRun:
    """A reference run to repeat on the rebuilt model: how to call a model
    (``forward_of``), the inputs, and the first model's flat outputs with their names."""

    forward_of: Callable[[torch.nn.Module], Any]
    inputs: Sequence[torch.Tensor]
    outputs: Sequence[torch.Tensor]
    names: Sequence[str]


def check_reproducible(first: Mapping[str, torch.Tensor], recipe: Recipe,
                       run: RepeatedRun) -> None:
    """Build the model a second time as a load will (factory, then the artifact's weights,
    strictly, then eval) and require the same buffers as the first build had before any
    forward (``first``, from ``buffers_before_forward``) and the same outputs on
    ``run.inputs``; raise ``FactoryNotReproducibleError`` naming what differs."""
    shown, entry = str(recipe.path), recipe.entry
    factory = entry_function(recipe.module, entry, shown)
    second = call_factory(factory, recipe.config, shown, entry, device="cpu")
    load_strict(second, load_safetensors(recipe.weights), recipe.tied, shown)
    second.eval()
    differs = _differing_buffers(first, second)
    if not differs:
        try:
            with torch.inference_mode():
                again = flatten(run.forward_of(second)(*run.inputs))
        except Exception as exc:
            raise ModelSourceError(f"{shown}: the model from a second {entry}() call fails "
                                   f"where the first ran: {exc}", stage="factory",
                                   path=shown) from exc
        differs = [name for name, a, b in zip(run.names, again, run.outputs) if not _same(a, b)]
        if len(again) != len(run.outputs):
            differs.append("the number of outputs")
    if differs:
        raise FactoryNotReproducibleError(path=shown, entry=entry, differs=differs)


def _differing_buffers(first: Mapping[str, torch.Tensor], second: torch.nn.Module) -> list[str]:
    """Buffers (non-persistent ones too: they are not saved with the weights) that differ
    between two builds of the model."""
    theirs = dict(second.named_buffers())
    return [f"buffer {name}" for name, buffer in first.items()
            if name not in theirs or not _same(buffer, theirs[name])]


@dataclass(frozen=True)
class ReferenceRun:
    """One reference: how to call the model (``forward``), the inputs, its flat outputs
    with their names and the entry's rounding noise, and other inputs of the same shapes."""

    forward: Callable[..., Any]
    inputs: Sequence[torch.Tensor]
    outputs: Sequence[torch.Tensor]
    names: Sequence[str]
    noise: float | None
    other: Sequence[torch.Tensor]


def check_stateless(model: torch.nn.Module, run: ReferenceRun, path: str) -> None:
    """Refuse (``StatefulModelError``) a model whose forward changes what later calls answer:
    run it on other inputs (their floats at each of ``INPUT_SCALES``), then again on the
    reference inputs; every parameter and buffer must be as it was after each, and the
    reference outputs the same within the entry's noise bound (state kept in plain
    attributes shows there). Inputs the model cannot run are not judged by. Called for every
    declared entry: a state may move at one batch size only."""
    before = _state(model)
    changed: list[str] = []
    for scale in INPUT_SCALES:
        other = [t * scale if t.is_floating_point() else t for t in run.other]
        try:
            with torch.inference_mode():
                run.forward(*other)
        except Exception:
            continue  # inputs the model refuses prove nothing either way
        changed += [f"{kind} {name}" for kind, name, tensor in _state_items(model)
                    if (kind, name) in before and not _same(before[kind, name], tensor)
                    and f"{kind} {name}" not in changed]
    try:
        with torch.inference_mode():
            again = flatten(run.forward(*run.inputs))
    except Exception as exc:
        raise StatefulModelError(path=path, changed=[*changed, f"the forward itself ({exc})"]
                                 ) from exc
    if len(again) != len(run.outputs):
        changed.append("the number of outputs")
    else:
        changed += [f"output {name} on the same inputs" for name, got, want
                    in zip(run.names, again, run.outputs)
                    if not proof_agreement(got, want, run.noise).ok]
    if changed:
        raise StatefulModelError(path=path, changed=changed)


def _state_items(model: torch.nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    return [*(("parameter", n, p) for n, p in model.named_parameters()),
            *(("buffer", n, b) for n, b in model.named_buffers())]


def _state(model: torch.nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    return {(kind, name): tensor.detach().clone() for kind, name, tensor in _state_items(model)}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and elements (NaN equal to NaN); a pair torch cannot compare
    (an exotic tensor type) counts as equal: this check must never refuse a sound model."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    try:
        if a.is_floating_point():
            return bool(torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
                        and torch.equal(torch.isnan(a), torch.isnan(b)))
        return bool(torch.equal(a, b))
    except (RuntimeError, TypeError, NotImplementedError):
        return True
