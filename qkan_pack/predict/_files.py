"""Inputs from files, outputs to files or a table.

Inputs: ``.npy`` (one array), ``.npz`` and ``.safetensors`` (arrays named after the inputs,
or the only array), ``.json`` (nested lists of numbers or ``{"b64", "dtype", "shape"}``
tensors, or an object of them by input name, either alone or as a serve request body, its
``encoding`` (the reply's) aside; JSON numbers have no dtype, so they take the declared one
when they are exactly that; everything is read as serve reads a JSON request:
``runtime.json_input``, ``runtime.b64_tensor``). Arrays keep their dtype, which must be the
input's (a wrong one is refused naming the file, both dtypes and how to convert the file);
the predictor checks shapes as for any call, with the same errors.

Outputs: ``.npy`` (a single tensor), ``.npz``/``.safetensors``/``.json`` (every tensor by
the name the manifest, ``GET /`` and the Open Inference Protocol give it: ``output``,
``output.logits``, ``output[0]``), written whole or not at all, never inside an artifact.
Only ``.safetensors`` holds bfloat16 (the others get float32, exactly, with a note), and
JSON holds no NaN or infinity (refused: ``.npz`` and ``.safetensors`` keep them).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import FileReadError, InputError, InputFileError, QkanPackError
from ..format import (
    INTEGER_DTYPES,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    Manifest,
    loads_strict,
    parse_manifest,
)
from ..runtime import (
    ENCODINGS,
    REQUEST_KEYS,
    b64_tensor,
    check_int_range,
    describe_output,
    dtype_name,
    flatten,
    is_b64_tensor,
    json_input,
    map_leaves,
    numbers_array,
    read_array_file,
    read_regular_file,
    refuse_unsafe_output,
    typed_input,
)

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
    sources: dict[str, Path] = {}
    for name, path in given:
        if name == "x" and len(names) == 1:
            name = names[0]  # the single positional input is ``x`` whatever forward calls it
        if name is not None and name not in names:
            raise _error(path, f"no input is named {name!r}; inputs are {', '.join(names)}"
                               + (" (or x)" if len(names) == 1 and names[0] != "x" else ""))
        found = _read(path, dtypes, name)
        if name is not None:
            here = {_one(found, name, path): found.get(name, next(iter(found.values())))}
        elif len(names) == 1 and len(found) == 1:
            here = {names[0]: next(iter(found.values()))}
        elif list(found) == [""]:
            raise _error(path, f"holds one unnamed array and the model takes "
                               f"{', '.join(names)}: name its input, --input {names[0]}={path}")
        else:
            unknown = sorted(set(found) - set(names))
            if unknown:
                raise _error(path, f"holds {unknown}, which name no input; inputs are "
                                   f"{', '.join(names)}")
            here = found
        twice = next((n for n in here if n in arrays), None)
        if twice is not None:
            raise _error(path, f"input {twice!r} is given twice (--input {sources[twice]} "
                               "gives it too): give each input once")
        arrays.update(here)
        sources.update(dict.fromkeys(here, path))
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(f"no value for input(s) {missing}: pass --input NAME=FILE for each "
                         f"of {', '.join(names)}")
    for name in names:
        _check_file_dtype(arrays[name], name, dtypes[name], sources[name])
    return {n: arrays[n] for n in names}


def _check_file_dtype(array: Any, name: str, want: str, path: Path) -> None:
    """An array file's values for input ``name`` must be its dtype ``want`` (the predictor
    refuses any other): said here in the file's terms, the dtype found and the one wanted
    and how to convert the file, or, for integers, a value the wanted dtype cannot hold
    (``astype`` would wrap 2**63 into int64 silently). JSON values already fit."""
    found = dtype_name(array.dtype) if isinstance(array, torch.Tensor) else array.dtype.name
    if found == want:
        return
    if isinstance(array, np.ndarray) and array.dtype.kind in "iu" and want in INTEGER_DTYPES:
        try:
            check_int_range(array, name, want)
        except InputError as exc:
            raise _error(path, exc.problem) from None
    if path.suffix == ".safetensors":
        how = (f"convert its tensor with tensor.to(torch.{want}) and save the file again "
               "(safetensors.torch.save_file)")
    elif want == "bfloat16":
        how = ("numpy has no bfloat16: write a .safetensors file of a bfloat16 tensor "
               "(tensor.to(torch.bfloat16))")
    else:
        how = f"convert it with array.astype(numpy.{want}) and save the file again"
    raise _error(path, f"input {name!r} is {found} in the file, and the model takes {want}: "
                       f"{how}")


def _one(found: Mapping[str, np.ndarray], name: str, path: Path) -> str:
    if name in found or len(found) == 1:
        return name
    raise _error(path, f"holds {sorted(found)}, none named {name!r}")


def _read(path: Path, dtypes: Mapping[str, str], name: str | None) -> dict[str, Any]:
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
        data = loads_strict(read_regular_file(path, limit=MAX_INPUT_BYTES))
    except FileReadError as exc:
        raise _error(path, exc.problem) from None
    except Exception as exc:  # the strict parser's
        raise _error(path, f"cannot be read: {exc}") from None
    return _from_json(data, dtypes, path, name)


def _from_json(data: Any, dtypes: Mapping[str, str], path: Path,
               name: str | None) -> dict[str, Any]:
    """The arrays of a JSON file: an object of them by input name, or one array. The one
    array of a file given for input ``name`` (or of a model with one input) is read as that
    input whatever it is called."""
    if name is None and len(dtypes) == 1:
        name = next(iter(dtypes))
    data = _request_inputs(data, dtypes, path)
    if not isinstance(data, dict) or is_b64_tensor(data, list(dtypes)):
        return {"": _json_array(data, name, dtypes, path)}
    arrays = {}
    for key, value in data.items():
        target = key if key in dtypes else name if len(data) == 1 else None
        arrays[key] = _json_array(value, target, dtypes, path)
    return arrays


def _request_inputs(data: Any, dtypes: Mapping[str, str], path: Path) -> Any:
    """What a serve request body (``POST /``: ``{"inputs": T}``, ``{"inputs": {"x": T}}``,
    optionally ``"encoding"``) holds under ``inputs``, so that a body sent to serve runs in
    predict too; anything else as it is. ``encoding`` chooses how serve writes its reply
    (``list`` or ``base64``); predict writes what ``--output`` names, so it is checked as
    serve checks it and has no other effect. For a model with an input named ``inputs``,
    that key stays the input."""
    if not isinstance(data, dict) or "inputs" not in data or "inputs" in dtypes:
        return data
    unknown = sorted(set(data) - REQUEST_KEYS)
    if unknown:
        raise _error(path, f'is a serve request (it has "inputs") with unknown key(s) '
                           f"{unknown}; a request holds {sorted(REQUEST_KEYS)} only")
    encoding = data.get("encoding", "list")
    if encoding not in ENCODINGS:
        raise _error(path, f'is a serve request with "encoding": {json.dumps(encoding):.40}, '
                           f"which is none of {', '.join(ENCODINGS)} (the reply's encoding)")
    return data["inputs"]


def _json_array(value: Any, name: str | None, dtypes: Mapping[str, str], path: Path) -> Any:
    """JSON numbers or a base64 tensor as input ``name``, read as serve reads them
    (``runtime.json_input``: integers exactly, booleans only as true/false;
    ``runtime.b64_tensor``: the dtype sent must be the input's; floats finite in both); a
    bfloat16 input as a tensor (numpy has none). For no input (a name the caller then
    refuses) only the values are read."""
    where = f"input {name!r}" if name else "the array"
    try:
        if isinstance(value, dict):  # where one array stands, as serve's parse_tensor
            array, sent = b64_tensor(value, where)
            if name is None:
                return array
            array = typed_input(array, sent, name, dtypes[name])
        elif name is None:
            return numbers_array(value, where)
        else:
            array = json_input(value, name, dtypes[name], where)
    except InputError as exc:
        raise _error(path, exc.problem) from None
    if dtypes[name] == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return array


def named_outputs(output: Any) -> dict[str, torch.Tensor]:
    """Every tensor (or numpy array) of a structured output by its place, as the manifest,
    ``GET /`` and the Open Inference Protocol name it (``OutputNode.leaf_names``: ``output``,
    ``output.logits``, ``output[0]``), each as a host tensor."""
    leaves = map_leaves(_host_tensor, output)
    return dict(zip(describe_output(leaves).leaf_names(), flatten(leaves)))


def _host_tensor(value: Any) -> torch.Tensor:
    tensor = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    return tensor.detach().cpu()


def check_output(path: Path, artifact: Path | None = None, sources: Sequence[Path] = ()
                 ) -> Path:
    """Where ``-o`` writes (symlinks followed, as the write would), refused before the load
    when predict cannot or must not write there: an unknown type, one of the ``sources`` it
    reads its inputs from (the outputs would replace them), or a path inside an artifact
    (``runtime.refuse_unsafe_output``, the rule build, warm and sign follow). Given
    the ``artifact`` directory, also when its manifest shows that no declared entry's outputs
    fit the file (``output_problem``: several outputs to ``.npy``, a name ``.npz`` cannot
    hold), rather than after the load and the forward."""
    if path.suffix not in OUTPUT_SUFFIXES:
        raise _error(path, f"unknown output type {path.suffix or '(none)'}; use "
                           f"{', '.join(OUTPUT_SUFFIXES)}", option="--output")
    target = Path(os.path.realpath(path))
    _refuse_dangling_link(path, target)
    if any(Path(os.path.realpath(source)) == target for source in sources):
        raise _error(path, "is also an --input file: writing the outputs there would replace "
                           "the inputs; choose another -o", option="--output")
    refuse_unsafe_output(target)
    manifest = _peek_manifest(artifact) if artifact is not None else None
    if manifest is not None:
        problems = [output_problem(list(entry.outputs.leaf_names()), path)
                    for entry in manifest.shapes]
        if problems and all(problems):
            raise _error(path, str(problems[0]), option="--output")
    return target


def _refuse_dangling_link(path: Path, target: Path) -> None:
    """``path``, or a folder on it, may be a symlink, written through, but not one to
    nowhere where the write would need a folder made: predict creates the missing folders of
    the path it is given, never those a symlink points to (``-o out.npy``, a link to
    ``/missing/out.npy``, created ``/missing``; as root, anywhere)."""
    if target.parent.is_dir():
        return
    link = next((p for p in (path, *path.parents) if p.is_symlink() and not p.exists()), None)
    if link is not None:
        raise _error(path, f"{link} is a symlink to {os.path.realpath(link)}, and "
                           f"{target.parent} does not exist: predict creates the missing "
                           "folders of the path it is given, never those a symlink points to; "
                           f"create {target.parent} or choose another path", option="--output")


def _peek_manifest(artifact: Path) -> Manifest | None:
    """``artifact``'s manifest read without verifying the artifact, or None where it cannot
    be read: it only lets a doomed ``-o`` be refused early; the load that follows verifies
    everything and says what is wrong with an artifact."""
    try:
        data = read_regular_file(artifact / MANIFEST_NAME, limit=MAX_MANIFEST_BYTES,
                                 follow_symlinks=False)
        return parse_manifest(data)
    except QkanPackError:
        return None


#: Characters an ``.npz`` member name cannot hold faithfully: zip cuts a name at NUL (two
#: outputs could become one member), and a slash or backslash makes the name a path (``../``
#: would climb out of wherever the archive is unpacked).
_NPZ_UNSAFE = ("\x00", "/", "\\")


def output_problem(names: Sequence[str], path: Path) -> str | None:
    """Why outputs of these names cannot be written to ``path`` by its suffix, or None:
    ``.npy`` holds one array, and ``.npz`` member names hold no NUL, slash or backslash
    (``.safetensors`` and ``.json`` hold any name)."""
    if path.suffix == ".npy" and len(names) != 1:
        return (f"the model returns {len(names)} tensors ({', '.join(map(repr, names))}); .npy "
                "holds one: write .npz, .safetensors or .json")
    if path.suffix == ".npz":
        for name in names:
            if any(char in name for char in _NPZ_UNSAFE):
                return (f"output {name!r} has a NUL, slash or backslash, which an .npz member "
                        "name cannot hold (it would be cut short or become a path): write "
                        ".safetensors or .json")
    return None


def write_outputs(outputs: Mapping[str, Any], path: Path) -> tuple[Path, list[str]]:
    """Write named outputs (tensors or numpy arrays) to ``path`` by its suffix, whole or not
    at all (a temporary file beside it, renamed into place). Returns the path written and a
    note per bfloat16 output written as float32 (only ``.safetensors`` holds bfloat16)."""
    target = check_output(path)
    problem = output_problem(list(outputs), path)
    if problem is not None:
        raise _error(path, problem, option="--output")
    tensors = {name: _host_tensor(value) for name, value in outputs.items()}
    notes = [f"output {name} is bfloat16, written as float32 ({path.suffix} has no bfloat16; "
             ".safetensors keeps it)" for name, t in tensors.items()
             if t.dtype == torch.bfloat16 and path.suffix != ".safetensors"]
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        data = save({k: t.contiguous().clone() for k, t in tensors.items()})
    else:
        data = _numpy_bytes({k: _numpy(t) for k, t in tensors.items()}, path)
    path.parent.mkdir(parents=True, exist_ok=True)  # the path's own folders, no link's
    _replace(target, data)
    return path, notes


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A host tensor as numpy; bfloat16 (which numpy lacks) as float32, exactly."""
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _numpy_bytes(arrays: Mapping[str, np.ndarray], path: Path) -> bytes:
    """``.npy``, ``.npz`` or ``.json`` bytes of the arrays."""
    buffer = io.BytesIO()
    if path.suffix == ".npy":  # one array: output_problem
        np.save(buffer, next(iter(arrays.values())), allow_pickle=False)
    elif path.suffix == ".npz":
        # numpy's own member format, written one by one: np.savez(**arrays) takes an output
        # named "file" or "allow_pickle" as its own argument
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
            for name, array in arrays.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
    else:
        return _json_bytes(arrays, path)
    return buffer.getvalue()


def _json_bytes(arrays: Mapping[str, np.ndarray], path: Path) -> bytes:
    """Strict JSON: an output holding NaN or an infinity, which JSON has no number for, is
    refused (written as ``NaN`` it would be no JSON a strict reader takes)."""
    for name, array in arrays.items():
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            raise _error(path, f"output {name} holds NaN or Infinity, which JSON cannot hold: "
                               "write .npz or .safetensors", option="--output")
    return (json.dumps({k: v.tolist() for k, v in arrays.items()}, allow_nan=False)
            + "\n").encode()


def _replace(target: Path, data: bytes) -> None:
    """Write ``target`` whole: a temporary file beside it, flushed, renamed over it."""
    descriptor, staged = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                          suffix=".partial")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            os.fchmod(handle.fileno(), 0o644)  # as a plain open() makes it, not mkstemp's 0600
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staged, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise


