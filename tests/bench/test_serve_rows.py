"""What ``bench-serve`` sends: one row per request, shaped and typed from the manifest, for
any artifact whose shapes take rows (it sent ``[[floats]]`` of the first input's width only,
and refused artifacts with several inputs)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from qkan_pack import BenchError, build
from qkan_pack.bench._load import RowInput, request_body
from qkan_pack.bench._serve_load import row_inputs

from ..conftest import EXAMPLES, MODELS


def test_rows_follow_the_manifest_names_shapes_dtypes_and_ranges(tmp_path: Path) -> None:
    path = build(MODELS / "multi_io.py", [{"a": (1, 3), "b": (1, 4)}, {"a": (8, 3), "b": (8, 4)}],
                 output=tmp_path / "multi", dtype={"b": "int64"}).path
    rows = row_inputs(str(path))
    assert [(r.name, r.shape, r.kind) for r in rows] == [("a", (3,), "float"), ("b", (4,), "int")]
    assert (rows[1].low, rows[1].high) == (0, 8)  # the embedding's 8 rows, not [0, 2)
    rng = random.Random(0)
    for _ in range(50):
        body = orjson.loads(request_body(rows, rng))["inputs"]
        assert set(body) == {"a", "b"}
        assert len(body["a"]) == 1 and len(body["a"][0]) == 3
        assert all(isinstance(v, float) and -1 <= v <= 1 for v in body["a"][0])
        assert len(body["b"][0]) == 4 and all(isinstance(v, int) and 0 <= v < 8
                                              for v in body["b"][0])


def test_one_input_sends_a_bare_row_batch(tmp_path: Path) -> None:
    path = build(EXAMPLES / "qkan_mlp.py", "1x2,8x2", output=tmp_path / "mlp").path
    rows = row_inputs(str(path))
    assert rows == (RowInput(rows[0].name, (2,), "float"),)
    body = request_body(rows, random.Random(1), size=4096)
    assert len(body) == 4096 and len(orjson.loads(body)["inputs"][0]) == 2


def test_a_large_body_is_numbers_not_padding(tmp_path: Path) -> None:
    """bench-serve's large bodies were one row padded with spaces, which parses in
    microseconds: they hid that a body of numbers held a replica's event loop (p99 of single
    rows 5.6 -> 177 ms on the 2-core CPU with 7 MB of numbers, 26 ms with 7 MB of spaces)."""
    rows = (RowInput("x", (2,)),)
    body = request_body(rows, random.Random(1), size=2**20)
    values = orjson.loads(body)["inputs"]
    assert len(body) == 2**20 and len(body.rstrip()) > 0.9 * len(body)
    assert len(values) > 20_000 and all(len(row) == 2 for row in values)
    several = (RowInput("ids", (1,), "int", 0, 10), RowInput("x", (1,)))
    body = request_body(several, random.Random(2), size=2**20)
    assert len(body) == 2**20 and len(body.rstrip()) > 0.95 * len(body)  # audit: was 66%


def test_an_artifact_without_row_shapes_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "pooled.py"
    model.write_text("import torch\n\n\nclass Pooled(torch.nn.Module):\n"
                     "    def forward(self, x):\n        return x.sum(dim=0)  # no batch dim\n\n\n"
                     "def build_model():\n    return Pooled()\n")
    path = build(model, "4x2", output=tmp_path / "pooled").path
    with pytest.raises(BenchError, match="no captured shape of this artifact takes rows"):
        row_inputs(str(path))


def test_bool_inputs_are_json_booleans_and_ranges_fit_the_dtype(tmp_path: Path) -> None:
    """Review finding: a bool input got 0/1, which the server's wire refuses for bool (every
    request a 422). Ranges follow the dtype (the build refuses a range a dtype cannot hold)."""
    model = tmp_path / "masked.py"
    model.write_text("import torch\n\n\nclass Masked(torch.nn.Module):\n"
                     "    def forward(self, x, mask, level):\n"
                     "        return x * mask + level.float()\n\n\n"
                     "def build_model():\n    return Masked()\n")
    path = build(model, [{"x": (1, 2), "mask": (1, 2), "level": (1, 2)}],
                 output=tmp_path / "masked", dtype={"mask": "bool", "level": "uint8"},
                 input_range=(0, 256)).path
    rows = row_inputs(str(path))
    assert [r.kind for r in rows] == ["float", "bool", "int"]
    assert (rows[2].low, rows[2].high) == (0, 256)
    body = orjson.loads(request_body(rows, random.Random(2)))["inputs"]
    assert all(isinstance(v, bool) for v in body["mask"][0])
    assert all(isinstance(v, int) and 0 <= v < 256 for v in body["level"][0])


def test_requests_of_random_lengths_for_a_padded_artifact(tmp_path: Path) -> None:
    """``bench-serve --lengths LOW,HIGH``: each request's length drawn along the artifact's
    padded length axis, the same for every input of that axis."""
    import json

    from qkan_pack.format import with_batch_sizes

    tokens = with_batch_sizes([{"input_ids": (8,), "attention_mask": (8,)},
                               {"input_ids": (16,), "attention_mask": (16,)}], [1, 4])
    path = build(MODELS / "pad_models.py", tokens, dtype="int64",
                 config={"kind": "masked_meanpool"}, output=tmp_path / "a",
                 pad={"input_ids": 0, "attention_mask": 0}, progress=False).path
    rows = row_inputs(str(path), (3, 16))
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        body = json.loads(request_body(rows, rng, 0, (3, 16)))["inputs"]
        length = len(body["input_ids"][0])
        assert len(body["attention_mask"][0]) == length
        seen.add(length)
    assert seen == set(range(3, 17))
    with pytest.raises(BenchError, match="HIGH <= 16"):
        row_inputs(str(path), (3, 17))
    plain = build(MODELS / "plain_mlp.py", "1x2,8x2", output=tmp_path / "b", progress=False).path
    with pytest.raises(BenchError, match="built with --pad"):
        row_inputs(str(plain), (1, 2))


def test_rows_per_request_and_protocols_are_checked_before_any_server_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench-serve --rows-per-request N`` sends N-row batches, N a captured batch size:
    any other N, an unknown protocol, or oip-grpc without tritonclient's stubs is refused
    before a server starts (a server start is most of a short run), saying what to do."""
    import sys

    from qkan_pack.bench import ServeLoadSettings, _serve_load, run_serve_load

    def no_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("a server was started")

    monkeypatch.setattr(_serve_load, "ServerProcess", no_server)
    path = build(EXAMPLES / "qkan_mlp.py", "1x2,8x2", output=tmp_path / "mlp").path
    with pytest.raises(BenchError, match=r"--rows-per-request 5 is not a captured batch size "
                                         r"of this artifact; captured: 1, 8"):
        run_serve_load(path, ServeLoadSettings(rows_per_request=5))
    rows = row_inputs(str(path), rows_per_request=8)
    body = orjson.loads(request_body(rows, random.Random(0), count=8))["inputs"]
    assert len(body) == 8 and all(len(row) == 2 for row in body)
    with pytest.raises(BenchError, match="json, oip-json, oip-binary, oip-grpc"):
        ServeLoadSettings(protocols=("json", "soap"))
    monkeypatch.setitem(sys.modules, "tritonclient", None)
    monkeypatch.setitem(sys.modules, "tritonclient.grpc", None)
    with pytest.raises(BenchError, match=r"oip-grpc needs tritonclient's gRPC stubs .*"
                                         r"pip install 'qkan-pack\[grpc\]'"):
        run_serve_load(path, ServeLoadSettings(protocols=("json", "oip-grpc")))


