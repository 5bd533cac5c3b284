"""``BuildOptions``: every choice ``build()`` takes besides the model file and its shapes,
checked in one place before the model file is imported.

What can be checked from the options alone is checked here (types, the factory config, the
capture policy, the seed, precision and its bound, the metadata); what needs the declared
inputs (an input range against their dtypes, pad values and names, batch sizes against the
shapes) is checked when the inputs are declared, still before the model runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from .._checked import CheckedOptions
from ..errors import OptionError, ShapeSpecError
from ..format import (
    CAPTURE_POLICIES,
    DEFAULT_VERSION,
    CapturePolicy,
    Metadata,
    PadValue,
    check_config,
    check_metadata,
    check_seed,
)
from ._precision import check_precision_options

PathArg = str | os.PathLike[str]


@dataclass(frozen=True)
class BuildOptions(CheckedOptions):
    """How to build an artifact (``build(model_path, shapes, options=BuildOptions(...))``, or
    the same fields as keywords).

    - ``output``: the artifact directory (default ``artifacts/<model file stem>``);
      ``force`` replaces an artifact already there;
    - ``dtype``: one dtype for every input, or ``{input_name: dtype}`` (names or
      ``torch.dtype``s; default float32);
    - ``entry``, ``config``: the factory in the model file and its keyword arguments;
      ``weights``: a safetensors file or torch state dict loaded into the model;
      ``includes``: extra ``.py`` files or package folders beside the model file;
    - ``capture``, ``submodules``: the capture policy recorded for the GPU runtime;
    - ``input_range`` (LOW, HIGH), ``seed``: random reference inputs drawn from [LOW, HIGH)
      (floats; integers from [int(LOW), int(HIGH))), shape i seeded with ``seed + i``;
      ``reference_inputs``: a file of real inputs used for the shapes they fit;
      ``allow_constant_references``: build even when the references carry no information;
    - ``name`` (default: the model file's stem), ``model_version``, ``description``,
      ``license``, ``labels``: what the model is (``format.Metadata``);
    - ``batch_sizes``: the shapes are per-row shapes, declared at each of these sizes;
    - ``pad``: ``{input_name: value}`` (``x`` for a single positional input): calls may be
      smaller than a declared shape, padded with these values, proven at build;
    - ``precision`` (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``auto``), ``max_error``,
      ``calibration``: reduced precision, gated against the float32 outputs;
    - ``progress``: progress bars on stderr (None: when stderr is a terminal).

    Every field is checked and normalised here (a value outside its domain is an
    ``OptionError`` naming it, text that does not parse a ``ShapeSpecError``), so a wrong
    option fails before the model file is imported.
    """

    CALL: ClassVar[str] = "build()"
    output: PathArg | None = None
    dtype: str | torch.dtype | Mapping[str, str | torch.dtype] = "float32"
    entry: str = "build_model"
    config: Mapping[str, Any] = field(default_factory=dict)
    weights: PathArg | None = None
    includes: Sequence[PathArg] = ()
    capture: str = "auto"
    submodules: Sequence[str] = ()
    input_range: tuple[float, float] | None = None
    seed: int = 0
    reference_inputs: PathArg | None = None
    allow_constant_references: bool = False
    name: str | None = None
    model_version: str = DEFAULT_VERSION
    description: str = ""
    license: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    batch_sizes: Sequence[int] | None = None
    pad: Mapping[str, PadValue] | None = None
    precision: str = "fp32"
    max_error: float | None = None
    calibration: PathArg | None = None
    force: bool = False
    progress: bool | None = None

    def __post_init__(self) -> None:
        precision, max_error = check_precision_options(self.precision, self.max_error)
        checked = {
            "output": _path("output", self.output),
            "dtype": _dtype_names(self.dtype),
            "entry": _text("entry", self.entry),
            "weights": _path("weights", self.weights),
            "includes": _paths("includes", self.includes),
            **_capture(self.capture, self.submodules),
            "seed": check_seed(self.seed),  # torch takes seeds below 2**64 only
            "reference_inputs": _path("reference_inputs", self.reference_inputs),
            "allow_constant_references": _flag("allow_constant_references",
                                               self.allow_constant_references),
            "precision": precision,
            "max_error": max_error,
            "calibration": _calibration(self.calibration, precision),
            "labels": _metadata(self).labels,
            "config": check_config(self.config if self.config is not None else {}),
            "batch_sizes": None if self.batch_sizes is None else _sequence(
                "batch_sizes", self.batch_sizes, "a list of batch sizes, e.g. [1, 8, 32]"),
            "pad": _pad(self.pad),
            "force": _flag("force", self.force),
            "progress": None if self.progress is None else _flag("progress", self.progress),
        }
        self._keep(checked)

    @property
    def dtype_names(self) -> str | dict[str, str]:
        """``dtype`` as names (what ``__post_init__`` keeps: torch dtypes become names)."""
        return _dtype_names(self.dtype)

    @property
    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy(policy=self.capture, submodules=tuple(self.submodules))

    def metadata(self, model_path: Path) -> Metadata:
        """What the model is (its fields checked with the others), named after
        ``model_path`` when no ``name`` was given."""
        return Metadata(name=_model_name(self.name, model_path), version=self.model_version,
                        description=self.description, license=self.license,
                        labels=dict(self.labels))


def _metadata(options: BuildOptions) -> Metadata:
    """The metadata options checked (``format.check_metadata``), the name left empty when
    the model file's stem will name the model."""
    return check_metadata(name=options.name if options.name is not None else "",
                          version=options.model_version, description=options.description,
                          license=options.license, labels=options.labels)


def _model_name(name: str | None, model_path: Path) -> str:
    """The given name, else the model file's stem made URL-safe (``my model.py``: my_model)."""
    if name is not None:
        return name
    return re.sub(r"[^A-Za-z0-9._-]", "_", model_path.stem).lstrip("._-")[:128] or "model"


def _dtype_names(dtype: Any) -> str | dict[str, str]:
    """``dtype`` as names: a dtype name, a ``torch.dtype``, or a ``{input: either}`` mapping."""
    def one(value: Any, where: str) -> str:
        if isinstance(value, torch.dtype):
            return str(value).removeprefix("torch.")
        if isinstance(value, str):
            return value
        raise OptionError(option=where, value=value,
                          expected="a dtype name ('float32', 'int64') or a torch.dtype")

    if isinstance(dtype, Mapping):
        return {name: one(value, f"dtype[{name!r}]") for name, value in dtype.items()}
    return one(dtype, "dtype")


def _capture(capture: Any, submodules: Any) -> dict[str, Any]:
    """The capture policy and its submodule class names, stripped."""
    if capture not in CAPTURE_POLICIES:
        raise ShapeSpecError(f"capture policy {capture!r} is not one of {', '.join(CAPTURE_POLICIES)}")
    names = tuple(s.strip() for s in _sequence("submodules", submodules,
                                               "a list of class names, e.g. ['Block']")
                  if s.strip())
    for name in names:
        if not name.isidentifier():
            raise ShapeSpecError(f"--submodules entry {name!r} is not a class name")
    if names and capture == "full":
        raise ShapeSpecError("--submodules has no effect with --capture full; use submodules/auto")
    return {"capture": capture, "submodules": names}


def _calibration(calibration: Any, precision: str) -> Path | None:
    if calibration is not None and precision == "fp32":
        raise OptionError(option="calibration", value=str(calibration),
                          expected="no file with precision fp32 (calibration inputs measure a "
                                   "reduced precision: pass --precision)")
    return _path("calibration", calibration)


def _pad(pad: Any) -> dict[str, PadValue] | None:
    """``{input_name: value}``, or None for no padding (an empty mapping too)."""
    if pad is None:
        return None
    if not isinstance(pad, Mapping):
        raise OptionError(option="pad", value=pad,
                          expected="a mapping of input names to pad values, e.g. {'x': 0.0}")
    return dict(pad) or None


def _path(option: str, value: Any) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise OptionError(option=option, value=value, expected="a file path")
    return Path(value)


def _paths(option: str, value: Any) -> tuple[Path, ...]:
    items = _sequence(option, value, "a list of file paths")
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise OptionError(option=option, value=item,
                              expected="a list of file paths; this one is not a path")
    return tuple(Path(item) for item in items)


def _sequence(option: str, value: Any, expected: str) -> tuple[Any, ...]:
    """A list or tuple, never a lone string (whose characters would each be an item)."""
    if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Sequence):
        raise OptionError(option=option, value=value, expected=expected)
    return tuple(value)


def _text(option: str, value: Any) -> str:
    if not isinstance(value, str):
        raise OptionError(option=option, value=value, expected="text")
    return value


def _flag(option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionError(option=option, value=value, expected="True or False")
    return value
