"""The wire format of ``qkan-pack serve``: request bodies and handle arguments in, outputs out.

Parsing says what is malformed (``MalformedRequestError``, HTTP 400); fitting converts a parsed
input to the artifact's dtype or says why it cannot (``InputError``, HTTP 422); JSON numbers
are read by ``runtime.numbers_array`` / ``fit_numbers``, the one strict reading ``predict``'s
JSON files get too (integers never through float, booleans only as true/false). Tensors travel
as nested JSON lists or as ``{"b64", "dtype", "shape"}`` objects in little-endian order
(bfloat16 as its raw 16 bits). numpy and orjson only at import; torch where a tensor is made.

Strict JSON both ways. Bodies parse with orjson, which refuses NaN/Infinity literals and numbers
beyond float64; such a body is re-read leniently only to name the input that holds the value
(422), and every input must be finite in its dtype (``1e308`` into float32 is a 422 too).
Duplicate keys are refused, on ``POST /`` and the Open Inference Protocol alike (a count of the
keys orjson kept is compared with the body's colons outside strings, one per key written; on a
mismatch the standard library's parser, told to refuse duplicates, decides). Replies are
orjson output: valid JSON always,
a non-finite output float is ``null`` (``"encoding": "base64"`` keeps its exact bits).
"""

from __future__ import annotations

import base64
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import orjson

from ..errors import InputError, MalformedRequestError
from ..format import DTYPES, Signature
from ..runtime import (
    ENCODINGS,
    REQUEST_KEYS,
    b64_tensor,
    fit_numbers,
    host_array,
    is_b64_tensor,
    numbers_array,
    typed_input,
)

if TYPE_CHECKING:
    import torch
    from typing_extensions import TypeIs  # typing's own from Python 3.13

#: One JSON string, quotes and escapes (``\"`` too) included: in a text orjson accepted, every
#: ``"`` outside a string opens one, so successive matches are exactly the text's strings.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Booleans can hide among an input's numbers only where the text has ``true`` or ``false``;
#: both hold an "e", which most bodies of numbers lack, and ``int in bytes`` is a bare memchr
#: (a bytes needle costs ten times as much to look up), so that byte is looked for first.
_E = ord("e")
#: Characters of the longest JSON integer a 64-bit type holds (``-9223372036854775808``,
#: ``18446744073709551615``): a longer one is beyond 64 bits.
_INT_DIGITS = 20



class Given(NamedTuple):
    """One input as sent: an array, and its declared dtype (None: JSON numbers, inferred).
    A named tuple: one is made per input of every request (a frozen dataclass's fields are
    each set through ``object.__setattr__``)."""

    array: Any
    dtype: str | None


def parse_request(body: bytes, names: Sequence[str]) -> tuple[dict[str, Given], str]:
    """JSON body -> ({input name: Given}, reply encoding); raises MalformedRequestError."""
    request = decode_body(body)
    booleans = _E in body and (body.find(b"true") >= 0 or body.find(b"false") >= 0)
    if not isinstance(request, dict) or "inputs" not in request:
        raise MalformedRequestError('request must be a JSON object with "inputs", e.g. '
                                    '{"inputs": [[0.1, 0.2]]} or {"inputs": {"x": [[0.1, 0.2]]}}')
    if not request.keys() <= REQUEST_KEYS:
        unknown = sorted(set(request) - REQUEST_KEYS)
        raise MalformedRequestError(f"unknown request key(s) {unknown}; allowed: {sorted(REQUEST_KEYS)}")
    encoding = request.get("encoding", "list")
    if encoding not in ENCODINGS:
        raise MalformedRequestError(f"encoding {encoding!r} is not one of {list(ENCODINGS)}")
    inputs = request["inputs"]
    if isinstance(inputs, dict) and not is_b64_tensor(inputs, names):
        return {name: parse_tensor(value, f"inputs.{name}", booleans)
                for name, value in inputs.items()}, encoding
    if len(names) != 1:
        raise MalformedRequestError(f"this artifact takes {len(names)} inputs; send "
                                    f'"inputs" as an object keyed by {list(names)}')
    return {names[0]: parse_tensor(inputs, "inputs", booleans)}, encoding


