"""JSON numbers as input arrays: the one strict reading that serve's JSON route and
``predict``'s ``.json`` files share.

JSON has no dtypes, so a nested list of numbers takes the input's declared dtype only where
every value converts exactly: integers (never floats: ``1.0`` is not an index) for integer
inputs, within the dtype's range; ``true``/``false`` only for bool inputs (``0``, ``1``,
``0.5`` and strings are refused: ``"false"`` would otherwise be True), and never mixed with
numbers (numpy reads ``[true, 5]`` as ``[1, 5]``); integers and floats
for float inputs, finite in the dtype (``1e308`` into float32 is refused, never a silent
infinity). Integers stay integers (the decoder's ints, never read through float64):
9007199254740993 arrives as itself. Decoding the text is the caller's (serve: orjson; predict:
``format.loads_strict``); this module sees only the decoded value.

A tensor may also come as ``{"b64", "dtype", "shape"}``: its little-endian bytes in base64
with their dtype and shape (bfloat16 as its raw 16 bits), read by ``b64_tensor`` for serve's
requests and predict's files alike.

numpy at import, torch only where a bfloat16 is made or bounded: serve's wire helper process
imports this without torch. A host array of a bfloat16 input holds its raw 16 bits.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np

from ..errors import InputError, MalformedRequestError, ShapeSpecError
from ..format import DTYPES, MAX_RANK, Signature, check_dtype

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["B64_KEYS", "ENCODINGS", "HOST_DTYPES", "REQUEST_KEYS", "b64_tensor", "check_finite",
           "check_int_range", "fit_numbers", "host_array", "is_b64_tensor", "json_input",
           "numbers_array", "typed_input", "wire_values"]

#: The keys of serve's request body (``POST /``), which a ``predict`` JSON input file may be.
REQUEST_KEYS = frozenset({"inputs", "encoding"})
#: A request's ``encoding``: how serve writes the reply's tensors.
ENCODINGS = ("list", "base64")
#: The keys of a tensor sent as base64 bytes.
B64_KEYS = frozenset({"b64", "dtype", "shape"})

#: The numpy dtype a host array of each manifest dtype has (bfloat16: its uint16 bits).
HOST_DTYPES = {name: np.dtype(np.uint16 if name == "bfloat16" else spec.wire).newbyteorder("=")
               for name, spec in DTYPES.items()}
_BF16_EXPONENT = np.uint16(0x7F80)
_SENT = {"b": "booleans", "i": "integers", "u": "integers", "O": "integers", "f": "floats"}
_BOOLEANS = frozenset({bool, np.bool_})


def json_input(value: Any, name: str, want: str, where: str,
               accepted: Sequence[Signature] = ()) -> np.ndarray:
    """A decoded JSON value as input ``name`` of dtype ``want``: ``numbers_array``, then
    ``fit_numbers``, then ``host_array``. ``MalformedRequestError`` for a value that is no
    rectangular array of numbers, ``InputError`` for numbers that are not ``want``."""
    return host_array(fit_numbers(numbers_array(value, where), name, want, accepted),
                      name, want, accepted)


def numbers_array(value: Any, where: str, *, may_hold_booleans: bool = True) -> np.ndarray:
    """Nested lists of numbers (or booleans) as one numpy array, its dtype numpy's reading
    of the JSON types (bool, int64/uint64, float64); anything else (strings, ragged lists,
    integers beyond 64 bits) is a ``MalformedRequestError`` at ``where``, and booleans
    mixed with numbers an ``InputError``: numpy reads ``[true, 5]`` as the integers
    ``[1, 5]`` and ``[true, 0.5]`` as floats, which no input takes (a bool input takes
    booleans only, any other numbers only). Finding them takes a pass over the values;
    a caller that knows none can hide there (serve: the JSON text holds no ``true`` or
    ``false``) skips it with ``may_hold_booleans=False``."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise MalformedRequestError(f"{where} is not a rectangular nested list of numbers: "
                                    f"{' '.join(str(exc).split())[:160]}") from None
    if array.dtype.kind not in "biuf":
        _refuse_beyond_64_bits(array, where)
        raise MalformedRequestError(f"{where} must hold numbers (or booleans) only, as nested "
                                    "lists of one depth everywhere (integers within 64 bits)")
    if may_hold_booleans and array.dtype.kind != "b" and array.ndim and _holds_booleans(
            value, array.ndim):
        raise InputError(f"{where} mixes true/false with numbers: a bool input takes true "
                         "and false only, any other input numbers only (1 and 0, not true "
                         "and false)")
    if array.dtype.kind == "f" and array.size and _integers_only(value, array.ndim):
        return np.asarray(value, dtype=object)
    return array


