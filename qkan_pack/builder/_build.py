"""``build()``: import a user's model file, load its weights, record references, write an artifact."""

from __future__ import annotations

import datetime as _dt
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelSourceError, ShapeSpecError
from ..format import (
    CAPTURE_POLICIES,
    INTEGER_DTYPES,
    REFERENCE_DIR,
    SOURCE_DIR,
    WEIGHTS_NAME,
    CapturePolicy,
    InputDecl,
    Manifest,
    ModelInfo,
    Shape,
    ShapeEntry,
    check_config,
    check_dtype,
    check_range,
    format_shape,
    parse_shapes,
)
from ..runtime import (
    accepts_device,
    call_factory,
    check_entry_named,
    describe,
    describe_output,
    entry_function,
    flatten,
    import_model_source,
    load_strict,
    package_versions,
    progress_bar,
    torch_dtype,
)
from ._weights import read_user_weights, tied_groups, weights_bytes
from ._writer import write_artifact

ShapesArg = str | Sequence[Sequence[int]] | Sequence[Mapping[str, Sequence[int]]]
EXAMPLE_INPUT_HOOK = "example_input"


@dataclass(frozen=True)
class BuildResult:
    path: Path
    manifest: Manifest
    digest: str


def build(
    model_path: str | Path,
    shapes: ShapesArg,
    *,
    output: str | Path | None = None,
    dtype: str | Mapping[str, str] = "float32",
    entry: str = "build_model",
    config: Mapping[str, Any] | None = None,
    weights: str | Path | None = None,
    includes: Sequence[str | Path] = (),
    capture: str = "auto",
    submodules: Sequence[str] = (),
    input_range: tuple[float, float] | None = None,
    seed: int = 0,
    force: bool = False,
    progress: bool | None = None,
) -> BuildResult:
    """Package ``model_path`` into an artifact directory and return where it went.

    ``shapes`` is ``"1x128,8x128"``, a list of shapes (one input), or a list of
    ``{input_name: shape}`` dicts (several inputs, passed to forward in that order).
    ``dtype`` is one dtype for every input or a ``{input_name: dtype}`` mapping.
    """
    model_path = Path(model_path)
    policy = _capture_policy(capture, submodules)
    user = _load_user_model(model_path, includes, entry, check_config(config or {}), weights)
    names, per_shape = _normalise_shapes(shapes, user.model)
    dtypes = _normalise_dtypes(dtype, names)
    files = {**user.sources, WEIGHTS_NAME: weights_bytes(user.model, user.tied)}
    entries = _record_references(user, model_path, per_shape, dtypes, seed, input_range, files,
                                 progress)
    manifest = Manifest(
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        producer=package_versions(), model=user.info(), shapes=tuple(entries),
        inputs=tuple(InputDecl(name, dtypes[name]) for name in names),
        capture=policy, files={}, reference_device="cpu",
    )
    target = Path(output) if output is not None else Path("artifacts") / model_path.stem
    final, digest = write_artifact(target, manifest, files, force=force, protect=(model_path.parent,))
    return BuildResult(path=target, manifest=final, digest=digest)


@dataclass
class _UserModel:
    """The user's model file imported, its factory called, weights loaded, in eval mode."""

    source_name: str
    sources: dict[str, bytes]
    module: Any
    entry: str
    config: dict[str, Any]
    device_argument: bool
    model: torch.nn.Module
    tied: list[list[str]]

    def info(self) -> ModelInfo:
        return ModelInfo(
            source=self.source_name,
            includes=tuple(p for p in sorted(self.sources) if p != self.source_name),
            entry=self.entry, config=self.config, device_argument=self.device_argument,
            parameters=sum(p.numel() for p in self.model.parameters()),
            tied=tuple(tuple(g) for g in self.tied),
        )


