"""Property tests: every reader of untrusted text or bytes returns a valid object or raises
a QkanPackError, never another exception.

Each property counts the cases it really ran and asserts the count, so a strategy that
silently generates nothing fails. Counts are printed (``pytest -s``) for SECURITY.md.
"""

from __future__ import annotations

import copy
import json
import math
import struct
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkan_pack import QkanPackError
from qkan_pack.format import (
    DTYPES,
    MAX_DIM,
    MAX_RANK,
    Manifest,
    check_dtype,
    dumps_manifest,
    format_shape,
    loads_strict,
    manifest_to_dict,
    parse_config_items,
    parse_manifest,
    parse_shape,
    parse_shapes,
)
from qkan_pack.runtime import safetensors_header

from .test_manifest import rich_manifest, sample_dict

pytestmark = pytest.mark.slow
RAN: Counter[str] = Counter()


def run_counted(name: str, examples: int, strategy: st.SearchStrategy[Any],
                check: Callable[[Any], None]) -> int:
    """Run ``check`` on ``examples`` generated values; return how many really ran."""
    RAN[name] = 0

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(strategy)
    def prop(value: Any) -> None:
        RAN[name] += 1
        check(value)

    prop()
    print(f"fuzz {name}: {RAN[name]} cases")
    assert RAN[name] >= examples * 0.9, (name, RAN[name])
    return RAN[name]


