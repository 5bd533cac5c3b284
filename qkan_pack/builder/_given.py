"""Reference inputs the user gives (``--reference-inputs FILE``): real inputs that exercise
the model where random ones do not (a detector's image, a tokenised sentence).

The file is ``.npz``, ``.npy`` (one input) or ``.safetensors``. Each array is named after
an input (``x`` or forward's own name for a single positional one, ``input_ids``...), optionally with a dot
and any suffix (``x.batch8``) so that one file can hold an array per declared shape. A
declared entry takes, for each input, the array of exactly its shape; an entry for which
the file has none draws random inputs as usual. Arrays are cast to the declared dtype when
that keeps every value (float64 images become float32; integer ids must fit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import InputFileError
from ..format import Shape, format_shape
from ..runtime import read_array_file, torch_dtype

#: What a reference-inputs file may weigh: it is read whole, before the model runs.
MAX_REFERENCE_INPUTS_BYTES = 2 * 1024**3

Given = Mapping[str, Sequence[torch.Tensor]]


def read_reference_inputs(path: Path, dtypes: Mapping[str, str],
                          shapes: Sequence[Mapping[str, Shape]]) -> dict[str, list[torch.Tensor]]:
    """The file's arrays per input name, cast to the declared dtypes; every array must fit
    a declared shape of its input (an array that fits none is a mistake worth saying)."""
    arrays = _read(path)
    given: dict[str, list[torch.Tensor]] = {}
    only = next(iter(dtypes)) if len(dtypes) == 1 else None
    for key, tensor in arrays.items():
        name = key.split(".", 1)[0]
        if only is not None and name == "x":
            name = only  # the single positional input is ``x`` whatever forward calls it
        if name not in dtypes:
            raise InputFileError(path=f"--reference-inputs {path}", problem=(
                f"array {key!r} names no input of the model; name arrays after the inputs "
                f"({', '.join(dtypes)}), optionally with a suffix (x.batch8)"))
        tensor = _cast(tensor, dtypes[name], key, path)
        declared = [tuple(s[name]) for s in shapes]
        if tuple(tensor.shape) not in declared:
            raise InputFileError(path=f"--reference-inputs {path}", problem=(
                f"array {key!r} is {format_shape(tensor.shape) or 'a 0-d array'}, but {name} "
                "is declared as "
                f"{', '.join(format_shape(s) for s in declared)}: give an array of a declared "
                "shape (with its batch dimension)"))
        given.setdefault(name, []).append(tensor)
    if not given:
        raise InputFileError(path=f"--reference-inputs {path}", problem="it holds no arrays")
    return given


def read_calibration(path: Path, dtypes: Mapping[str, str], shapes: Sequence[Mapping[str, Shape]]
                     ) -> list[tuple[int, list[torch.Tensor], str]]:
    """``--calibration`` inputs: samples on which build measures a reduced precision beside
    the references, each as (the declared entry it fits, its inputs in declared order, the
    sample's name for messages).

    Arrays are named as for ``--reference-inputs``; the arrays that share a suffix form one
    sample (``input_ids.a`` with ``attention_mask.a``; a lone ``x`` or ``input_ids`` is a
    sample of its own), and together they must fit one declared entry."""
    where = f"--calibration {path}"
    only = next(iter(dtypes)) if len(dtypes) == 1 else None
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in _read(path, where).items():
        name, _, suffix = key.partition(".")
        name = only if only is not None and name == "x" else name
        if name not in dtypes:
            raise InputFileError(path=where, problem=(
                f"array {key!r} names no input of the model; name arrays after the inputs "
                f"({', '.join(dtypes)}), one suffix per sample (input_ids.a, attention_mask.a)"))
        groups.setdefault(suffix, {})[name] = _cast(tensor, dtypes[name], key, path, where)
    samples = []
    for suffix, arrays in groups.items():
        label = f"sample {suffix!r}" if suffix else "the unsuffixed sample"
        missing = [name for name in dtypes if name not in arrays]
        if missing:
            raise InputFileError(path=where, problem=(
                f"{label} has no array for {', '.join(missing)}: give every input of a "
                "sample under one suffix"))
        fits = [index for index, shape in enumerate(shapes)
                if all(tuple(arrays[name].shape) == tuple(shape[name]) for name in dtypes)]
        if not fits:
            found = ", ".join(f"{n} {format_shape(arrays[n].shape) or '0-d'}" for n in dtypes)
            raise InputFileError(path=where, problem=(
                f"{label} ({found}) fits no declared shape: calibration inputs are measured "
                "at the declared shapes"))
        samples.append((fits[0], [arrays[name] for name in dtypes], label))
    if not samples:
        raise InputFileError(path=where, problem="it holds no arrays")
    return samples


def given_of_shape(given: Given | None, name: str, shape: Shape) -> torch.Tensor | None:
    """The given array for input ``name`` of exactly ``shape``, if any."""
    for tensor in (given or {}).get(name, ()):
        if tuple(tensor.shape) == tuple(shape):
            return tensor
    return None


def _read(path: Path, where: str | None = None) -> dict[str, torch.Tensor]:
    where = where or f"--reference-inputs {path}"
    arrays = read_array_file(path, where, MAX_REFERENCE_INPUTS_BYTES)
    return {key or "x": value if isinstance(value, torch.Tensor)
            else _tensor(value, key, where) for key, value in arrays.items()}


def _tensor(array: np.ndarray, key: str, where: str) -> torch.Tensor:
    """A numpy array as a tensor, refused by name where torch has no such dtype (text,
    dates, records)."""
    try:
        return torch.from_numpy(np.require(array, requirements="C"))  # 0-d stays 0-d
    except TypeError:
        raise InputFileError(path=where, problem=(
            f"array {key!r} has numpy dtype {array.dtype}, which is no tensor dtype; save "
            "numbers or booleans")) from None


def _cast(tensor: torch.Tensor, dtype_name: str, key: str, path: Path,
          where: str | None = None) -> torch.Tensor:
    """``tensor`` in the declared dtype: floats from any number type, integers and bools
    only when every value survives the cast."""
    dtype = torch_dtype(dtype_name)
    if tensor.dtype == dtype:
        return tensor
    if dtype.is_floating_point and (tensor.dtype.is_floating_point or not tensor.dtype.is_complex):
        cast = tensor.to(dtype)
        if bool(torch.isfinite(cast).all()) or not bool(torch.isfinite(tensor.double()).all()):
            return cast
    elif not dtype.is_floating_point and not tensor.dtype.is_floating_point:
        cast = tensor.to(dtype)
        if torch.equal(cast.to(torch.int64), tensor.to(torch.int64)):
            return cast
    raise InputFileError(path=where or f"--reference-inputs {path}", problem=(
        f"array {key!r} is {str(tensor.dtype).removeprefix('torch.')}, and input "
        f"{key.split('.', 1)[0]} is declared {dtype_name}: its values do not survive the cast; "
        f"save it as {dtype_name} (numpy: array.astype(np.{dtype_name}))"))