def _integers_only(value: Any, depth: int) -> bool:
    """Whether ``value`` (lists nested ``depth`` deep, read by numpy as float64) holds
    integers only: numpy reads integers that no one 64-bit type holds together (``[-1,
    2**63]``: int64 beside uint64) as float64, which rounds them (``2**64 - 1`` reads as
    ``2**64``), so they are kept exact, as Python ints (``fit_numbers`` converts them for a
    float input and names the exact one outside an integer input's range). A request of
    floats pays one look at its first value."""
    first = value
    for _ in range(depth):
        first = first[0]
    if type(first) is not int:
        return False
    leaves = value
    for _ in range(depth - 1):
        leaves = chain.from_iterable(leaves)
    return all(type(leaf) is int for leaf in leaves)


def _refuse_beyond_64_bits(array: np.ndarray, where: str) -> None:
    """numpy keeps JSON integers that no 64-bit type holds (``-2**63 - 1``, ``10**20``) as
    Python objects: the first such one is an ``InputError`` naming ``where`` and saying it
    is outside the int64 range, the widest an integer input has (a float input takes it
    written as a float), rather than that ``where`` holds no numbers."""
    if array.dtype != object:
        return
    low, high = DTYPES["int64"].int_limits or (0, 0)
    huge = next((value for value in array.flat if type(value) is int
                 and not low <= value < 2**64), None)
    if huge is not None:
        digits = str(abs(huge))
        shown = f"{'-' * (huge < 0)}{digits[:24]}... ({len(digits)} digits)" \
            if len(digits) > 40 else str(huge)
        try:
            floats = f"; a float input takes it written as a float, {float(huge):g}"
        except OverflowError:
            floats = ", nor a float input"
        raise InputError(f"{where} holds {shown}, outside the int64 range [{low}, {high}] "
                         f"(no integer input takes it{floats})")


def _holds_booleans(value: Any, depth: int) -> bool:
    """Whether ``value``, lists nested ``depth`` deep (as numpy read them), holds a Python or
    numpy bool: its leaves' types collected at C speed, no Python loop per value."""
    leaves = value
    for _ in range(depth - 1):
        leaves = chain.from_iterable(leaves)
    return not _BOOLEANS.isdisjoint(map(type, leaves))


def fit_numbers(array: np.ndarray, name: str, want: str,
                accepted: Sequence[Signature] = ()) -> np.ndarray:
    """JSON numbers -> ``want``: ints and floats for float inputs, ints in range for integer
    inputs, booleans for bool inputs; bfloat16 comes back as its raw bits. No values
    (``[[]]``, which numpy reads as float64) take any dtype: the shape check then says what
    the input's shape must be."""
    if array.size == 0:
        return array.astype(HOST_DTYPES[want])
    kind = array.dtype.kind
    if kind == "O":  # integers beyond one 64-bit type (numbers_array), each exact
        if DTYPES[want].is_float:
            array, kind = array.astype(np.float64), "f"
        elif DTYPES[want].kind == "int":
            return check_int_range(array, name, want, accepted)
    if DTYPES[want].is_float and kind in "iuf":
        if want != "bfloat16":
            return array
        import torch

        with np.errstate(over="ignore", invalid="ignore"):
            values = torch.from_numpy(np.asarray(array, dtype=np.float32)).to(torch.bfloat16)
        return values.view(torch.int16).numpy().view(np.uint16)
    if want == "bool" and kind == "b":
        return array
    if DTYPES[want].kind == "int" and kind in "iu":
        return check_int_range(array, name, want, accepted)
    if DTYPES[want].kind == "int" and kind == "f":
        _refuse_beyond_int_range(array, name, want, accepted)
    raise InputError(f"input {name!r} holds {_SENT[kind]}, which do not convert to {want} "
                     f"exactly{_bool_hint(want)}", accepted=accepted)


