"""The inputs a build declares: names, shapes, dtypes, how they reach ``forward``, and the
reference values drawn for them.

One unnamed input (``--shapes``) is passed positionally, as ``forward``'s first parameter.
Named inputs (``--input NAME:...`` or ``{name: shape}`` dicts) are passed by keyword, and each
name must be a parameter of ``forward``. Integer inputs draw reference values from the range
the model makes visible (the ``num_embeddings`` of the embedding they feed), else from
``--input-range``, else [0, 2) with a note saying so. Float inputs are standard normal, or
uniform over ``--input-range`` when one is given (recorded in the manifest as the range
their references came from).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import ModelSourceError, ShapeSpecError
from ..format import (
    DTYPES,
    MAX_DIM,
    MAX_RANK,
    InputDecl,
    Shape,
    check_dtype,
    check_reference_bytes,
    embedding_range,
    format_shape,
    parse_shapes,
)
from ..runtime import describe, torch_dtype
from ._given import Given, given_of_shape

ShapesArg = str | Sequence[Sequence[int]] | Sequence[Mapping[str, Sequence[int]]]
EXAMPLE_INPUT_HOOK = "example_input"
DEFAULT_INT_RANGE = (0, 2)


@dataclass(frozen=True)
class DeclaredInputs:
    """What a build was asked to record: names in order, the call convention, one
    ``{name: shape}`` per declared shape, and a dtype per name."""

    names: list[str]
    call: str
    per_shape: list[dict[str, Shape]]
    dtypes: dict[str, str]


def declare_inputs(shapes: ShapesArg, dtype: str | Mapping[str, str],
                   model: torch.nn.Module) -> DeclaredInputs:
    """Normalise ``shapes``/``dtype``; check named inputs against ``forward``'s parameters."""
    entries: list[Any] = list(parse_shapes(shapes) if isinstance(shapes, str) else shapes)
    if not entries:
        raise ShapeSpecError("no shapes given: declare at least one input shape")
    by_name = [entry for entry in entries if isinstance(entry, Mapping)]
    if len(by_name) == len(entries):
        names, call = list(by_name[0]), "keyword"
        per_shape = [{n: _checked_shape(s[n], n) for n in names} for s in by_name
                     if _same_names(s, names)]
        check_forward_accepts(model, names)
    else:
        names, call = forward_input_names(model, 1), "positional"
        per_shape = [{names[0]: _checked_shape(s, names[0])} for s in entries]
    if len({tuple(map(tuple, p.items())) for p in per_shape}) != len(per_shape):
        raise ShapeSpecError("a shape is declared twice")
    dtypes = _dtypes_for(dtype, names)
    check_reference_bytes(per_shape, dtypes)  # before any input is drawn
    return DeclaredInputs(names, call, per_shape, dtypes)


def _same_names(shape_map: Mapping[str, Any], names: list[str]) -> bool:
    if list(shape_map) != names:
        raise ShapeSpecError(f"every shape must name the inputs {names} in the same order")
    return True


def _checked_shape(shape: Any, name: str) -> Shape:
    if isinstance(shape, str):
        return parse_shapes(shape)[0]
    if not isinstance(shape, (list, tuple)) or not shape:
        raise ShapeSpecError(f"shape for {name!r} must be a non-empty list of positive ints")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= MAX_DIM
               for d in shape) or len(shape) > MAX_RANK:
        raise ShapeSpecError(f"shape {shape!r:.80} for {name!r} must hold at most {MAX_RANK} "
                             f"positive integers up to {MAX_DIM}")
    return tuple(shape)


def _forward_parameters(model: torch.nn.Module) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return []