def _record_references(user: _UserModel, model_path: Path, per_shape: list[dict[str, Shape]],
                       dtypes: Mapping[str, str], seed: int,
                       input_range: tuple[float, float] | None, files: dict[str, bytes],
                       progress: bool | None) -> list[ShapeEntry]:
    """Run the model once per declared shape; add each reference file to ``files``."""
    input_range = check_range(input_range, list(dtypes.values()))
    entries = []
    hook = getattr(user.module, EXAMPLE_INPUT_HOOK, None)
    for index, shape_map in enumerate(
        progress_bar(per_shape, desc="reference outputs", enabled=progress)
    ):
        reference = f"{REFERENCE_DIR}/shape-{index:03d}.safetensors"
        inputs = _reference_inputs(shape_map, dtypes, seed + index, input_range, hook, model_path)
        outputs = _run_reference(user.model, inputs, shape_map, model_path)
        files[reference] = _reference_bytes(inputs, outputs)
        entries.append(ShapeEntry(tuple(shape_map.items()), describe_output(outputs), reference))
    return entries


def _load_user_model(model_path: Path, includes: Sequence[str | Path], entry: str,
                     config: dict[str, Any], weights: str | Path | None) -> _UserModel:
    sources = _read_sources(model_path, includes)
    source_name = f"{SOURCE_DIR}/{model_path.name}"
    module = import_model_source(source_name, sources, display_path=str(model_path))
    factory = entry_function(module, entry, str(model_path))
    check_entry_named(entry, sources, str(model_path))  # the loader checks this before import
    model = call_factory(factory, config, str(model_path), entry, device="cpu")
    tied = tied_groups(model)
    if weights is not None:
        load_strict(model, read_user_weights(weights), tied, str(weights))
    model.eval()  # after weights: QKAN folds masks/biases into eval-time caches here
    return _UserModel(source_name=source_name, sources=sources, module=module, entry=entry,
                      config=config, device_argument=accepts_device(factory), model=model,
                      tied=tied)


def _capture_policy(capture: str, submodules: Sequence[str]) -> CapturePolicy:
    if capture not in CAPTURE_POLICIES:
        raise ShapeSpecError(f"capture policy {capture!r} is not one of {', '.join(CAPTURE_POLICIES)}")
    names = tuple(s.strip() for s in submodules if s.strip())
    for name in names:
        if not name.isidentifier():
            raise ShapeSpecError(f"--submodules entry {name!r} is not a class name")
    if names and capture == "full":
        raise ShapeSpecError("--submodules has no effect with --capture full; use submodules/auto")
    return CapturePolicy(policy=capture, submodules=names)


def _read_sources(model_path: Path, includes: Sequence[str | Path]) -> dict[str, bytes]:
    """The model file plus includes, keyed by their path inside the artifact."""
    if not model_path.is_file():
        raise ModelSourceError(f"model file {model_path} does not exist")
    if model_path.suffix != ".py":
        raise ModelSourceError(f"model file {model_path} is not a .py file")
    base = model_path.resolve().parent
    sources = {f"{SOURCE_DIR}/{model_path.name}": model_path.read_bytes()}
    for include in includes:
        for file in _expand_include(Path(include), model_path):
            try:
                relative = file.resolve().relative_to(base).as_posix()
            except ValueError:
                raise ModelSourceError(
                    f"--include {file} is outside {base}; includes must sit beside the model file"
                ) from None
            sources[f"{SOURCE_DIR}/{relative}"] = file.read_bytes()
    return sources


def _expand_include(include: Path, model_path: Path) -> list[Path]:
    candidate = include if include.exists() else model_path.parent / include
    if candidate.is_dir():
        return sorted(p for p in candidate.rglob("*.py") if "__pycache__" not in p.parts)
    if candidate.is_file() and candidate.suffix == ".py":
        return [candidate]
    raise ModelSourceError(f"--include {include} is not a .py file or a directory of them")


def _normalise_shapes(shapes: ShapesArg, model: torch.nn.Module
                      ) -> tuple[list[str], list[dict[str, Shape]]]:
    if isinstance(shapes, str):
        shapes = parse_shapes(shapes)
    shapes = list(shapes)
    if not shapes:
        raise ShapeSpecError("no shapes given: declare at least one input shape")
    if all(isinstance(s, Mapping) for s in shapes):
        names = list(shapes[0])
        per_shape = [{n: _checked_shape(s[n], n) for n in names} for s in shapes
                     if _same_names(s, names)]
    else:
        names = forward_input_names(model, 1)
        per_shape = [{names[0]: _checked_shape(s, names[0])} for s in shapes]
    if len({tuple(map(tuple, p.items())) for p in per_shape}) != len(per_shape):
        raise ShapeSpecError("a shape is declared twice")
    return names, per_shape