def check_int_range(array: np.ndarray, name: str, want: str,
                    accepted: Sequence[Signature] = ()) -> np.ndarray:
    """Integers bound for an input of integer dtype ``want`` must lie in its range: numpy
    would wrap 300 into int8 as 44 (or raise OverflowError, a 500), so it is a refusal
    naming the input and the range. One vectorised min and max, whatever the size (JSON
    numbers and the protocol's typed contents alike)."""
    low, high = DTYPES[want].int_limits or (0, 0)
    if array.size == 0:
        return array
    smallest, largest = int(array.min()), int(array.max())
    if smallest < low or largest > high:
        bad = smallest if smallest < low else largest
        raise InputError(f"input {name!r} holds {bad}, outside the {want} range "
                         f"[{low}, {high}]", accepted=accepted)
    return array


def _refuse_beyond_int_range(array: np.ndarray, name: str, want: str,
                             accepted: Sequence[Signature]) -> None:
    """Numbers for an integer input read as floats may be integers: numpy reads JSON
    integers that no one 64-bit type holds together (``[1, 18446744073709551615]``: int64
    and uint64) as float64. One beyond ``want``'s range is refused as out of range, not as
    a float."""
    low, high = DTYPES[want].int_limits or (0, 0)
    # ``high + 1`` (a power of two) is exact in float64, ``high`` itself may not be:
    # float64(2**63 - 1) is 2**63, so ``array > high`` let 2**63 through
    outside = array[(array < low) | (array >= high + 1)]
    if outside.size:
        raise InputError(f"input {name!r} holds {float(outside.flat[0]):.6g}, outside the "
                         f"{want} range [{low}, {high}]", accepted=accepted)


def _bool_hint(want: str) -> str:
    return "; send true/false" if want == "bool" else ""


def typed_input(array: np.ndarray, sent: str, name: str, want: str,
                accepted: Sequence[Signature] = ()) -> np.ndarray:
    """Values sent with their dtype (a base64 tensor, a numpy array) as input ``name``:
    ``sent`` must be ``want`` (never converted: a float64 array is not a float32 one),
    then ``host_array``."""
    if sent != want:
        raise InputError(f"input {name!r} was sent as {sent} (send {want})", accepted=accepted)
    return host_array(array, name, want, accepted)


def host_array(array: np.ndarray, name: str, want: str,
               accepted: Sequence[Signature] = ()) -> np.ndarray:
    """``array`` (already ``want``'s values, bfloat16 as bits) as a fresh host array of
    ``HOST_DTYPES[want]`` in native byte order, every float finite in ``want``."""
    host = HOST_DTYPES[want]
    if array.dtype == host:  # the common binary tensor: a copy converts nothing (nor can
        array = np.array(array)  # overflow), and numpy's errstate costs more than the copy
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            array = np.array(array, dtype=host)
    return check_finite(array, name, want, accepted)


def check_finite(array: np.ndarray, name: str, want: str,
                 accepted: Sequence[Signature] = ()) -> np.ndarray:
    """Every value of a float input must be finite in its dtype: NaN, infinities and numbers
    that overflow it (``1e308`` as float32) are refused naming the input, never a silent NaN."""
    if not DTYPES[want].is_float or array.size == 0:
        return array
    if want == "bfloat16":
        finite = not bool(((array & _BF16_EXPONENT) == _BF16_EXPONENT).any())
    else:
        finite = bool(np.isfinite(array).all())
    if not finite:
        raise InputError(f"input {name!r} holds NaN, Infinity or a number beyond the {want} "
                         f"range (|x| <= {_largest(want):.4g}); send finite {want} values",
                         accepted=accepted)
    return array