def refused_or(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn(value)``, or None when it raised a QkanPackError; anything else propagates."""
    try:
        return fn(value)
    except QkanPackError:
        return None


# ---------------------------------------------------------------------------
# Shape grammar, dtypes, --config
# ---------------------------------------------------------------------------

SHAPE_ALPHABET = "0123456789xX, -+._\t１٣"
shape_text = st.one_of(st.text(), st.text(alphabet=SHAPE_ALPHABET, max_size=40))
shapes_text = st.one_of(
    shape_text,
    st.lists(st.lists(st.integers(-3, 2**32), min_size=0, max_size=10), max_size=6).map(
        lambda shapes: ",".join("x".join(map(str, s)) for s in shapes)),
)


def check_shape(text: str) -> None:
    shape = refused_or(parse_shape, text)
    if shape is not None:
        assert isinstance(shape, tuple) and 1 <= len(shape) <= MAX_RANK
        assert all(type(d) is int and 0 < d <= MAX_DIM for d in shape)
        assert parse_shape(format_shape(shape)) == shape


def check_shapes(text: str) -> None:
    shapes = refused_or(parse_shapes, text)
    if shapes is not None:
        assert shapes and len({len(s) for s in shapes}) == 1 and len(set(shapes)) == len(shapes)
        for shape in shapes:
            check_shape(format_shape(shape))
        assert parse_shapes(",".join(map(format_shape, shapes))) == shapes


def test_parse_shape_fuzz() -> None:
    run_counted("parse_shape", 600, shape_text, check_shape)


def test_parse_shapes_fuzz() -> None:
    run_counted("parse_shapes", 800, shapes_text, check_shapes)


def check_dtype_name(name: str) -> None:
    canonical = refused_or(check_dtype, name)
    assert canonical is None or (canonical in DTYPES and check_dtype(canonical) == canonical)


def test_check_dtype_fuzz() -> None:
    names = st.one_of(st.text(max_size=20), st.sampled_from([*DTYPES, "float", "half", "long",
                                                            "torch.int64", " Double "]),
                      st.sampled_from(list(DTYPES)).map(lambda d: d.upper()))
    run_counted("check_dtype", 400, names, check_dtype_name)


def check_config(items: list[str]) -> None:
    config = refused_or(parse_config_items, items)
    if config is not None:
        assert all(key.isidentifier() for key in config)
        # what the manifest stores must read back identically
        assert loads_strict(json.dumps(config, allow_nan=False)) == config


config_item = st.one_of(
    st.text(max_size=30),
    st.tuples(st.sampled_from(["a", "width", "x1", "_k", "1x", "a-b", ""]),
              st.sampled_from(["=", "", "=="]),
              st.one_of(st.text(max_size=20),
                        st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                                     | st.text(max_size=5),
                                     lambda inner: st.lists(inner, max_size=3)
                                     | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                                     max_leaves=8).map(lambda v: json.dumps(v)))
              ).map("".join),
)


def test_parse_config_items_fuzz() -> None:
    run_counted("parse_config_items", 600, st.lists(config_item, max_size=5), check_config)


# ---------------------------------------------------------------------------
# The manifest reader
# ---------------------------------------------------------------------------


def check_manifest(data: bytes | str) -> None:
    manifest = refused_or(parse_manifest, data)
    if manifest is not None:
        assert isinstance(manifest, Manifest)
        again = parse_manifest(dumps_manifest(manifest))
        assert again == manifest  # a valid manifest survives a write/read cycle unchanged


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def test_parse_manifest_arbitrary_bytes() -> None:
    run_counted("parse_manifest bytes", 800, st.binary(max_size=512), check_manifest)


def test_parse_manifest_arbitrary_json() -> None:
    run_counted("parse_manifest json", 600, json_values.map(json.dumps), check_manifest)


def paths_of(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a node of a JSON tree (dict keys and list indices)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths_of(item, (*prefix, index))
    return found


# Deep copies: sampled_from hands out the same objects every time, and the mutations below
# edit what they insert, which made later examples differ (and could nest a node in itself).
POISON = st.one_of(json_values, st.sampled_from([
    0, -1, 2**63, 10**400, 1.5, True, None, "", "..", "../x", "/abs", "a\\b", "x\n", [], {}, [[]],
    "float32", "int64", "build_model", "tensor", {"tensor": {"shape": [1], "dtype": "bool"}},
])).map(copy.deepcopy)


def rich_dict() -> dict[str, Any]:
    return manifest_to_dict(rich_manifest())


@st.composite
def mutated_manifests(draw: st.DrawFn, seed: Callable[[], dict[str, Any]] = sample_dict) -> bytes:
    """A valid manifest with 1-3 edits: replace a node, delete a key, add a key, or duplicate."""
    raw = seed()
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths_of(raw)))
        if not path:
            continue
        parent = raw
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(POISON)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(POISON)
        else:
            parent.insert(draw(st.integers(0, len(parent))), draw(POISON))
    return json.dumps(raw, allow_nan=True).encode()


@st.composite
def byte_mutated_manifests(draw: st.DrawFn) -> bytes:
    data = bytearray(dumps_manifest(Manifest(**_sample_kwargs())))
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "flip":
            data[index] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data[index:index] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[index:index + draw(st.integers(1, 8))]
    return bytes(data)


def _sample_kwargs() -> dict[str, Any]:
    from .test_manifest import sample_manifest

    manifest = sample_manifest()
    return {f: getattr(manifest, f) for f in manifest.__dataclass_fields__}


def test_parse_manifest_mutated_valid() -> None:
    assert parse_manifest(json.dumps(sample_dict()))  # the seed itself is valid
    run_counted("parse_manifest mutated", 1200, mutated_manifests(), check_manifest)


def test_parse_manifest_mutated_rich() -> None:
    """The same edits to a manifest with every optional part: a row proof, declared padding,
    reduced precision with a device's choice, metadata."""
    assert parse_manifest(json.dumps(rich_dict()))
    run_counted("parse_manifest mutated rich", 800, mutated_manifests(rich_dict), check_manifest)


def test_parse_manifest_byte_mutated() -> None:
    run_counted("parse_manifest byte-mutated", 800, byte_mutated_manifests(), check_manifest)


# ---------------------------------------------------------------------------
# The safetensors header reader (weights and references, before anything loads them)
# ---------------------------------------------------------------------------


def check_header(data: bytes) -> None:
    header = refused_or(lambda d: safetensors_header(d, "fuzz.safetensors"), data)
    if header is not None:
        (length,) = struct.unpack("<Q", data[:8])
        payload = len(data) - 8 - length
        assert sum(v["nbytes"] for v in header.values()) == payload  # the tensors tile it


def _header_bytes(header: dict[str, Any], payload: int) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * payload


@st.composite
def safetensors_like(draw: st.DrawFn) -> bytes:
    """Mostly-valid safetensors files with one field possibly poisoned."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for index in range(draw(st.integers(0, 3))):
        dtype = draw(st.sampled_from(["F32", "F16", "I64", "BOOL", "U8", "F8_E4M3", "X9"]))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        size = math.prod(shape) * {"F32": 4, "F16": 2, "I64": 8}.get(dtype, 1)
        header[f"t{index}"] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if draw(st.booleans()):
        path = draw(st.sampled_from(paths_of(header)[1:] or [("__metadata__",)]))
        parent = header
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = draw(POISON)
    return _header_bytes(header, offset + draw(st.sampled_from([0, 0, 0, 1, -1])) if offset else 0)


def test_safetensors_header_fuzz() -> None:
    run_counted("safetensors_header bytes", 500, st.binary(max_size=256), check_header)
    run_counted("safetensors_header structured", 700, safetensors_like(), check_header)


def test_fuzz_totals() -> None:
    """Runs last in this module: the total number of cases that ran above."""
    if RAN:
        print(f"fuzz total: {sum(RAN.values())} cases over {len(RAN)} properties")