def _same_names(shape_map: Mapping[str, Any], names: list[str]) -> bool:
    if list(shape_map) != names:
        raise ShapeSpecError(f"every shape must name the inputs {names} in the same order")
    return True


def _checked_shape(shape: Any, name: str) -> Shape:
    if isinstance(shape, str):
        return parse_shapes(shape)[0]
    if not isinstance(shape, (list, tuple)) or not shape:
        raise ShapeSpecError(f"shape for {name!r} must be a non-empty list of positive ints")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ShapeSpecError(f"shape {shape!r} for {name!r} must hold positive integers")
    return tuple(shape)


def forward_input_names(model: torch.nn.Module, count: int) -> list[str]:
    """Names of forward's first ``count`` positional parameters (``input0``... if unnamed)."""
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        parameters = []
    positional = [p.name for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [n for n in positional if n.isidentifier()][:count]
    return names + [f"input{i}" for i in range(len(names), count)]


def _normalise_dtypes(dtype: str | Mapping[str, str], names: list[str]) -> dict[str, str]:
    if isinstance(dtype, str):
        return {name: check_dtype(dtype) for name in names}
    unknown = set(dtype) - set(names)
    if unknown:
        raise ShapeSpecError(f"dtype given for unknown inputs {sorted(unknown)}; inputs: {names}")
    return {name: check_dtype(dtype.get(name, "float32")) for name in names}


def _reference_inputs(shape_map: Mapping[str, Shape], dtypes: Mapping[str, str], seed: int,
                      input_range: tuple[float, float] | None, hook: Any,
                      model_path: Path) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = {}
    for name, shape in shape_map.items():
        dtype = torch_dtype(dtypes[name])
        if hook is not None:
            tensor = _from_hook(hook, name, shape, dtype, generator, model_path)
        else:
            tensor = random_input(shape, dtype, generator, input_range)
        inputs[name] = tensor
    return inputs


def random_input(shape: Shape, dtype: torch.dtype, generator: torch.Generator,
                 input_range: tuple[float, float] | None = None) -> torch.Tensor:
    """Reference input: normal floats, or uniform over ``input_range`` ([0, 2) for ints)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if str(dtype).removeprefix("torch.") in INTEGER_DTYPES:
        low, high = input_range or (0, 2)
        return torch.randint(int(low), int(high), shape, generator=generator, dtype=dtype)
    if input_range is None:
        return torch.randn(shape, generator=generator).to(dtype)
    low, high = input_range
    return (torch.rand(shape, generator=generator) * (high - low) + low).to(dtype)


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


def _run_reference(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                   shape_map: Mapping[str, Shape], model_path: Path) -> Any:
    label = ",".join(format_shape(s) for s in shape_map.values())
    try:
        with torch.inference_mode():
            first = model(*inputs.values())
            second = model(*inputs.values())
    except Exception as exc:
        raise ModelSourceError(f"{model_path}: forward failed on shape {label}: {describe(exc)}") from exc
    first_leaves, second_leaves = flatten(first), flatten(second)
    for index, (a, b) in enumerate(zip(first_leaves, second_leaves)):
        if a.is_floating_point() and not torch.isfinite(a).all():
            raise ModelSourceError(
                f"{model_path}: forward on shape {label} returned NaN/inf in output {index}; "
                "a reference must be finite (check the weights or --input-range)"
            )
        if not torch.equal(a, b):
            raise ModelSourceError(
                f"{model_path}: forward on shape {label} is not deterministic in eval mode "
                f"(output {index} differs between two runs): remove dropout/sampling from eval"
            )
    return first


def _reference_bytes(inputs: Mapping[str, torch.Tensor], outputs: Any) -> bytes:
    from safetensors.torch import save

    tensors = {f"input.{name}": t.contiguous() for name, t in inputs.items()}
    for index, leaf in enumerate(flatten(outputs)):
        tensors[f"output.{index}"] = leaf.detach().contiguous().clone()
    return save(tensors, metadata={"format": "pt"})