def _largest(dtype: str) -> float:
    import torch

    return float(torch.finfo(getattr(torch, dtype)).max)


def is_b64_tensor(value: Any, names: Sequence[str]) -> bool:
    """Whether the object ``value``, where one tensor or inputs by name may stand, is one
    base64 tensor: it has a ``"b64"`` key, and not every key of it names one of the inputs
    ``names`` (a model may call an input ``b64``). Such an object is then read by
    ``b64_tensor``, which says what else it needs or must not have."""
    return isinstance(value, Mapping) and "b64" in value and not set(value) <= set(names)


def b64_tensor(value: Mapping[str, Any], where: str) -> tuple[np.ndarray, str]:
    """(array of the wire dtype, manifest dtype) of a ``{"b64", "dtype", "shape"}`` object;
    ``MalformedRequestError`` naming ``where`` for anything else (other keys, an unknown
    dtype, a shape that is no list of sizes, text that is not base64, a byte count that is
    not the shape's)."""
    if set(value) != B64_KEYS:
        raise MalformedRequestError(f"{where}: a base64 tensor has exactly the keys "
                                    f'"b64", "dtype", "shape"; got {sorted(value)}')
    try:
        dtype = check_dtype(value["dtype"])
    except ShapeSpecError as exc:
        raise MalformedRequestError(f"{where}.dtype: {exc}") from None
    shape = value["shape"]
    if (not isinstance(shape, list) or len(shape) > MAX_RANK
            or not all(type(d) is int and 0 <= d < 2**31 for d in shape)):
        raise MalformedRequestError(f"{where}.shape must be a list of at most {MAX_RANK} "
                                    "non-negative integers")
    raw = _b64_bytes(value["b64"], where)
    wire = np.dtype(DTYPES[dtype].wire)
    expected = math.prod(shape) * wire.itemsize
    if len(raw) != expected:
        raise MalformedRequestError(f"{where}: shape {shape} of {dtype} needs {expected} bytes, "
                                    f"the base64 holds {len(raw)}")
    values = wire_values(raw, dtype, where)  # its own refusal (a bool byte other than 0/1)
    try:
        return values.reshape(shape), dtype
    except ValueError:  # a zero-size shape whose other sizes overflow numpy's index range
        raise MalformedRequestError(f"{where}.shape {shape} is beyond what one array can "
                                    "index") from None


def _b64_bytes(text: Any, where: str) -> bytes:
    """The bytes of a tensor's base64 text: the standard alphabet with its padding, nothing
    else (no line breaks: ``base64 -w 0``, Python's ``b64encode``)."""
    if not isinstance(text, str):
        raise MalformedRequestError(f"{where}.b64 must be a string of base64 text, not "
                                    f"{type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        spaced = any(c.isspace() for c in text[:1 << 16])
        hint = ("; it holds line breaks or spaces: encode without them (base64 -w 0, "
                "Python's base64.b64encode)") if spaced else ""
        raise MalformedRequestError(f"{where}.b64 is not base64 text: {exc}{hint}") from None


def wire_values(raw: bytes | memoryview, dtype: str, where: str,
                name: str | None = None) -> np.ndarray:
    """Little-endian bytes as a flat array of manifest dtype ``dtype`` (bfloat16: its raw
    bits), without a copy. A bool is one byte, 0 or 1: numpy and torch keep any other byte
    as a "true" that compares unequal to True and sums as the byte, so it is refused
    (``where``, and the input's ``name`` when given, say where)."""
    array = np.frombuffer(raw, DTYPES[dtype].wire)
    if dtype == "bool" and array.size and (largest := int(array.view(np.uint8).max())) > 1:
        place = where if name is None else f"{where} ({name})"
        raise MalformedRequestError(f"{place}: a bool is one byte, 0 (false) or 1 (true); "
                                    f"the data holds the byte {largest}")
    return array
