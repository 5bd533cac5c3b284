"""Matching call arguments to a manifest signature: names, numpy, dtypes, devices, padding.

Every refusal is an ``InputError`` carrying the accepted signatures as data.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._accepted import format_accepted, format_ranges
from ..errors import InputError
from ..format import Manifest, accepted_ranges, fit_entry, format_shape, padding_table, shape_fix
from ._tree import torch_dtype

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

#: Tensor types taken as they are; any other ``torch.Tensor`` subclass is refused.
PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


#: Call shapes whose padded fit an ``InputMatcher`` remembers.
FIT_MEMORY = 4096


@dataclass(frozen=True)
class Fit:
    """How a smaller call fills a captured entry: per input the region it covers (None: the
    whole buffer) and the value the rest takes; per output leaf the region to give back."""

    inputs: tuple[tuple[slice, ...] | None, ...]
    values: tuple[Any, ...]
    outputs: tuple[tuple[slice, ...] | None, ...]
    shapes: tuple[tuple[int, ...], ...]  # the entry's input shapes


class InputMatcher:
    """Turns ``(args, kwargs)`` into tensors, the manifest shape they replay, and how they
    are padded into it (``Fit``, None for an exact call)."""

    def __init__(self, manifest: Manifest, device: torch.device, pad_batch: bool) -> None:
        self.manifest = manifest
        self.device = device
        self.declared = manifest.padding
        self.pad_batch = pad_batch and self.declared is None  # declared padding supersedes it
        self._names = manifest.input_names
        self._dtypes = tuple(torch_dtype(d.dtype) for d in manifest.inputs)
        self._index = {tuple(torch.Size(s) for _, s in e.inputs): i
                       for i, e in enumerate(manifest.shapes)}
        self._entries = [[tuple(s) for _, s in e.inputs] for e in manifest.shapes]
        self._leaves = [len(list(e.outputs.leaves())) for e in manifest.shapes]
        self._padding = padding_table(manifest) if self.pad_batch else {}
        self._pad_values = tuple(self.declared.values.get(name) for name in self._names) \
            if self.declared is not None else ()
        self._ranges = (accepted_ranges(self._entries, self._names,
                                        [d.dtype for d in manifest.inputs], self.declared)
                        if self.declared is not None else [])
        self.signatures = manifest.signatures()
        self._fits: dict[tuple[Any, ...], tuple[int, Fit]] = {}
        self._fits_lock = threading.Lock()

    def match(self, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[list[torch.Tensor], bool, int, Fit | None]:
        """(tensors, given as numpy, shape index, how they are padded) for a call."""
        if kwargs:
            args = self._order_keywords(args, kwargs)
        if len(args) != len(self._names):
            raise self.refuse(
                f"expected {len(self._names)} input(s) ({', '.join(self._names)}), got {len(args)}")
        as_numpy = False
        tensors = []
        for position, value in enumerate(args):
            if not isinstance(value, torch.Tensor):
                value, as_numpy = self._coerce(value, position), True
            elif type(value) not in PLAIN_TENSOR_TYPES:
                raise self._subclass(value, position)
            tensors.append(value.detach() if value.requires_grad else value)
        index, fit = self._lookup(tensors, numpy=as_numpy)
        return tensors, as_numpy, index, fit

    def _order_keywords(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        unknown = sorted(set(kwargs) - set(self._names))
        if unknown:
            raise self.refuse(f"unknown input(s) {unknown}; this artifact takes {list(self._names)}")
        given = dict(zip(self._names, args))
        clash = sorted(set(given) & set(kwargs))
        if clash:
            raise self.refuse(f"input(s) {clash} given both by position and by name")
        given.update(kwargs)
        missing = [n for n in self._names if n not in given]
        if missing:
            raise self.refuse(f"missing input(s) {missing}; this artifact takes {list(self._names)}")
        return tuple(given[n] for n in self._names)

    def _subclass(self, value: torch.Tensor, position: int) -> InputError:
        """A tensor subclass (``MaskedTensor``, ``DTensor``, ...) would be copied into the
        graph's input buffer as its plain data, dropping whatever the subclass adds (a mask)."""
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        return self.refuse(
            f"input {self._names[position]!r} is a {kind}, a torch.Tensor subclass that the "
            "captured graphs cannot take; pass a plain tensor (for a masked tensor, fill the "
            "masked entries first)")

    def _coerce(self, value: Any, position: int) -> torch.Tensor:
        name = self._names[position]
        if isinstance(value, np.ma.MaskedArray):
            raise self.refuse(
                f"input {name!r} is a numpy masked array; the mask would be ignored: pass "
                "array.filled(value) with the value masked entries should take")
        if isinstance(value, np.ndarray):
            try:
                return host_tensor(value)
            except TypeError as exc:
                raise self.refuse(f"input {name!r}: numpy dtype {value.dtype} unsupported: "
                                   f"{exc}") from None
        raise self.refuse(
            f"input {name!r} is a {type(value).__name__}; pass a torch.Tensor or numpy.ndarray")

    def _lookup(self, tensors: Sequence[torch.Tensor],
                numpy: bool = False) -> tuple[int, Fit | None]:
        for position, (tensor, dtype) in enumerate(zip(tensors, self._dtypes)):
            if tensor.is_nested:
                raise self.refuse(
                    f"input {self._names[position]!r} is a nested tensor; pass one dense tensor "
                    "of a declared shape (torch.nested.to_padded_tensor or stack the parts)")
            if tensor.layout != torch.strided:
                raise self.refuse(
                    f"input {self._names[position]!r} has layout {tensor.layout}; pass a dense "
                    "tensor (.to_dense())")
            if tensor.dtype != dtype:
                raise self.refuse(
                    f"input {self._names[position]!r} has dtype "
                    f"{str(tensor.dtype).removeprefix('torch.')} ({_conversion(dtype, numpy)})")
            if tensor.device.type != "cpu" and tensor.device != self.device:
                raise self.refuse(
                    f"input {self._names[position]!r} is on {tensor.device}, the predictor on "
                    f"{self.device}; pass a CPU tensor or move it with .to('{self.device}')")
        key = tuple(t.shape for t in tensors)
        index = self._index.get(key)
        if index is not None:
            return index, None
        if self.declared is not None:
            return self._remembered_fit(key)
        if self._padding:
            return self._padded_entry(key)
        shown = ", ".join(_shape_text(s) for s in key)
        raise self.refuse_shape(f"input shape {shown} is not in the manifest", key)

    def _remembered_fit(self, key: tuple[Any, ...]) -> tuple[int, Fit]:
        """``_declared_fit``, worked out once per call shape: searching every entry and
        building the regions is Python work of the order of a whole replay on a GPU, and
        ragged traffic repeats a few hundred shapes. At most ``FIT_MEMORY`` shapes are kept
        (the oldest go first), so a stream of distinct shapes cannot grow it. Predictors are
        called from many threads (serve's replicas): every change to the memory holds
        ``_fits_lock``."""
        found = self._fits.get(key)  # a hit takes no lock: one dict read, atomic
        if found is None:
            found = self._declared_fit(key)
            with self._fits_lock:  # misses only: threads evicting together raced (KeyError)
                if len(self._fits) >= FIT_MEMORY:
                    del self._fits[next(iter(self._fits))]
                self._fits[key] = found
        return found

    def _declared_fit(self, key: tuple[Any, ...]) -> tuple[int, Fit]:
        """The smallest entry the call pads into (``format.fit_entry``), with its regions."""
        assert self.declared is not None
        call = [tuple(shape) for shape in key]
        found = fit_entry(call, self._entries, self._names, self.declared)
        if found is None:
            shown = ", ".join(_shape_text(s) for s in key)
            raise self.refuse_shape(f"input shape {shown} fits no captured shape, even padded",
                                    key)
        index, sizes = found
        entry = self._entries[index]
        regions = tuple(None if got == have else tuple(slice(0, n) for n in got)
                        for got, have in zip(call, entry))
        kept: list[list[slice]] = [[] for _ in range(self._leaves[index])]
        for axis, size in zip(self.declared.axes, sizes):
            for leaf, dim in axis.outputs:
                while len(kept[leaf]) <= dim:
                    kept[leaf].append(slice(None))
                kept[leaf][dim] = slice(0, size)
        outputs = tuple(tuple(k) if k else None for k in kept)
        return index, Fit(regions, self._pad_values, outputs, tuple(entry))

    def _padded_entry(self, key: tuple[Any, ...]) -> tuple[int, Fit]:
        rows = {s[0] for s in key if len(s)}
        tail = tuple(tuple(s[1:]) for s in key)
        candidates = self._padding.get(tail, [])
        if len(rows) == 1:
            (count,) = rows
            for batch, index in candidates:
                if count <= batch and count > 0:
                    shapes = tuple(tuple(shape) for _, shape in self.manifest.shapes[index].inputs)
                    region = (slice(0, count),)
                    return index, Fit(inputs=tuple(region for _ in shapes),
                                      values=tuple(0 for _ in shapes),
                                      outputs=tuple(region for _ in range(self._leaves[index])),
                                      shapes=shapes)
        shown = ", ".join(_shape_text(s) for s in key)
        largest = max((b for b, _ in candidates), default=None)
        hint = f"; batches up to {largest} are padded" if largest else ""
        raise self.refuse_shape(
            f"input shape {shown} is not in the manifest and cannot be padded to it{hint}", key)

    def accepted(self) -> str:
        """The shapes and dtypes this artifact accepts, as one line (``InputError.accepted``
        holds the same as data)."""
        if self._ranges:
            return format_ranges(self._ranges)
        return format_accepted(self.signatures, padded=self.pad_batch)

    def refuse(self, problem: str) -> InputError:
        return InputError(problem, accepted=self.signatures, padded=self.pad_batch,
                          ranges=self._ranges)

    def refuse_shape(self, problem: str, key: tuple[Any, ...]) -> InputError:
        """A call whose shapes fit no entry: the refusal ends with the fix
        (``format.shape_fix``)."""
        return InputError(problem, accepted=self.signatures, padded=self.pad_batch,
                          ranges=self._ranges, **shape_fix(self.manifest, key))


def host_tensor(array: np.ndarray) -> torch.Tensor:
    """A numpy array as a host tensor: its own memory where it is C-contiguous, native-order
    and writeable (``torch.from_numpy``, no copy), else a copy that is. What the array holds
    never matters; its layout decides per call (the dtype raises TypeError where torch has
    no such dtype)."""
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="), order="C")
    else:
        flags = array.flags
        if not (flags.c_contiguous and flags.writeable):  # from_numpy warns on read-only memory
            array = array.copy(order="C")  # keeps 0-d arrays 0-d
    return torch.from_numpy(array)


def _shape_text(shape: Sequence[int]) -> str:
    return format_shape(shape) if len(shape) else "() (a 0-d tensor)"


def _conversion(dtype: torch.dtype, numpy: bool) -> str:
    """How to convert an input to ``dtype``, in the terms of what the caller passed."""
    name = str(dtype).removeprefix("torch.")
    if not numpy:
        return f"convert with .to(torch.{name})"
    if dtype == torch.bfloat16:
        return "numpy has no bfloat16: pass a torch tensor, torch.from_numpy(array).bfloat16()"
    return f"convert with array.astype(numpy.{name})"
