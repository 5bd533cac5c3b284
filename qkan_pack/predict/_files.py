"""Inputs from files, outputs to files or a table.

Inputs: ``.npy`` (one array), ``.npz`` and ``.safetensors`` (arrays named after the inputs,
or the only array), ``.json`` (nested lists of numbers, or an object of them by input name;
JSON has no dtypes, so numbers take the declared dtype when they fit it exactly). Arrays
keep their dtype: the predictor checks shapes and dtypes as for any call, with the same
errors. Outputs: ``.npy`` (a single tensor), ``.npz``/``.safetensors``/``.json`` (every
tensor by its place in the output: ``logits``, ``output``, ``parts.0``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError, InputFileError
from ..runtime import read_array_file

INPUT_SUFFIXES = (".npy", ".npz", ".safetensors", ".json")
OUTPUT_SUFFIXES = (".npy", ".npz", ".safetensors", ".json")
#: Input files are read whole: refuse what no declared shape could need.
MAX_INPUT_BYTES = 4 * 1024**3


def read_inputs(given: Sequence[tuple[str | None, Path]], names: Sequence[str],
                dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Every input by name from ``given`` (``(name or None, file)`` pairs): a named pair
    gives that input; an unnamed file gives every input it has an array for by name, or the
    only input from its only array."""
    arrays: dict[str, np.ndarray] = {}
    for name, path in given:
        if name == "x" and len(names) == 1:
            name = names[0]  # the single positional input is ``x`` whatever forward calls it
        if name is not None and name not in names:
            raise _error(path, f"no input is named {name!r}; inputs are {', '.join(names)}"
                               + (" (or x)" if len(names) == 1 else ""))
        found = _read(path, dtypes)
        if name is not None:
            arrays[_one(found, name, path)] = found.get(name, next(iter(found.values())))
            continue
        if len(names) == 1 and len(found) == 1:
            arrays[names[0]] = next(iter(found.values()))
        elif list(found) == [""]:
            raise _error(path, f"holds one unnamed array and the model takes "
                               f"{', '.join(names)}: name its input, --input {names[0]}={path}")
        else:
            unknown = sorted(set(found) - set(names))
            if unknown:
                raise _error(path, f"holds {unknown}, which name no input; inputs are "
                                   f"{', '.join(names)}")
            arrays.update(found)
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(f"no value for input(s) {missing}: pass --input NAME=FILE for each "
                         f"of {', '.join(names)}")
    return {n: arrays[n] for n in names}


def _one(found: Mapping[str, np.ndarray], name: str, path: Path) -> str:
    if name in found or len(found) == 1:
        return name
    raise _error(path, f"holds {sorted(found)}, none named {name!r}")