def summarize(outputs: Mapping[str, Any], class_labels: Sequence[str] = (),
              shown: Callable[[str], str] = str) -> str:
    """A table of the outputs: shape, dtype, range and mean; the top class per row where the
    model records class labels and an output's last dimension matches them. Output names and
    labels are the artifact's text, each written as ``shown`` makes it (the CLI's
    ``visible``: a newline in a label would otherwise print a line of the artifact's
    choosing)."""
    lines = [f"{'output':<24}{'shape':<16}{'dtype':<10}{'min':>11}{'mean':>11}{'max':>11}"]
    for name, value in outputs.items():
        tensor = _host_tensor(value)
        array = _numpy(tensor)
        shape = "x".join(map(str, array.shape)) or "scalar"
        numeric = array.size and array.dtype.kind in "fiub"
        low, mean, high = ((float(array.min()), float(array.astype(np.float64).mean()),
                            float(array.max())) if numeric else (math.nan,) * 3)
        dtype = str(tensor.dtype).removeprefix("torch.")
        lines.append(f"{shown(name):<23} {shape:<16}{dtype:<10}{low:>11.4g}{mean:>11.4g}"
                     f"{high:>11.4g}")  # a long name keeps a space before its shape
        if class_labels and array.ndim >= 1 and array.shape[-1] == len(class_labels):
            top = np.asarray(array.reshape(-1, array.shape[-1]).argmax(axis=-1))
            labels = ", ".join(shown(class_labels[int(i)]) for i in top[:16])
            lines.append(f"  top class per row: {labels}" + (" …" if top.size > 16 else ""))
    return "\n".join(lines)


def _error(path: Path, problem: str, option: str = "--input") -> InputFileError:
    return InputFileError(path=f"{option} {path}", problem=problem)
