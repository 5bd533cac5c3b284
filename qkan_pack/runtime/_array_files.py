"""Arrays a user gives in a file (``build --reference-inputs``, ``predict --input``): one
reader for ``.npz``, ``.npy`` and ``.safetensors``, with what makes such a file safe to read.

The file is opened once through the one reader of supplied files (``open_regular_file``: a
FIFO or a device is refused without waiting on it or reading it) and read from that
descriptor. Nothing is unpickled (``allow_pickle=False``); a file, or what an ``.npz``
unpacks to (read from its zip directory before anything is unpacked: a few megabytes of
compressed zeros unpack to gigabytes), is refused over the caller's limit; numpy arrays
come back in native byte order, safetensors as tensors (bfloat16, which numpy lacks,
included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import FileReadError, InputFileError
from ._files import open_regular_file, read_regular_file

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["ARRAY_SUFFIXES", "read_array_file"]

ARRAY_SUFFIXES = (".npz", ".npy", ".safetensors")


def read_array_file(path: Path, where: str, limit: int) -> dict[str, Any]:
    """The file's arrays by name (a bare ``.npy``'s under ``""``): numpy arrays, or tensors
    from ``.safetensors``. Any problem is an ``InputFileError`` at ``where`` (the option and
    path as the user gave them)."""
    if path.suffix not in ARRAY_SUFFIXES:
        raise InputFileError(path=where, problem=(
            f"unknown file type {path.suffix or '(none)'}; use {', '.join(ARRAY_SUFFIXES)}"))
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load

            return dict(load(read_regular_file(path, limit=limit)))
        with open_regular_file(path, limit=limit) as handle:
            return _numpy_arrays(handle, path.suffix, where, limit)
    except FileReadError as exc:
        raise InputFileError(path=where, problem=exc.problem) from None
    except InputFileError:
        raise
    except Exception as exc:  # numpy (pickles refused), zip and safetensors each their own
        raise InputFileError(path=where, problem=f"cannot be read: {exc}") from None


def _numpy_arrays(handle: BinaryIO, suffix: str, where: str, limit: int) -> dict[str, Any]:
    """The arrays of an opened ``.npz`` or ``.npy``, streamed from its descriptor."""
    if suffix == ".npz":
        _check_unpacked_size(handle, where, limit)
        handle.seek(0)
    loaded = np.load(handle, allow_pickle=False)
    if isinstance(loaded, np.ndarray):
        return {"": _native(loaded)}
    with loaded:
        return {key: _native(loaded[key]) for key in loaded.files}


def _check_unpacked_size(handle: BinaryIO, where: str, limit: int) -> None:
    import zipfile  # here: the runtime package imports this module with the load path's

    with zipfile.ZipFile(handle) as archive:
        unpacked = sum(member.file_size for member in archive.infolist())
    if unpacked > limit:
        raise InputFileError(path=where, problem=(
            f"its arrays unpack to {unpacked} bytes, more than the {limit} read here"))


def _native(array: np.ndarray) -> np.ndarray:
    """``array`` in native byte order (an array saved big-endian holds the same numbers)."""
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