def _read(path: Path, dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    if path.suffix not in INPUT_SUFFIXES:
        raise _error(path, f"unknown file type {path.suffix or '(none)'}; use "
                           f"{', '.join(INPUT_SUFFIXES)}")
    if path.suffix != ".json":
        arrays = read_array_file(path, f"--input {path}", MAX_INPUT_BYTES)
        # numpy for the predictor (numpy in, numpy advice on a wrong dtype); bfloat16,
        # which numpy lacks, stays a tensor
        return {key: value.numpy() if isinstance(value, torch.Tensor)
                and value.dtype != torch.bfloat16 else value for key, value in arrays.items()}
    try:
        if path.stat().st_size > MAX_INPUT_BYTES:
            raise _error(path, f"larger than {MAX_INPUT_BYTES} bytes")
        return _from_json(json.loads(path.read_text()), dtypes, path)
    except InputFileError:
        raise
    except Exception as exc:  # json's own
        raise _error(path, f"cannot be read: {exc}") from None


def _from_json(data: Any, dtypes: Mapping[str, str], path: Path) -> dict[str, np.ndarray]:
    if isinstance(data, dict):
        return {name: _json_array(value, dtypes.get(name), path, name)
                for name, value in data.items()}
    only = next(iter(dtypes.values())) if len(dtypes) == 1 else None
    return {"": _json_array(data, only, path, "the array")}


def _json_array(value: Any, dtype: str | None, path: Path, what: str) -> np.ndarray:
    """Nested lists as the declared dtype, when every number fits it exactly."""
    try:
        array = np.asarray(value, dtype=np.float64 if dtype != "bool" else np.bool_)
    except (ValueError, TypeError) as exc:
        raise _error(path, f"{what} is not a rectangular array of numbers ({exc})") from None
    if dtype is None or dtype == "bfloat16":
        return array.astype(np.float32)
    target = np.dtype(dtype)
    cast = array.astype(target)
    if target.kind in "iub" and not np.array_equal(cast.astype(np.float64), array):
        raise _error(path, f"{what} holds values that are not {dtype} (fractions, or out "
                           "of range)")
    return cast


def named_outputs(output: Any, prefix: str = "") -> dict[str, Any]:
    """Every tensor (or numpy array) of a structured output by its place: ``logits``,
    ``parts.0``; a bare tensor is ``output``."""
    if isinstance(output, Mapping):
        items = list(output.items())
    elif isinstance(output, (tuple, list)):
        items = [(str(i), v) for i, v in enumerate(output)]
    elif output is None:
        return {}
    else:
        return {prefix or "output": output}
    named: dict[str, Any] = {}
    for key, value in items:
        named.update(named_outputs(value, f"{prefix}.{key}" if prefix else str(key)))
    return named


def write_outputs(outputs: Mapping[str, Any], path: Path) -> Path:
    """Write named outputs (numpy arrays) to ``path`` by its suffix."""
    arrays = {name: np.asarray(value) for name, value in outputs.items()}
    if path.suffix not in OUTPUT_SUFFIXES:
        raise _error(path, f"unknown output type {path.suffix or '(none)'}; use "
                           f"{', '.join(OUTPUT_SUFFIXES)}", option="--output")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".npy":
        if len(arrays) != 1:
            raise _error(path, f"the model returns {len(arrays)} tensors ({', '.join(arrays)}); "
                               ".npy holds one: write .npz, .safetensors or .json",
                         option="--output")
        np.save(path, next(iter(arrays.values())))
    elif path.suffix == ".npz":
        np.savez(path, **arrays)
    elif path.suffix == ".safetensors":
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))
    else:
        path.write_text(json.dumps({k: v.tolist() for k, v in arrays.items()}) + "\n")
    return path


def summarize(outputs: Mapping[str, Any], class_labels: Sequence[str] = ()) -> str:
    """A table of the outputs: shape, dtype, range and mean; the top class per row where the
    model records class labels and an output's last dimension matches them."""
    lines = [f"{'output':<24}{'shape':<16}{'dtype':<10}{'min':>11}{'mean':>11}{'max':>11}"]
    for name, value in outputs.items():
        array = np.asarray(value)
        shape = "x".join(map(str, array.shape)) or "scalar"
        numeric = array.size and array.dtype.kind in "fiub"
        low, mean, high = ((float(array.min()), float(array.astype(np.float64).mean()),
                            float(array.max())) if numeric else (math.nan,) * 3)
        lines.append(f"{name:<24}{shape:<16}{array.dtype.name:<10}{low:>11.4g}{mean:>11.4g}"
                     f"{high:>11.4g}")
        if class_labels and array.ndim >= 1 and array.shape[-1] == len(class_labels):
            top = np.asarray(array.reshape(-1, array.shape[-1]).argmax(axis=-1))
            shown = ", ".join(class_labels[int(i)] for i in top[:16])
            lines.append(f"  top class per row: {shown}" + (" …" if top.size > 16 else ""))
    return "\n".join(lines)


def _error(path: Path, problem: str, option: str = "--input") -> InputFileError:
    return InputFileError(path=f"{option} {path}", problem=problem)