def forward_input_names(model: torch.nn.Module, count: int) -> list[str]:
    """Names of forward's first ``count`` positional parameters (``input0``... if unnamed)."""
    positional = [p.name for p in _forward_parameters(model)
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [n for n in positional if n.isidentifier()][:count]
    return names + [f"input{i}" for i in range(len(names), count)]


def check_forward_accepts(model: torch.nn.Module, names: Sequence[str]) -> None:
    """Every named input must be a named keyword parameter of ``forward``.

    A ``**kwargs`` catch-all does not excuse a name that matches no parameter (transformers
    models all have one, and a misspelt ``input_idz`` would vanish into it); only a forward
    whose every keyword goes through ``**kwargs`` accepts any name."""
    parameters = _forward_parameters(model)
    accepted = [p.name for p in parameters
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not parameters or not accepted:
        return
    unknown = [n for n in names if n not in accepted]
    if unknown:
        raise ShapeSpecError(
            f"input(s) {unknown} are not parameters of {type(model).__name__}.forward, which "
            f"takes: {', '.join(accepted)}. Named inputs are passed by keyword: name them after "
            "forward's parameters")


def _dtypes_for(dtype: str | Mapping[str, str], names: list[str]) -> dict[str, str]:
    if isinstance(dtype, str):
        return {name: check_dtype(dtype) for name in names}
    unknown = set(dtype) - set(names)
    if unknown:
        raise ShapeSpecError(f"dtype given for unknown inputs {sorted(unknown)}; inputs: {names}")
    return {name: check_dtype(dtype.get(name, "float32")) for name in names}


def integer_ranges(declared: DeclaredInputs, forward: Callable[..., Any],
                   model: torch.nn.Module, input_range: tuple[float, float] | None,
                   hook: Any) -> list[InputDecl]:
    """Each input's declaration with the range its reference values come from: integer
    inputs always (embedding table, hook, ``--input-range`` or the default), float inputs
    when ``input_range`` is given (drawn uniformly from it; standard normal otherwise).

    A range no input would be drawn from is refused rather than ignored: the model file's
    ``example_input`` hook makes every input, and bool inputs are False/True."""
    kinds = {DTYPES[declared.dtypes[n]].kind for n in declared.names}
    if input_range is not None and (hook is not None or not kinds & {"int", "float"}):
        why = (f"the model file defines {EXAMPLE_INPUT_HOOK}(), which makes every reference "
               "input" if hook is not None else "every input is bool")
        raise ShapeSpecError(f"--input-range has no effect: {why}; leave it out")
    integers = [n for n in declared.names if DTYPES[declared.dtypes[n]].kind == "int"]
    found = {} if input_range or hook or not integers else _embedding_ranges(
        declared, integers, forward, model)
    decls = []
    for name in declared.names:
        dtype = declared.dtypes[name]
        if DTYPES[dtype].kind == "float" and input_range is not None:
            decls.append(InputDecl(name, dtype, *input_range, "--input-range"))
        elif name not in integers:
            decls.append(InputDecl(name, dtype))
        elif hook is not None:
            decls.append(InputDecl(name, dtype, range_source=EXAMPLE_INPUT_HOOK))
        elif input_range is not None:
            decls.append(InputDecl(name, dtype, *input_range, "--input-range"))
        else:
            low, high, source = found.get(name, (*DEFAULT_INT_RANGE, "default"))
            decls.append(InputDecl(name, dtype, low, high, source))
    return decls


class _EmbeddingLookups(TorchFunctionMode):
    """Sees every ``F.embedding`` call: which tensor indexes which table, of how many rows.

    Watching ``torch.nn.functional.embedding`` rather than ``nn.Embedding`` modules: a learned
    positional embedding is an ``nn.Embedding`` subclass that receives the token ids only to
    read their shape (BART), which a module hook would take for an index."""

    def __init__(self, owners: Mapping[int, str], names: Mapping[int, str]) -> None:
        super().__init__()
        self.owners, self.names = owners, names
        self.found: dict[str, tuple[int, int, str]] = {}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.embedding and len(args) >= 2:
            self._note(args[0], args[1])
        return func(*args, **kwargs)

    def _note(self, index: Any, weight: Any) -> None:
        if not isinstance(index, torch.Tensor) or not isinstance(weight, torch.Tensor):
            return
        name = self.owners.get(index.untyped_storage().data_ptr())
        rows = int(weight.shape[0])
        if name is not None and rows < self.found.get(name, (0, 2**62, ""))[1]:
            table = self.names.get(id(weight), "an embedding")
            self.found[name] = (0, rows, embedding_range(table, rows))


def _embedding_ranges(declared: DeclaredInputs, integers: list[str],
                      forward: Callable[..., Any], model: torch.nn.Module
                      ) -> dict[str, tuple[int, int, str]]:
    """Run one probe forward (values in the always-safe [0, 2)) watching embedding lookups;
    an input whose storage indexes a table takes that table's row count."""
    generator = torch.Generator().manual_seed(0)
    probe = {n: random_input(s, torch_dtype(declared.dtypes[n]), generator, DEFAULT_INT_RANGE)
             for n, s in declared.per_shape[0].items()}
    owners = {probe[n].untyped_storage().data_ptr(): n for n in integers}
    tables = {id(p): name.removesuffix(".weight") for name, p in model.named_parameters()}
    watch = _EmbeddingLookups(owners, tables)
    try:
        with torch.no_grad(), watch:
            forward(*probe.values())
    except Exception:  # the probe only informs; the reference run reports real failures
        return {}
    return watch.found


def reference_inputs(shape_map: Mapping[str, Shape], decls: Sequence[InputDecl], seed: int,
                     hook: Any, model_path: Path,
                     given: Given | None = None) -> dict[str, torch.Tensor]:
    """Reference values for one declared shape: the user's own (``given``, from
    ``--reference-inputs``) where they have this shape, else from the model file's
    ``example_input`` hook, else drawn at random seeded by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    by_name = {d.name: d for d in decls}
    inputs = {}
    for name, shape in shape_map.items():
        decl = by_name[name]
        dtype = torch_dtype(decl.dtype)
        if (chosen := given_of_shape(given, name, shape)) is not None:
            inputs[name] = chosen
        elif hook is not None:
            inputs[name] = _from_hook(hook, name, shape, dtype, generator, model_path)
        else:
            bounds = ((decl.low, decl.high) if decl.low is not None and decl.high is not None
                      else None)
            inputs[name] = random_input(shape, dtype, generator, bounds)
    return inputs


def random_input(shape: Shape, dtype: torch.dtype, generator: torch.Generator,
                 input_range: tuple[float, float] | None = None) -> torch.Tensor:
    """Reference input: normal floats, or uniform over ``input_range`` ([0, 2) for ints).

    A float range is drawn as ``u * HIGH + (1 - u) * LOW`` (u uniform in [0, 1)), in float64
    for float64 inputs and float32 otherwise, then rounded to the input's dtype: no
    intermediate overflows for any range ``check_range`` lets through (``HIGH - LOW`` can
    exceed the largest float32 while both ends fit)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if not dtype.is_floating_point:
        low, high = input_range or DEFAULT_INT_RANGE
        return torch.randint(int(low), int(high), shape, generator=generator, dtype=dtype)
    if input_range is None:
        return torch.randn(shape, generator=generator).to(dtype)
    low, high = input_range
    work = torch.float64 if dtype == torch.float64 else torch.float32
    u = torch.rand(shape, generator=generator, dtype=work)
    return (u * high + (1 - u) * low).to(dtype)


def _from_hook(hook: Any, name: str, shape: Shape, dtype: torch.dtype,
               generator: torch.Generator, model_path: Path) -> torch.Tensor:
    try:
        tensor = hook(name, shape, dtype, generator)
    except Exception as exc:
        raise ModelSourceError(f"{model_path}: {EXAMPLE_INPUT_HOOK}() failed: {describe(exc)}") from exc
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(shape) or (
        tensor.dtype != dtype
    ):
        raise ModelSourceError(
            f"{model_path}: {EXAMPLE_INPUT_HOOK}({name!r}, {format_shape(shape)}, {dtype}) must "
            f"return a tensor of that shape and dtype"
        )
    return tensor.contiguous()
