"""Call plans: what a predictor works out once per call signature, and the signature itself.

A call's signature is everything the checks of its inputs depend on: per value its kind
(a plain tensor, a ``Parameter`` or a numpy array), shape and dtype, and for a tensor its
device, layout and whether it requires grad; for keyword calls the names in the order given.
The first call of a signature takes the general path (``InputMatcher.match``: every check,
every refusal); once it passes, the predictor remembers a ``CallPlan`` under the signature,
and a later call of it is one dict lookup on the signature, then prepare, copy in, replay,
copy out, finish -- nothing judged again, because nothing judged depends on more than the
signature. What depends on the values is done per call, as the general path does it: a
numpy array's memory layout (copied where it is not C-contiguous, native-order and
writeable, ``host_tensor``); a non-contiguous tensor is read by the copy into the graph's
input buffer as it is. Signatures of other kinds of value (an ndarray subclass, a tensor
subclass the general path refuses anyway) are not remembered: such calls take the general
path every time.

Not owned here: the checks and refusals (``_inputs``), copy in / replay / copy out
(``_runners``' ``replayer``), the lock that serialises calls (the predictor).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..format import OutputNode
from ._inputs import host_tensor
from ._runners import Replay
from ._tree import ClassTable, unflatten

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

#: Call signatures a predictor remembers (the oldest go first): ragged traffic repeats a few
#: hundred; a stream of distinct ones cannot grow the memory past this.
CALL_MEMORY = 4096

_TENSOR, _PARAMETER, _ARRAY = torch.Tensor, torch.nn.Parameter, np.ndarray

Prepare = Callable[[tuple[Any, ...], Mapping[str, Any]], Sequence[torch.Tensor]]
Finish = Callable[[list[torch.Tensor]], Any]


def call_signature(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The key a call's plan is remembered under, or None where a value is of a kind that is
    not remembered (or has no shape to read: a strided nested tensor).

    A call of one value by position, the common call, is keyed by that value's part alone;
    any other by the tuple of its values' parts, then for keywords their names (a tuple of
    strings). Keys of different forms never compare equal: a part begins with a torch.Size
    (a tensor: a plain tensor and a ``Parameter`` of one signature take the same way) or
    with the ndarray type, never with a tuple of parts or a name."""
    try:
        if not kwargs:
            if len(args) == 1:
                return _value_signature(args[0])
            key = tuple(map(_value_signature, args))
        else:
            key = (*map(_value_signature, args), *map(_value_signature, kwargs.values()),
                   tuple(kwargs))
    except RuntimeError:  # NestedTensorImpl has no sizes: the general path names it
        return None
    return None if None in key else key


def _value_signature(value: Any) -> tuple[Any, ...] | None:
    kind = type(value)
    if kind is _TENSOR or kind is _PARAMETER:
        return (value.shape, value.dtype, value.device, value.layout, value.requires_grad)
    if kind is _ARRAY:
        return (kind, value.shape, value.dtype)
    return None


@dataclass(frozen=True, slots=True)
class CallPlan:
    """One call signature's way through: ``prepare`` turns the call's arguments into input
    tensors in declared order (None: the positional arguments as they are), ``replay``
    copies them in, replays and copies out (under the predictor's lock), ``finish`` makes
    the result of the output leaves (None: the one leaf as it is)."""

    prepare: Prepare | None
    replay: Replay
    finish: Finish | None


def plan_call(args: tuple[Any, ...], kwargs: Mapping[str, Any], names: Sequence[str], replay: Replay,
              as_numpy: bool, outputs: OutputNode, classes: ClassTable) -> CallPlan:
    """The plan of a call that passed every check: how its arguments become the inputs
    (order, numpy to tensor, detach), how its leaves become the result."""
    return CallPlan(_preparer(args, kwargs, names), replay, _finisher(as_numpy, outputs, classes))


def _preparer(args: tuple[Any, ...], kwargs: Mapping[str, Any], names: Sequence[str]) -> Prepare | None:
    given = len(args)
    order = tuple(range(given))
    if kwargs:
        keys = list(kwargs)
        order += tuple(given + keys.index(name) for name in names[given:])
    values = (*args, *kwargs.values())
    converts = tuple(_conversion(values[i]) for i in order)
    if not kwargs and not any(converts):
        return None

    def prepare(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        values = (*args, *kwargs.values())
        return [values[i] if convert is None else convert(values[i])
                for i, convert in zip(order, converts)]

    return prepare


def _conversion(value: Any) -> Callable[[Any], torch.Tensor] | None:
    """What each call does to a value of this signature before copying it in."""
    if isinstance(value, _ARRAY):
        return host_tensor
    if value.requires_grad:  # read without autograd: a copy_ would record one into the buffer
        return _TENSOR.detach
    return None


def _finisher(as_numpy: bool, outputs: OutputNode, classes: ClassTable) -> Finish | None:
    if outputs.kind == "tensor":  # one leaf: no structure to rebuild
        return _first_as_numpy if as_numpy else None

    def finish(leaves: list[torch.Tensor]) -> Any:
        if as_numpy:
            leaves = [_numpy_leaf(leaf) for leaf in leaves]
        return unflatten(outputs, leaves, classes)

    return finish


def _first_as_numpy(leaves: list[torch.Tensor]) -> Any:
    return _numpy_leaf(leaves[0])


def _numpy_leaf(leaf: torch.Tensor) -> Any:
    """A host output leaf as numpy; a bfloat16 one stays a (host) tensor: numpy has none."""
    return leaf if leaf.dtype == torch.bfloat16 else leaf.numpy()


class CallMemory:
    """Call plans by signature, at most ``CALL_MEMORY`` (the oldest go first).

    ``get`` takes no lock (one dict read, atomic); ``remember`` and ``clear`` run under the
    predictor's call lock, which every change holds: threads evicting together would both
    take the same oldest key, and a plan remembered after ``close`` would keep its graphs'
    buffers alive."""

    __slots__ = ("get", "limit", "plans")

    def __init__(self, limit: int | None = None) -> None:
        self.plans: dict[tuple[Any, ...] | None, CallPlan] = {}
        self.get = self.plans.get
        self.limit = CALL_MEMORY if limit is None else limit

    def remember(self, key: tuple[Any, ...] | None, plan: CallPlan) -> None:
        """Keep ``plan`` under ``key`` (None: a signature not remembered). Caller holds the
        call lock."""
        if key is None:
            return
        if key not in self.plans:
            while self.plans and len(self.plans) >= self.limit:
                del self.plans[next(iter(self.plans))]
        self.plans[key] = plan

    def clear(self) -> None:
        self.plans.clear()

    def __len__(self) -> int:
        return len(self.plans)