def test_protocols_are_reported_side_by_side_with_ratios_to_the_json_route() -> None:
    from collections import Counter

    from qkan_pack.bench import ServeLoadReport, render_serve_load
    from qkan_pack.bench._load import LoadResult
    from qkan_pack.bench._serve_results import (
        SERVE_SCHEMA,
        median_point,
        protocol_ratios,
        summarise,
    )

    def point(protocol: str, requests: int) -> object:
        return summarise(8, LoadResult([1.0] * requests, Counter({200: requests})), 2.0,
                         protocol, 8)

    model = [point("json", 200), point("oip-binary", 300), point("oip-grpc", 190)]
    assert (model[1].requests_per_s, model[1].rows_per_s, model[1].protocol) == (150, 1200, "oip-binary")
    report = ServeLoadReport(
        schema=SERVE_SCHEMA, created="2000-01-01T00:00:00+00:00", artifact="mlp", command=[],
        settings={"seconds": 2.0, "processes": 1, "rows_per_request": 8},
        machine={"cpu": "cpu", "gpu": None},
        server={"model": {"ready": "serving mlp"}, "noop": {"ready": "serving noop"}},
        curves={"model": model, "noop": [point("json", 900)]}, ratios=protocol_ratios(model)[0])
    assert report.ratios == {"oip-binary": {"8": 1.5}, "oip-grpc": {"8": 0.95}}
    assert protocol_ratios(model)[1] == {}  # one round: no spread
    text = render_serve_load(report)
    assert "noop (the JSON route only): serving noop" in text
    assert "oip-binary 1.50x at 8" in text and "oip-grpc   0.95x at 8" in text
    assert "8 row(s) per request" in text and "1200.0" in text

    # over rounds: round i of each protocol against round i of the JSON route
    def rounds(protocol: str, *requests: int) -> object:
        return median_point([point(protocol, n) for n in requests])

    model = [rounds("json", 200, 400, 200), rounds("oip-binary", 180, 480, 220),
             rounds("oip-grpc", 190, 380, 210)]
    ratios, ranges = protocol_ratios(model)
    assert ratios == {"oip-binary": {"8": 1.1}, "oip-grpc": {"8": 1.05}}
    assert ranges == {"oip-binary": {"8": [0.9, 1.2]}, "oip-grpc": {"8": [0.95, 1.05]}}
    text = render_serve_load(replace(report, curves={"model": model}, ratios=ratios,
                                     ratio_ranges=ranges))
    assert "(rows/s alike) [lowest-highest round]:" in text
    assert "oip-binary 1.10x at 8 [0.90-1.20]" in text
    assert "oip-grpc   1.05x at 8 [0.95-1.05]" in text