def decode_body(body: bytes, key_count: Callable[[Any], int] | None = None,
                hint: str = '; send {"inputs": [[...]]}') -> Any:
    """orjson's strict parse; on its refusal, a lenient re-read that lets NaN/Infinity and
    overflowing numbers through to ``fit`` (which names the input, 422), else a 400.

    Duplicate keys are refused on every route that reads a JSON body (orjson keeps the last
    one silently): ``key_count`` counts the keys of the objects the route's requests hold
    (default: ``POST /``'s), and a JSON text has one colon outside its strings per key it
    writes, so a count equal to the body's colons (the common body) or to its colons
    outside strings (``"id": "a:b"``, found by one regular-expression pass over the
    strings) proves no key repeated. Otherwise (a duplicate key, an object where none
    belongs) the standard library's parser, in C, reads the body again and decides.
    ``hint`` ends the message of a body that is not JSON."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return _lenient(body, str(exc), hint)
    keys = (key_count or _key_count)(value)
    if body.count(b":") != keys and _colons_outside_strings(body) != keys:
        _refuse_duplicate_keys(body)
    return value


def _colons_outside_strings(body: bytes) -> int:
    """The colons of a valid JSON text that are not inside a string: one per object member."""
    return body.count(b":") - b"".join(_STRING.findall(body)).count(b":")


def _refuse_duplicate_keys(body: bytes) -> None:
    """``MalformedRequestError`` when an object of ``body`` (valid JSON) repeats a key."""
    try:
        json.loads(body, object_pairs_hook=_unique_keys)
    except MalformedRequestError:
        raise
    except (ValueError, TypeError, RecursionError) as exc:
        raise MalformedRequestError(f"request body is not valid JSON ({exc})") from None


def _lenient(body: bytes, problem: str, hint: str) -> Any:
    try:
        value = json.loads(body, object_pairs_hook=_unique_keys, parse_int=_int_or_float)
    except MalformedRequestError:
        raise
    except (ValueError, TypeError, RecursionError):
        raise MalformedRequestError(f"request body is not valid JSON ({problem}){hint}") from None
    _refuse_lone_surrogates(value, problem)
    return value


def _refuse_lone_surrogates(value: Any, problem: str) -> None:
    """The standard library reads ``"\\udc80"`` (a valid JSON escape) as a lone surrogate,
    which no UTF-8 text holds: a string echoed back (a request's ``id``) would then fail the
    reply's encoder after the model ran. orjson refused the body for it; so is it here, a
    400 (encoding the value again is the one check that sees every string, keys too)."""
    try:
        orjson.dumps(value)
    except TypeError as exc:  # orjson.JSONEncodeError
        if "surrogate" in str(exc):
            raise MalformedRequestError(f"request body is not valid JSON text ({problem}): a "
                                        "string holds a lone surrogate escape (\\ud800-\\udfff "
                                        "without its pair), which UTF-8 cannot encode") from None


def _int_or_float(text: str) -> int | float:
    """A JSON integer; beyond 64 bits, the float it rounds to (``inf`` past float's range),
    as orjson reads such an integer, so that ``fit`` refuses it naming the input (422), as it
    does ``1e400``. Past 20 digits it is read as a float without ``int``, which refuses a
    text of more than 4,300 digits (a 400 for a body that is valid JSON)."""
    if len(text) > _INT_DIGITS:
        return float(text)
    value = int(text)
    return value if -2**63 <= value < 2**64 else float(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        repeated = next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1)
        raise MalformedRequestError(f"request body is not valid JSON (duplicate JSON key "
                                    f"{repeated!r})")
    return result


def _key_count(request: Any) -> int:
    """Keys of the objects a request may hold (top level, named inputs, base64 tensors);
    with no duplicates and no colon in a string, the body has exactly this many colons."""
    if not isinstance(request, dict):
        return 0
    inputs = request.get("inputs")
    count = len(request)
    if isinstance(inputs, dict):
        count += len(inputs) + sum(len(v) for v in inputs.values() if isinstance(v, dict))
    return count


def parse_tensor(value: Any, where: str, may_hold_booleans: bool = True) -> Given:
    """Nested lists of numbers (``runtime.numbers_array``, the reading predict's JSON files
    get too), or a ``{"b64", "dtype", "shape"}`` object."""
    if isinstance(value, dict):
        return Given(*b64_tensor(value, where))
    return Given(numbers_array(value, where, may_hold_booleans=may_hold_booleans), None)


#: Digits of the largest byte count a request header may state: beyond any body limit,
#: within int64, and far below the 4,300 digits past which ``int`` refuses a string.
MAX_COUNT_DIGITS = 18


def header_count(value: str | bytes) -> int | None:
    """A byte count sent as an HTTP header value (``Content-Length``, the protocol's
    ``Inference-Header-Content-Length``), or None: ASCII digits only, at most
    ``MAX_COUNT_DIGITS`` (``str.isdigit`` also takes '²' and other Unicode digits, which
    ``int`` then refuses)."""
    if 0 < len(value) <= MAX_COUNT_DIGITS and value.isascii() and value.isdigit():
        return int(value)
    return None


def given_from_python(value: Any, where: str) -> Given:
    """A handle argument: numpy array, torch tensor (declared dtype), or nested lists."""
    if isinstance(value, np.ndarray):
        if value.dtype.name not in DTYPES:
            raise InputError(f"{where}: numpy dtype {value.dtype} is not supported")
        return Given(value, value.dtype.name)
    if is_tensor(value):
        from ..runtime import dtype_name

        return Given(value, dtype_name(value.dtype))
    return parse_tensor(value, where)


def is_tensor(value: Any) -> TypeIs[torch.Tensor]:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def encode_outputs(tree: Any, encoding: str) -> Any:
    """Outputs (host arrays or tensors in tuples/lists/dicts) as orjson-ready numpy arrays or
    base64 objects (tuples are JSON arrays); ``dumps`` writes them."""
    return map_leaves(lambda t: _encode_leaf(t, encoding), tree)


def encode_reply(outputs: Any, encoding: str) -> bytes:
    """A prediction's reply body."""
    return dumps({"outputs": encode_outputs(outputs, encoding)})


def output_nbytes(tree: Any) -> int:
    """Bytes of the outputs' arrays (numpy, or bfloat16 tensors): what their reply's size
    follows (about 3x in list encoding)."""
    if type(tree) is np.ndarray:  # the common reply: one output
        return tree.nbytes
    sizes: list[int] = []
    map_leaves(lambda leaf: sizes.append(
        leaf.numel() * leaf.element_size() if is_tensor(leaf) else leaf.nbytes), tree)
    return sum(sizes)


def _encode_leaf(leaf: np.ndarray | torch.Tensor, encoding: str) -> Any:
    """One output: a numpy array (``host_outputs``) or a tensor (bfloat16, which numpy lacks)."""
    if not is_tensor(leaf):
        if encoding == "list":  # the common reply: no dtype name (numpy's is slow per call)
            return _list_ready(leaf)
        array, dtype = leaf, leaf.dtype.name
    else:
        from ..runtime import dtype_name

        dtype = dtype_name(leaf.dtype)
        if encoding == "list" and dtype == "bfloat16":
            return _list_ready(leaf.detach().cpu().float().numpy())
        array = tensor_bits(leaf)
        if encoding == "list":
            return _list_ready(array)
    return _b64_object(_wire_array(array, dtype), dtype, list(array.shape))


def _list_ready(array: np.ndarray) -> Any:
    return array.tolist() if array.ndim == 0 else np.ascontiguousarray(array)


def _b64_object(data: np.ndarray, dtype: str, shape: list[int]) -> dict[str, Any]:
    return {"b64": base64.b64encode(data.tobytes()).decode(), "dtype": dtype, "shape": shape}


def dumps(payload: Any) -> bytes:
    """A reply body: strict JSON (numpy arrays natively; NaN and infinities as ``null``)."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def _wire_array(array: np.ndarray, dtype: str) -> np.ndarray:
    """A host array of manifest dtype ``dtype`` (bfloat16 as its raw bits), little-endian."""
    return array.astype("<u2" if dtype == "bfloat16" else DTYPES[dtype].wire, copy=False)


def map_leaves(fn: Any, tree: Any) -> Any:
    """The runtime's output walker (imported on first use: this module loads without torch),
    with a shortcut for the common output, one array: this runs a few times per request."""
    if type(tree) is np.ndarray:
        return fn(tree)
    from ..runtime import map_leaves as walk

    return walk(fn, tree)


def torch_module() -> Any:
    import torch

    return torch


def fit(given: Given, name: str, want: str, accepted: Sequence[Signature]) -> np.ndarray:
    """One input in the artifact's dtype, as a fresh host array in native byte order
    (bfloat16 as its raw 16 bits): requests stay numpy until a batch of them becomes one
    tensor (``to_tensor``), so no per-request torch call is paid. A wrong dtype, or a float
    input that is not finite in its dtype, is an ``InputError``."""
    array = given.array
    if is_tensor(array):
        if given.dtype != want:
            raise InputError(f"input {name!r} has dtype {given.dtype}", accepted=accepted)
        array = tensor_bits(array)
    elif given.dtype is not None:
        return typed_input(array, given.dtype, name, want, accepted)
    else:
        array = fit_numbers(array, name, want, accepted)
    return host_array(array, name, want, accepted)


def tensor_bits(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array (bfloat16 as its raw 16 bits)."""
    torch = torch_module()
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def to_tensor(array: np.ndarray, dtype: str) -> torch.Tensor:
    """A ``fit`` array (or a concatenation of them) as a tensor of manifest dtype ``dtype``,
    sharing its memory."""
    torch = torch_module()
    if dtype == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def host_outputs(tree: Any) -> Any:
    """Replayed outputs as numpy arrays, converted once per replay so that every row of a
    batch is a cheap numpy slice; bfloat16 leaves stay tensors (numpy has no bfloat16)."""
    torch = torch_module()
    return map_leaves(lambda t: t if t.dtype == torch.bfloat16 else t.detach().cpu().numpy(), tree)


def check_index_bounds(array: np.ndarray, name: str, bounds: tuple[int, int] | None,
                       accepted: Sequence[Signature]) -> np.ndarray:
    """An input that indexes an embedding (``InputDecl.index_bounds``) must stay within its
    rows: refused here (422) rather than failing the model -- and every row batched with it
    -- or, on a GPU, killing the CUDA context with a device-side assert."""
    if bounds is None or array.size == 0:
        return array
    low, high = bounds
    smallest, largest = int(array.min()), int(array.max())
    if smallest < low or largest >= high:
        bad = smallest if smallest < low else largest
        raise InputError(f"input {name!r} holds {bad}, outside [{low}, {high}): it indexes an "
                         f"embedding of {high - low} rows", accepted=accepted)
    return array
