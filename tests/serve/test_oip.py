"""The Open Inference Protocol (issue 35): NVIDIA's tritonclient (HTTP and gRPC, sync and
asyncio, JSON and binary tensors), KServe's Python clients and curl against one
``qkan-pack serve --grpc-port`` process with a token; answers equal the ``Predictor``'s.
The protocol's conversions are checked without a server first."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qkan_pack import Predictor, build
from qkan_pack.errors import MalformedRequestError
from qkan_pack.runtime import read_artifact
from qkan_pack.serve._oip import OipModel, merged_shape

from ._server import Server, free_port, grpc_server

TOKEN = "oip-token-0123456789abcdef"
NAME = "mlp"  # served under --name, not the artifact's own


@pytest.fixture(scope="module")
def manifest(artifact: Path) -> Any:
    return read_artifact(artifact).manifest


def _oip(manifest: Any) -> OipModel:
    return OipModel(manifest, NAME, "1", batched=True, server_version="test")


# -- the protocol's data, no server -------------------------------------------------------


def test_metadata_marks_varying_dimensions(manifest: Any) -> None:
    assert merged_shape([(1, 2), (8, 2)]) == (-1, 2)
    assert merged_shape([(1, 2), (1, 2, 3)]) == (-1,)
    meta = _oip(manifest).metadata()
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 2]}]
    assert meta["name"] == NAME and meta["versions"] == ["1"]


def test_binary_and_json_inputs_parse_to_the_same_values(manifest: Any) -> None:
    oip = _oip(manifest)
    values = np.random.rand(1, 2).astype(np.float32)
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 8}}]}).encode()
    binary = oip.parse_http(header + values.tobytes(), str(len(header)))
    plain = oip.parse_http(json.dumps({"inputs": [{"name": "x", "shape": [1, 2],
                                                   "datatype": "FP32",
                                                   "data": values.ravel().tolist()}]}).encode(), None)
    np.testing.assert_array_equal(binary.inputs["x"].array, values)
    np.testing.assert_allclose(plain.inputs["x"].array, values)


@pytest.mark.parametrize(("request_", "header", "says"), [
    ({"inputs": [{"name": "y", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}, None,
     "unknown input 'y'"),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}]}, None,
     "takes FP32"),
    ({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2]}]}, None,
     "holds 3 values, data has 2"),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                  "parameters": {"binary_data_size": 4}}]}, "",
     "binary_data_size is 4 bytes; shape [1, 2] of FP32 takes 8 (2 values x 4 bytes)"),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                  "parameters": {"binary_data_size": "8"}}]}, "",
     "binary_data_size is '8', not a byte count; shape [1, 2] of FP32 takes 8"),
    ({"inputs": []}, None, "missing input(s) ['x']"),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}],
      "outputs": [{"name": "logits"}]}, None, "unknown output 'logits'"),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32"}]}, None, 'no "data"'),
    ({"inputs": [{"name": "x", "shape": [-1, 2], "datatype": "FP32", "data": [1, 2]}]}, None,
     "non-negative integers"),
])
def test_bad_requests_say_what_is_wrong(manifest: Any, request_: dict, header: str | None,
                                        says: str) -> None:
    body = json.dumps(request_).encode()
    with pytest.raises(MalformedRequestError, match=re.escape(says)):
        _oip(manifest).parse_http(body + (b"\0" * 4 if header is not None else b""),
                                  str(len(body)) if header is not None else None)


def test_a_header_length_beyond_the_body_is_refused(manifest: Any) -> None:
    with pytest.raises(MalformedRequestError, match="not a byte count within"):
        _oip(manifest).parse_http(b"{}", "99")


@pytest.mark.parametrize("data", [
    {"b64": "gD+AP4A/gD8=", "dtype": "bfloat16", "shape": [1, 2]},  # bf16 1.0: was 16256.0
    "1.0, 2.0", 1.0, None, True,
])
def test_data_must_be_a_list(manifest: Any, data: Any) -> None:
    """Adversarial pass: ``POST /``'s base64 object in the protocol's ``data`` was read with
    its own dtype's bits as numbers (bfloat16 1.0 into an FP32 input arrived as 16256.0)."""
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                   "data": data}]}).encode()
    with pytest.raises(MalformedRequestError, match='"data" must be a list of the values'):
        _oip(manifest).parse_http(body, None)


@pytest.mark.parametrize("header", ["²", "9" * 5000, "", "-1", " 2", "2 ", "0x2", "1e1", "١٢"])
def test_the_binary_header_length_is_ascii_digits_within_the_body(manifest: Any,
                                                                  header: str) -> None:
    """Adversarial pass: '²' passed ``str.isdigit`` and 5,000 digits passed it too; ``int``
    refused both, a 500 with a traceback."""
    with pytest.raises(MalformedRequestError, match="is not a byte count within the 2-byte"):
        _oip(manifest).parse_http(b"{}", header)


def test_a_content_length_of_many_digits_is_not_trusted() -> None:
    """The same count for ``Content-Length`` (read before the body): 5,000 digits are not a
    count (the body is then counted as it arrives), never a ValueError."""
    from qkan_pack.serve._http import _content_length
    from qkan_pack.serve._wire import header_count

    assert _content_length({"headers": [(b"content-length", b"9" * 5000)]}) is None
    assert _content_length({"headers": [(b"content-length", b"123")]}) == 123
    assert [header_count(v) for v in ("0", "007", "9" * 18, "9" * 19, "²", b"12")] == \
        [0, 7, 10**18 - 1, None, None, 12]


@pytest.mark.parametrize("body", [
    b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2], '
    b'"data": [3, 4]}]}',
    b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}], '
    b'"inputs": []}',
    b'{"inputs": [{"name": "x", "name": "x", "shape": [1, 2], "datatype": "FP32", '
    b'"data": [1, 2]}]}',
    b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}], '
    b'"parameters": {"binary_data_output": true, "binary_data_output": false}}',
    b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}], '
    b'"outputs": [{"name": "output", "parameters": {"binary_data": true, "binary_data": 1}}]}',
    b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [NaN, 2], '
    b'"data": [3, 4]}]}',
    b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", '
    b'"parameters": {"binary_data_size": 8, "binary_data_size": 8}}]}',  # a binary header
])
def test_duplicate_keys_are_refused(manifest: Any, body: bytes) -> None:
    """Adversarial pass: ``/v2`` read bodies with orjson alone, which keeps a duplicate key's
    last value; ``POST /`` refused them. Both now read through ``_wire.decode_body``."""
    binary = b"binary_data_size" in body
    with pytest.raises(MalformedRequestError, match="duplicate JSON key"):
        _oip(manifest).parse_http(body + bytes(8 if binary else 0),
                                  str(len(body)) if binary else None)


def test_a_colon_inside_a_string_is_not_a_duplicate_key(manifest: Any) -> None:
    body = (b'{"id": "a:b", "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", '
            b'"data": [1, 2]}], "parameters": {"note": "k:v"}}')
    parsed = _oip(manifest).parse_http(body, None)
    assert parsed.id == "a:b" and parsed.inputs["x"].array.tolist() == [[1, 2]]


def test_a_lone_surrogate_in_the_id_is_refused_before_the_model_runs(manifest: Any) -> None:
    """Adversarial pass F1: the id is echoed in the reply, whose encoder failed on it (500)."""
    body = (b'{"id": "\\udc80", "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", '
            b'"data": [1, 2]}]}')
    with pytest.raises(MalformedRequestError, match="lone surrogate"):
        _oip(manifest).parse_http(body, None)


INTEGER_INPUTS = {"i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32", "i64": "int64"}
TYPED_INPUTS = {**INTEGER_INPUTS, "flag": "bool"}


@pytest.fixture(scope="module")
def typed_oip(tmp_path_factory: pytest.TempPathFactory) -> OipModel:
    """A model that takes one input of every integer datatype and a BOOL."""
    source = tmp_path_factory.mktemp("typed") / "typed_model.py"
    source.write_text(
        "import torch\n\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, i8, u8, i16, i32, i64, flag):\n"
        "        return (i8.float() + u8.float() + i16.float() + i32.float() + i64.float()\n"
        "                + flag.float())\n\n"
        "def build_model():\n"
        "    return M()\n")
    path = build(source, [{name: (1, 3) for name in TYPED_INPUTS}], dtype=TYPED_INPUTS,
                 input_range=(0, 100), output=source.parent / "typed", progress=False).path
    return _oip(read_artifact(path).manifest)


def _typed_json(values: dict[str, list]) -> bytes:
    from qkan_pack.serve._oip import OIP_DATATYPE

    return json.dumps({"inputs": [
        {"name": name, "shape": [1, 3], "datatype": OIP_DATATYPE[TYPED_INPUTS[name]],
         "data": values.get(name, [True, False, True] if name == "flag" else [1, 2, 3])}
        for name in TYPED_INPUTS]}).encode()


def _limits(dtype: str) -> tuple[int, int]:
    from qkan_pack.format import DTYPES

    limits = DTYPES[dtype].int_limits
    assert limits is not None
    return limits


@pytest.mark.parametrize(("name", "end"), [(n, e) for n in INTEGER_INPUTS for e in (0, 1)])
def test_json_integers_outside_their_datatype_are_refused(typed_oip: OipModel, name: str,
                                                          end: int) -> None:
    """JSON ``data`` one past either end of each integer datatype's range is refused (the
    400 of the protocol's one client error), never wrapped; the ends themselves pass."""
    from qkan_pack.errors import InputError
    from qkan_pack.serve._wire import fit

    dtype = INTEGER_INPUTS[name]
    edge = _limits(dtype)[end]
    parsed = typed_oip.parse_http(_typed_json({name: [edge, edge, 0]}), None)
    assert fit(parsed.inputs[name], name, dtype, ()).tolist() == [[edge, edge, 0]]
    past = edge + (1 if end else -1)
    parsed = typed_oip.parse_http(_typed_json({name: [0, past, 0]}), None)
    with pytest.raises(InputError, match=f"input '{name}' holds"):
        fit(parsed.inputs[name], name, dtype, ())


@pytest.mark.parametrize(("name", "data"), [
    ("i64", [True, 5, 6]), ("i8", [[1], [False], [2]]), ("flag", [True, 1, False]),
])
def test_json_booleans_mixed_with_numbers_are_refused(typed_oip: OipModel, name: str,
                                                      data: list) -> None:
    """Audit M6: numpy read ``[true, 5]`` as the integers ``[1, 5]``, so an INT64 input took
    booleans (and an FP32 input ``[true, false, 1.5]``); true and false are BOOL's only."""
    from qkan_pack.errors import InputError

    with pytest.raises(InputError, match=r"inputs\[\d\] \(\w+\)\.data mixes true/false with"):
        typed_oip.parse_http(_typed_json({name: data}), None)


def test_json_booleans_in_a_float_input_are_refused(manifest: Any) -> None:
    from qkan_pack.errors import InputError

    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                   "data": [True, 1.5]}]}).encode()
    with pytest.raises(InputError, match="mixes true/false with numbers"):
        _oip(manifest).parse_http(body, None)


def _grpc_api(oip: OipModel) -> Any:
    from qkan_pack.serve._http import Admission
    from qkan_pack.serve._oip_grpc import GrpcApi

    class Core:
        async def infer(self, inputs: Any) -> Any:
            return np.zeros((1, 3), np.float32)

    return GrpcApi(oip, Core(), None, Admission(1, 0), retry_after_s=1)


def _grpc_request(api: Any, contents: dict[str, list], raw_flag: bytes | None = None) -> Any:
    """A ModelInfer request of the typed model: typed contents per input (``contents``
    overriding the defaults), or every input raw when ``raw_flag`` gives the BOOL's bytes."""
    from qkan_pack.format import DTYPES
    from qkan_pack.serve._oip import OIP_DATATYPE
    from qkan_pack.serve._oip_grpc import CONTENTS_FIELD

    request = api.pb.ModelInferRequest(model_name=NAME)
    for name, dtype in TYPED_INPUTS.items():
        tensor = request.inputs.add(name=name, datatype=OIP_DATATYPE[dtype], shape=[1, 3])
        values = contents.get(name, [True, False, True] if name == "flag" else [1, 2, 3])
        if raw_flag is None:
            getattr(tensor.contents, CONTENTS_FIELD[dtype]).extend(values)
        else:
            request.raw_input_contents.append(
                raw_flag if name == "flag" else np.array(values, DTYPES[dtype].wire).tobytes())
    return request


def _grpc_infer(api: Any, request: Any) -> _Context:
    context = _Context()
    asyncio.run(api.infer(request, context))
    return context


@pytest.mark.parametrize(("name", "value"), [("i8", 300), ("i8", -129), ("i16", 40000),
                                             ("i16", -32769), ("u8", 256), ("u8", 2**32 - 1)])
def test_grpc_typed_integers_outside_their_datatype_are_invalid_argument(
        typed_oip: OipModel, name: str, value: int) -> None:
    """Adversarial pass: INT8 ``int_contents`` of 300 (an int32 field) made numpy raise
    OverflowError: INTERNAL. Now INVALID_ARGUMENT naming the input and the range, the rule
    of JSON ``data``; values at the range's ends pass."""
    pytest.importorskip("tritonclient.grpc")
    import grpc

    api = _grpc_api(typed_oip)
    context = _grpc_infer(api, _grpc_request(api, {name: [0, value, 1]}))
    dtype = TYPED_INPUTS[name]
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT, context.details
    assert f"input '{name}' holds {value}, outside the {dtype} range" in context.details
    parsed = api.parse(_grpc_request(api, {name: [*_limits(dtype), 0]}))
    assert parsed.inputs[name].array.tolist() == [[*_limits(dtype), 0]]
    assert parsed.inputs[name].array.dtype == np.dtype(dtype)


def test_bool_bytes_other_than_0_and_1_are_refused(typed_oip: OipModel) -> None:
    """Adversarial pass: a BOOL byte of 2 or 255 was kept as a "true" that is not True
    (it compares unequal to True and sums as 2), over HTTP binary and gRPC raw contents."""
    pytest.importorskip("tritonclient.grpc")
    import grpc

    api = _grpc_api(typed_oip)
    assert _grpc_infer(api, _grpc_request(api, {}, raw_flag=bytes([1, 0, 1]))).code is None
    for flag in (bytes([1, 2, 0]), bytes([0, 0, 255])):
        context = _grpc_infer(api, _grpc_request(api, {}, raw_flag=flag))
        assert context.code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"a bool is one byte, 0 (false) or 1 (true); the data holds the byte {max(flag)}" \
            in context.details
    from qkan_pack.serve._oip import OIP_DATATYPE

    inputs = [{"name": name, "shape": [1, 3], "datatype": OIP_DATATYPE[dtype],
               "parameters": {"binary_data_size": 3 * np.dtype(dtype).itemsize}}
              for name, dtype in TYPED_INPUTS.items()]
    header = json.dumps({"inputs": inputs}).encode()
    ones = b"".join(np.ones(3, TYPED_INPUTS[name]).tobytes() for name in INTEGER_INPUTS)
    parsed = typed_oip.parse_http(header + ones + bytes([1, 0, 1]), str(len(header)))
    assert parsed.inputs["flag"].array.tolist() == [[True, False, True]]
    with pytest.raises(MalformedRequestError, match=r"inputs\[5\] \(flag\): a bool is one byte"):
        typed_oip.parse_http(header + ones + bytes([1, 2, 1]), str(len(header)))


def test_grpc_raw_contents_of_another_size_say_both_byte_counts(typed_oip: OipModel) -> None:
    """gRPC raw contents of the wrong size were refused naming HTTP's binary_data_size
    parameter, which a gRPC request has none of: the refusal names the raw contents, their
    size and what the shape and datatype take."""
    pytest.importorskip("tritonclient.grpc")
    import grpc

    api = _grpc_api(typed_oip)
    context = _grpc_infer(api, _grpc_request(api, {}, raw_flag=bytes([1, 0])))
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert context.details.endswith("inputs[5] (flag): raw_input_contents[5] is 2 bytes; "
                                    "shape [1, 3] of BOOL takes 3 (3 values x 1 byte)"), \
        context.details
    request = _grpc_request(api, {}, raw_flag=bytes([1, 0, 1]))
    request.raw_input_contents[0] = np.ones(2, np.int8).tobytes()
    context = _grpc_infer(api, request)
    assert "raw_input_contents[0] is 2 bytes; shape [1, 3] of INT8 takes 3" in context.details


def test_bfloat16_and_integer_outputs_reply_as_the_protocol_types(tmp_path: Path) -> None:
    """BF16 as raw 16 bits in binary and as floats in JSON; a tuple's leaves named by place."""
    from qkan_pack.serve._oip import InferRequest, RequestedOutput

    oip = _oip(read_artifact(_bf16_artifact(tmp_path)).manifest)
    assert [t.to_dict()["datatype"] for t in oip.outputs] == ["BF16", "INT64"]
    values = torch.tensor([[1.5, -2.25]], dtype=torch.bfloat16)
    request = InferRequest({}, "r1", [RequestedOutput("output[0]", True),
                                      RequestedOutput("output[1]", False)])
    body, header = oip.reply((values, np.array([[3, 4]])), request)
    assert header is not None
    head = json.loads(body[:header])
    assert head["id"] == "r1" and head["outputs"][1]["data"] == [3, 4]
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 4
    raw = np.frombuffer(body[header:], np.uint16)
    np.testing.assert_array_equal(raw, values.view(torch.int16).numpy().view(np.uint16).ravel())
    body, header = oip.reply((values, np.array([[3, 4]])), InferRequest({}))
    assert header is None and json.loads(body)["outputs"][0]["data"] == [1.5, -2.25]


def _bf16_artifact(tmp_path: Path) -> Path:
    source = tmp_path / "bf16_model.py"
    source.write_text(
        "import torch\n\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(2, 2)\n\n"
        "    def forward(self, x):\n"
        "        y = self.lin(x)\n"
        "        return y.to(torch.bfloat16), (y > 0).long()\n\n"
        "def build_model():\n"
        "    return M()\n")
    return build(source, "1x2,4x2", output=tmp_path / "bf16", progress=False).path


def test_a_kept_binary_header_reads_each_request_s_own_tensors(manifest: Any) -> None:
    """Binary requests' JSON headers are parsed once and kept (``HeaderPlan``): a request
    that reuses a header gets its own values and the reply the uncached path makes; a body
    whose binary part does not fit the header still gets the uncached path's error; a
    header holding JSON values is not kept, and the kept ones stay bounded."""
    from qkan_pack.serve._oip import CACHED_HEADERS

    oip = _oip(manifest)
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 8}}],
                         "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
                         "id": "r1"}).encode()
    first, second = np.float32([[1.5, 2.5]]), np.float32([[-3.0, 4.0]])
    kept = oip.parse_http(header + first.tobytes(), str(len(header)))
    again = oip.parse_http(header + second.tobytes(), str(len(header)))
    assert kept.plan is not None and again.plan is kept.plan and again.id == "r1"
    np.testing.assert_array_equal(again.inputs["x"].array, second)
    np.testing.assert_array_equal(kept.inputs["x"].array, first)  # not overwritten
    out = np.float32([[0.25, 0.5]])
    fresh = OipModel(manifest, NAME, "1", batched=True, server_version="test")
    uncached = fresh.reply(out, fresh.parse_http(header + first.tobytes(), str(len(header))))
    assert oip.reply(out, kept) == uncached and oip.reply(out, again) == uncached  # kept
    wide = np.float32([[0.25, 0.5], [1.0, 2.0]])
    assert oip.reply(wide, again)[0].endswith(wide.tobytes())  # other shapes, own header
    for body in (header + first.tobytes()[:4], header + first.tobytes() + b"\0" * 4):
        with pytest.raises(MalformedRequestError) as cached_error:
            oip.parse_http(body, str(len(header)))
        with pytest.raises(MalformedRequestError) as plain_error:
            OipModel(manifest, NAME, "1", batched=True, server_version="t").parse_http(
                body, str(len(header)))
        assert str(cached_error.value) == str(plain_error.value)
    values = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                     "data": [1, 2]}]}).encode()
    assert oip.parse_http(values, str(len(values))).plan is None
    for index in range(CACHED_HEADERS + 5):
        other = header.replace(b'"r1"', f'"{index}"'.encode())
        oip.parse_http(other + first.tobytes(), str(len(other)))
    assert len(oip._plans) == CACHED_HEADERS


def _echo_grpc_api(oip: OipModel) -> Any:
    """A ``GrpcApi`` whose model returns its input ``x`` doubled."""
    from qkan_pack.serve._http import Admission
    from qkan_pack.serve._oip_grpc import GrpcApi

    class Core:
        async def infer(self, inputs: Any) -> Any:
            return inputs["x"].array * 2

    return GrpcApi(oip, Core(), None, Admission(4, 0), retry_after_s=1)


def _grpc_call(api: Any, request: Any, payload: bytes | None) -> tuple[Any, _Context]:
    """(the reply as a message, the call's context) of ``ModelInfer``, answered with the
    request's bytes (the HTTP route's way) or without (Ray's)."""
    context = _Context()
    reply = asyncio.run(api.answer("ModelInfer", request, context, payload))
    return (api.pb.ModelInferResponse.FromString(reply) if type(reply) is bytes else reply,
            context)


def test_a_kept_grpc_head_reads_each_request_s_own_tensors(manifest: Any) -> None:
    """gRPC requests that come with their bytes have their head (every field but the raw
    tensors) checked once and kept (``_grpc_wire``): each request reusing it gets its own
    values, and the reply (a kept head plus raw outputs) is byte for byte the message Ray's
    path builds. Raw tensors that do not fit the head, or that do not end the message, get
    the field-by-field reading and its errors; typed contents are not kept; the kept heads
    stay bounded."""
    pytest.importorskip("tritonclient.grpc")
    import grpc

    from qkan_pack.serve._grpc_wire import varint
    from qkan_pack.serve._oip import CACHED_HEADERS

    api = _echo_grpc_api(_oip(manifest))

    def request(values: np.ndarray, request_id: str = "r1", raws: int = 1) -> Any:
        message = api.pb.ModelInferRequest(model_name=NAME, id=request_id)
        message.inputs.add(name="x", datatype="FP32", shape=list(values.shape))
        message.outputs.add(name="output")
        message.raw_input_contents.extend([values.tobytes()] * raws)
        return message

    rng = np.random.default_rng(5)
    for _ in range(3):  # the first keeps the head, the others read through it
        values = rng.standard_normal((1, 2)).astype(np.float32)
        message = request(values)
        reply, context = _grpc_call(api, message, message.SerializeToString())
        plain, _ = _grpc_call(api, message, None)
        assert context.code is None and reply.SerializeToString() == plain.SerializeToString()
        assert reply.id == "r1" and reply.raw_output_contents[0] == (values * 2).tobytes()
    assert len(api._plans) == 1
    (plan,) = api._plans.values()
    assert list(plan.replies) == [(("output", (1, 2)),)]

    wide = rng.standard_normal((4, 2)).astype(np.float32)  # another shape: its own head
    reply, _ = _grpc_call(api, request(wide), request(wide).SerializeToString())
    assert list(reply.outputs[0].shape) == [4, 2] and len(api._plans) == 2

    values = rng.standard_normal((1, 2)).astype(np.float32)
    head = request(values)
    del head.raw_input_contents[:]
    raw = values.tobytes()
    raw_input_tag = b"\x3a"  # raw_input_contents: field 7, length-delimited
    first = raw_input_tag + varint(len(raw)) + raw + head.SerializeToString()  # raws first
    reply, context = _grpc_call(api, api.pb.ModelInferRequest.FromString(first), first)
    assert context.code is None and reply.raw_output_contents[0] == (values * 2).tobytes()
    assert len(api._plans) == 2  # read field by field, not kept

    for bad in (request(values, raws=2), request(values)):
        if len(bad.raw_input_contents) == 1:
            bad.raw_input_contents[0] = raw[:4]
        payload = bad.SerializeToString()
        _, kept = _grpc_call(api, bad, payload)
        _, plain = _grpc_call(_echo_grpc_api(_oip(manifest)), bad, None)
        assert kept.code == plain.code == grpc.StatusCode.INVALID_ARGUMENT
        assert kept.details == plain.details
    typed = api.pb.ModelInferRequest(model_name=NAME)
    typed.inputs.add(name="x", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend(
        [1.0, 2.0])
    reply, context = _grpc_call(api, typed, typed.SerializeToString())
    assert context.code is None and np.frombuffer(reply.raw_output_contents[0],
                                                  np.float32).tolist() == [2.0, 4.0]
    assert len(api._plans) == 2
    for index in range(CACHED_HEADERS + 5):
        message = request(values, request_id=str(index))
        _grpc_call(api, message, message.SerializeToString())
    assert len(api._plans) == CACHED_HEADERS


def _bytes_call(api: Any, payload: bytes, metadata: tuple = ()) -> tuple[Any, _Context, bool]:
    """``ModelInfer`` as the HTTP route answers one from its bytes (``answer_over_http``):
    read through a kept layout when one has them, else parsed. (The reply, the context,
    whether it was read without protobuf.)"""
    kept = api.kept(payload)
    message = None if kept is not None else api.pb.ModelInferRequest.FromString(payload)
    context = _Context(metadata)
    reply = asyncio.run(api.answer("ModelInfer", message, context, payload, kept))
    if type(reply) is bytes:  # an answer; a refusal is the empty message
        reply = api.pb.ModelInferResponse.FromString(reply)
    return reply, context, kept is not None


def test_a_request_with_a_kept_layout_is_read_without_protobuf(manifest: Any) -> None:
    """Once a head is kept, a request whose bytes are that head followed by raw tensors of
    the kept sizes is read by comparing bytes (``_grpc_wire.KeptLayout``), never parsed:
    each gets its own values, and its reply is the one the parsed request gets. Bytes that
    differ anywhere outside the tensors (another id of the same length, another field in
    the tensor's place) are parsed as before; the token is still checked."""
    pytest.importorskip("tritonclient.grpc")
    import hashlib

    import grpc

    from qkan_pack.serve._http import Admission
    from qkan_pack.serve._oip_grpc import GrpcApi

    api = _echo_grpc_api(_oip(manifest))

    def payload(values: np.ndarray, request_id: str = "r1") -> bytes:
        message = api.pb.ModelInferRequest(model_name=NAME, id=request_id)
        message.inputs.add(name="x", datatype="FP32", shape=list(values.shape))
        message.raw_input_contents.append(values.tobytes())
        return message.SerializeToString()

    rng = np.random.default_rng(9)
    read = []
    for _ in range(4):
        values = rng.standard_normal((1, 2)).astype(np.float32)
        reply, context, fast = _bytes_call(api, payload(values))
        plain, _ = _grpc_call(_echo_grpc_api(_oip(manifest)),
                              api.pb.ModelInferRequest.FromString(payload(values)), None)
        assert context.code is None and reply.id == "r1"
        assert reply.SerializeToString() == plain.SerializeToString()
        assert reply.raw_output_contents[0] == (values * 2).tobytes()
        read.append(fast)
    assert read == [False, True, True, True]  # the first keeps the head

    values = rng.standard_normal((1, 2)).astype(np.float32)
    other = payload(values, request_id="r2")  # the same length, another head
    assert api.kept(other) is None
    reply, context, _ = _bytes_call(api, other)
    assert context.code is None and reply.id == "r2"

    tag = payload(values).rfind(b"\x3a\x08")  # raw_input_contents' tag, 8 bytes
    moved = bytearray(payload(values))
    moved[tag] = 0x7A  # field 15 in its place: an unknown field, so no raw tensor
    assert api.kept(bytes(moved)) is None
    _, context, _ = _bytes_call(api, bytes(moved))
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT

    class Stats:
        def request(self, outcome: str) -> None:
            self.outcome = outcome

    core = api.core
    core.stats = Stats()
    guarded = GrpcApi(_oip(manifest), core, hashlib.sha256(b"s3cret").hexdigest(),
                      Admission(4, 0), retry_after_s=1)
    token = (("authorization", "Bearer s3cret"),)
    _bytes_call(guarded, payload(values), token)
    assert guarded.kept(payload(values)) is not None
    reply, context, fast = _bytes_call(guarded, payload(values), (("authorization", "Bearer x"),))
    assert fast and context.code == grpc.StatusCode.UNAUTHENTICATED and not reply.outputs
    assert core.stats.outcome == "unauthorized"
    reply, context, fast = _bytes_call(guarded, payload(values), token)
    assert fast and context.code is None and reply.raw_output_contents[0] == (values * 2).tobytes()


def test_bench_serve_binary_bodies_parse_back_to_the_values_drawn(manifest: Any) -> None:
    """bench-serve's oip-binary requests (its own encoder, not tritonclient's) read by the
    server's parser: the same values in the same shape, binary replies asked for; and its
    raw tensors of every dtype decode to what was drawn (bfloat16: the float32's top bits)."""
    import random

    from qkan_pack.bench._load import RowInput, oip_binary_body, oip_tensors
    from qkan_pack.format import DTYPES
    from qkan_pack.serve._oip import binary_tensor

    rng = random.Random(3)
    tensors = oip_tensors((RowInput("x", (2,)),), rng, count=8)
    body, header = oip_binary_body(tensors)
    parsed = _oip(manifest).parse_http(body, str(header))
    np.testing.assert_array_equal(parsed.inputs["x"].array,
                                  np.array(tensors[0].values, np.float32).reshape(8, 2))
    assert parsed.binary_outputs
    for dtype, spec in DTYPES.items():
        low, high = (0, 100) if spec.kind == "int" else (-2.0, 2.0)
        (tensor,) = oip_tensors((RowInput("t", (3,), spec.kind, low, high, dtype=dtype),), rng, 2)
        raw = tensor.raw()
        given = binary_tensor(memoryview(raw), len(raw), [2, 3], dtype, "t", "inputs[0]")
        assert given.dtype == dtype and given.array.shape == (2, 3)
        if dtype == "bfloat16":
            widened = (given.array.astype(np.uint32) << 16).view(np.float32).ravel()
            np.testing.assert_allclose(widened, tensor.values, rtol=2**-7)
        else:
            np.testing.assert_array_equal(given.array.ravel(),
                                          np.array(tensor.values, np.dtype(spec.wire)))
            if spec.kind == "float":
                np.testing.assert_allclose(given.array.ravel(), tensor.values, rtol=1e-3)


# -- the real clients against a server ----------------------------------------------------


@pytest.fixture(scope="module")
def server(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'qkan-pack[serve]')")
    with grpc_server(artifact, ["--name", NAME, "--max-body-mb", "1"],
                     tmp_path_factory.mktemp("token"), TOKEN) as running:
        yield running


@pytest.fixture(scope="module")
def predictor(artifact: Path) -> Iterator[Predictor]:
    with Predictor.load(artifact, "cpu") as loaded:
        yield loaded


def _rows(count: int) -> np.ndarray:
    return np.random.default_rng(count).random((count, 2), dtype=np.float32)


def _auth(key: str = "Authorization") -> dict[str, str]:
    return {key: f"Bearer {TOKEN}"}  # a fresh dict: tritonclient adds its own headers to it


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_http_sync_and_asyncio(server: Server, predictor: Predictor,
                                            binary: bool) -> None:
    http = pytest.importorskip("tritonclient.http")
    aio = pytest.importorskip("tritonclient.http.aio")
    client = http.InferenceServerClient(f"127.0.0.1:{server.port}")
    assert client.is_server_live(headers=_auth()) and client.is_server_ready(headers=_auth())
    assert client.is_model_ready(NAME, headers=_auth())
    meta = client.get_model_metadata(NAME, headers=_auth())
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    for rows in (1, 8):
        x = _rows(rows)
        given = http.InferInput("x", [rows, 2], "FP32")
        given.set_data_from_numpy(x, binary_data=binary)
        wanted = [http.InferRequestedOutput("output", binary_data=binary)]
        result = client.infer(NAME, [given], outputs=wanted, request_id=f"r{rows}",
                              headers=_auth())
        np.testing.assert_allclose(result.as_numpy("output"), predictor(x), rtol=1e-5, atol=1e-6)
        assert result.get_response()["id"] == f"r{rows}"

    async def with_asyncio() -> np.ndarray:
        async_client = aio.InferenceServerClient(f"127.0.0.1:{server.port}")
        try:
            given = aio.InferInput("x", [1, 2], "FP32")
            given.set_data_from_numpy(_rows(1), binary_data=binary)
            return (await async_client.infer(NAME, [given], headers=_auth())).as_numpy("output")
        finally:
            await async_client.close()

    np.testing.assert_allclose(asyncio.run(with_asyncio()), predictor(_rows(1)), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.serve
@pytest.mark.slow
@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_tritonclient_compressed_requests(server: Server, predictor: Predictor,
                                          compression: str) -> None:
    http = pytest.importorskip("tritonclient.http")
    client = http.InferenceServerClient(f"127.0.0.1:{server.port}")
    x = _rows(1)
    given = http.InferInput("x", [1, 2], "FP32")
    given.set_data_from_numpy(x)
    result = client.infer(NAME, [given], headers=_auth(),
                          request_compression_algorithm=compression)
    np.testing.assert_allclose(result.as_numpy("output"), predictor(x), rtol=1e-5, atol=1e-6)


@pytest.mark.serve
@pytest.mark.slow
def test_hostile_protocol_bodies_are_400s_through_the_server(server: Server,
                                                             predictor: Predictor) -> None:
    """The adversarial pass's HTTP findings end to end: a base64 object as ``data``, a
    header length of '²' or 5,000 digits (a 500 with a traceback before), duplicate keys:
    each a 400 saying what is wrong; a body of two gzip members answers as the whole body."""
    import gzip
    import http.client

    def post(body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            connection.request("POST", f"/v2/models/{NAME}/infer", body,
                               {**_auth(), "Content-Type": "application/json", **headers})
            reply = connection.getresponse()
            return reply.status, json.loads(reply.read())
        finally:
            connection.close()

    x = _rows(1)
    request = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                      "data": x.ravel().tolist()}]}).encode()
    status, reply = post(gzip.compress(request[:25]) + gzip.compress(request[25:]),
                         {"Content-Encoding": "gzip"})
    assert status == 200, reply
    np.testing.assert_allclose(np.array(reply["outputs"][0]["data"], np.float32).reshape(1, 2),
                               predictor(x), rtol=1e-5, atol=1e-6)
    b64 = request.replace(json.dumps(x.ravel().tolist()).encode(),
                          b'{"b64": "gD+AP4A/", "dtype": "bfloat16", "shape": [1, 2]}')
    cases = [(b64, {}, '"data" must be a list'),
             (request, {"Inference-Header-Content-Length": "\u00b2"}, "is not a byte count"),
             (request, {"Inference-Header-Content-Length": "9" * 5000}, "is not a byte count"),
             (request.replace(b'"name": "x"', b'"name": "x", "name": "x"'), {},
              "duplicate JSON key")]
    for body, headers, says in cases:
        status, reply = post(body, headers)
        assert status == 400 and says in reply["error"], (status, reply)


def test_a_compressed_body_inflates_within_the_limit_only() -> None:
    pytest.importorskip("starlette")
    import gzip
    import zlib

    from qkan_pack.serve._http import decompressed

    assert decompressed(gzip.compress(b"x" * 100), "gzip", 100) == b"x" * 100
    assert decompressed(zlib.compress(b"x" * 100), "deflate", 100) == b"x" * 100
    bomb = decompressed(gzip.compress(b"\0" * 10**6), "gzip", 1000)
    assert bomb.status_code == 413 and b"inflates beyond 1000 bytes" in bomb.body
    assert decompressed(b"x", "br", 1000).status_code == 415
    assert decompressed(b"not gzip", "gzip", 1000).status_code == 400


def test_every_gzip_member_inflates_and_the_limit_holds_over_all() -> None:
    """Adversarial pass: members after a gzip body's first were dropped silently (RFC 1952
    allows several; ``gzip.decompress`` reads them all). A truncated stream, bytes after a
    deflate stream or after the last gzip member are refused, not cut short or ignored."""
    pytest.importorskip("starlette")
    import gzip
    import zlib

    from qkan_pack.serve._http import decompressed
    from qkan_pack.serve._inflate import MAX_GZIP_MEMBERS

    parts = [bytes([65 + i % 26]) * 5000 for i in range(40)]
    body = b"".join(gzip.compress(p) for p in parts)
    assert decompressed(body, "gzip", 200_000) == gzip.decompress(body) == b"".join(parts)
    over = decompressed(body, "gzip", 199_999)  # each member small, the sum one byte over
    assert over.status_code == 413 and b"inflates beyond 199999 bytes" in over.body
    for bad, encoding, says in [
            (gzip.compress(b"abc")[:-3], "gzip", b"ends before its stream does"),
            (b"", "gzip", b"ends before its stream does"),
            (gzip.compress(b"abc") + b"junk", "gzip", b"the 4 bytes after gzip member 1 are "
                                                      b"not a gzip member"),
            (zlib.compress(b"abc") + b"junk", "deflate", b"4 bytes follow the end of the "
                                                         b"compressed stream"),
            (gzip.compress(b"") * (MAX_GZIP_MEMBERS + 1), "gzip", b"more than 1024 gzip")]:
        reply = decompressed(bad, encoding, 1000)
        assert reply.status_code == 400 and says in reply.body, reply.body
    assert decompressed(gzip.compress(b"a") * MAX_GZIP_MEMBERS, "gzip", 1024) == b"a" * 1024


@pytest.mark.serve
@pytest.mark.slow
def test_tritonclient_http_errors_follow_the_protocol(server: Server) -> None:
    http = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException

    client = http.InferenceServerClient(f"127.0.0.1:{server.port}")
    cases = [("x", [3, 5], "FP32", "400", "not accepted"),
             ("x", [1, 2], "FP64", "400", "takes FP32"),
             ("y", [1, 2], "FP32", "400", "unknown input 'y'")]
    for name, shape, datatype, status, says in cases:
        given = http.InferInput(name, shape, datatype)
        given.set_data_from_numpy(np.zeros(shape, {"FP32": np.float32, "FP64": np.float64}[datatype]))
        with pytest.raises(InferenceServerException) as info:
            client.infer(NAME, [given], headers=_auth())
        assert info.value.status() == status and says in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("other", headers=_auth())
    assert info.value.status() == "404" and "serves 'mlp' version 1" in info.value.message()
    given = http.InferInput("x", [1, 2], "FP32")
    given.set_data_from_numpy(_rows(1))
    with pytest.raises(InferenceServerException) as info:
        client.infer(NAME, [given])
    assert info.value.status() == "401"


@pytest.mark.serve
@pytest.mark.slow
def test_one_artifact_answers_the_repository_extension_as_triton_without_control(
        server: Server) -> None:
    """Triton with model control ``none``: its repository index lists the model, ready;
    load and unload are refused saying why. Before, the index was a 404 over HTTP and
    UNIMPLEMENTED over gRPC, and tritonclient's get_model_repository_index failed."""
    http = pytest.importorskip("tritonclient.http")
    grpc_client = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    entry = {"name": NAME, "version": "1", "state": "READY", "reason": ""}
    client = http.InferenceServerClient(f"127.0.0.1:{server.port}")
    assert client.get_model_repository_index(headers=_auth()) == [entry]
    assert "model_repository" in client.get_server_metadata(headers=_auth())["extensions"]
    assert server.json("/v2/repository/index", {"ready": True}) == (200, [entry])
    assert server.json("/v2/repository/index", {"ready": "yes"})[0] == 400
    assert server.json("/v2/repository/index", method="GET")[0] == 405
    with pytest.raises(InferenceServerException) as info:
        client.load_model(NAME, headers=_auth())
    assert info.value.status() == "400" and "serves one artifact" in info.value.message()
    assert server.json(f"/v2/repository/models/{NAME}/unload", {})[0] == 400
    assert server.json("/v2/repository/index", {}, token=None)[0] == 401
    grpc = grpc_client.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    auth = _auth("authorization")
    index = grpc.get_model_repository_index(headers=auth, as_json=True)
    assert index["models"] == [{"name": NAME, "version": "1", "state": "READY"}]
    with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*serves one artifact"):
        grpc.unload_model(NAME, headers=auth)
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        grpc.get_model_repository_index()


@pytest.mark.serve
@pytest.mark.slow
def test_triton_statistics_count_the_requests_sent(server: Server) -> None:
    """Triton's statistics extension, as perf_analyzer and tritonclient read it: every
    replica's counts summed; the requests sent show in the success count and in the rows
    inferred, each of HTTP's and gRPC's views alike (it was a 404 and UNIMPLEMENTED)."""
    http = pytest.importorskip("tritonclient.http")
    grpc_client = pytest.importorskip("tritonclient.grpc")

    client = http.InferenceServerClient(f"127.0.0.1:{server.port}")
    grpc = grpc_client.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")

    def stats() -> dict:
        (entry,) = client.get_inference_statistics(NAME, headers=_auth())["model_stats"]
        return entry

    before = stats()
    for _ in range(5):
        given = http.InferInput("x", [1, 2], "FP32")
        given.set_data_from_numpy(_rows(1))
        client.infer(NAME, [given], headers=_auth())
    after = stats()
    assert (after["name"], after["version"]) == (NAME, "1")
    assert after["inference_stats"]["success"]["count"] - \
        before["inference_stats"]["success"]["count"] == 5
    assert after["inference_count"] - before["inference_count"] == 5
    assert 1 <= after["execution_count"] - before["execution_count"] <= 5
    assert after["inference_stats"]["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    assert after["last_inference"] > 0 and after["last_inference"] >= before["last_inference"]
    assert {b["batch_size"] for b in after["batch_stats"]} <= {1, 8, 32, 64}
    assert server.json("/v2/models/stats")[1]["model_stats"] == [after]
    assert server.json("/v2/models/other/stats")[0] == 404
    over_grpc = grpc.get_inference_statistics(NAME, headers=_auth("authorization"),
                                              as_json=True)["model_stats"][0]
    assert int(over_grpc["inference_count"]) == after["inference_count"]
    assert over_grpc["inference_stats"]["success"]["count"] == \
        str(after["inference_stats"]["success"]["count"])


@pytest.mark.serve
@pytest.mark.slow
def test_tritonclient_grpc_sync_and_asyncio(server: Server, predictor: Predictor) -> None:
    grpc_client = pytest.importorskip("tritonclient.grpc")
    aio = pytest.importorskip("tritonclient.grpc.aio")
    from tritonclient.utils import InferenceServerException

    url = f"127.0.0.1:{server.grpc_port}"
    client = grpc_client.InferenceServerClient(url)
    auth = _auth("authorization")
    assert client.is_server_live(headers=auth) and client.is_model_ready(NAME, headers=auth)
    meta = client.get_model_metadata(NAME, headers=auth, as_json=True)
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "2"]}]
    for rows in (1, 8):
        x = _rows(rows)
        given = grpc_client.InferInput("x", [rows, 2], "FP32")
        given.set_data_from_numpy(x)
        result = client.infer(NAME, [given], request_id="g1", headers=auth)
        np.testing.assert_allclose(result.as_numpy("output"), predictor(x), rtol=1e-5, atol=1e-6)
        assert result.get_response().id == "g1"
    given = grpc_client.InferInput("x", [1, 2], "FP32")
    given.set_data_from_numpy(_rows(1))
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        client.infer(NAME, [given])
    bad = grpc_client.InferInput("x", [3, 5], "FP32")
    bad.set_data_from_numpy(np.zeros((3, 5), np.float32))
    with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*not accepted"):
        client.infer(NAME, [bad], headers=auth)
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.get_model_metadata("other", headers=auth)
    with pytest.raises(InferenceServerException, match=r"UNIMPLEMENTED.*not served by qkan-pack"):
        client.get_system_shared_memory_status(headers=auth)
    huge = grpc_client.InferInput("x", [2**18, 2], "FP32")  # 2 MiB, over --max-body-mb 1
    huge.set_data_from_numpy(np.zeros((2**18, 2), np.float32))
    with pytest.raises(InferenceServerException, match="RESOURCE_EXHAUSTED"):
        client.infer(NAME, [huge], headers=auth)

    async def with_asyncio() -> np.ndarray:
        async with aio.InferenceServerClient(url) as async_client:
            given = aio.InferInput("x", [1, 2], "FP32")
            given.set_data_from_numpy(_rows(1))
            return (await async_client.infer(NAME, [given], headers=auth)).as_numpy("output")

    np.testing.assert_allclose(asyncio.run(with_asyncio()), predictor(_rows(1)), rtol=1e-5,
                               atol=1e-6)


#: KServe's clients, run in a process of their own: kserve and tritonclient each register
#: the protocol's ``inference.*`` messages in protobuf's default pool, and a second
#: registration in one process fails ("duplicate symbol").
KSERVE_CLIENTS = """
import asyncio, json, sys
import numpy as np
import kserve

port, grpc_port, name, token = sys.argv[1:]
x = np.array(json.loads(sys.stdin.read()), np.float32)
auth = {"Authorization": f"Bearer {token}"}

async def rest():
    client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2"))
    base = f"http://127.0.0.1:{port}"
    try:
        assert await client.is_server_live(base, headers=dict(auth))
        assert await client.is_model_ready(base, name, headers=dict(auth))
        results = []
        for binary in (True, False):
            given = kserve.InferInput("x", list(x.shape), "FP32")
            given.set_data_from_numpy(x, binary_data=binary)
            reply = await client.infer(base, kserve.InferRequest(name, [given], request_id="k"),
                                       model_name=name, headers=dict(auth))
            assert reply.id == "k"
            results.append(reply.outputs[0].as_numpy().tolist())
        return results
    finally:
        await client.close()

async def grpc():
    client = kserve.InferenceGRPCClient(f"127.0.0.1:{grpc_port}")
    try:
        given = kserve.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        reply = await client.infer(kserve.InferRequest(name, [given]),
                                   headers=(("authorization", auth["Authorization"]),))
        return reply.outputs[0].as_numpy().tolist()
    finally:
        await client.close()

print(json.dumps([*asyncio.run(rest()), asyncio.run(grpc())]))
"""


@pytest.mark.serve
@pytest.mark.slow
def test_kserve_rest_and_grpc_clients(server: Server, predictor: Predictor) -> None:
    if importlib.util.find_spec("kserve") is None:  # not imported here: see KSERVE_CLIENTS
        pytest.skip("kserve is not installed")
    x = _rows(1)
    done = subprocess.run([sys.executable, "-c", KSERVE_CLIENTS, str(server.port),
                           str(server.grpc_port), NAME, TOKEN], input=json.dumps(x.tolist()),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == 3  # REST binary, REST JSON, gRPC
    for got in results:
        np.testing.assert_allclose(np.array(got, np.float32), predictor(x), rtol=1e-5, atol=1e-6)


@pytest.mark.serve
@pytest.mark.slow
def test_curl_json_infer(server: Server, predictor: Predictor) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    x = _rows(1)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]})
    reply = subprocess.run(
        ["curl", "-sS", "-H", f"Authorization: Bearer {TOKEN}", "-d", body,
         f"http://127.0.0.1:{server.port}/v2/models/{NAME}/versions/1/infer"],
        capture_output=True, text=True, check=True, timeout=60)
    output = json.loads(reply.stdout)["outputs"][0]
    assert output["name"] == "output" and output["shape"] == [1, 2]
    np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(1, 2), predictor(x),
                               rtol=1e-5, atol=1e-6)


class _Context:
    """What a gRPC method sees of its call: metadata in, status out."""

    def __init__(self, metadata: tuple = ()) -> None:
        self.metadata, self.code, self.details = metadata, None, None
        self.trailing: tuple = ()

    def invocation_metadata(self) -> tuple:
        return self.metadata

    def set_trailing_metadata(self, metadata: tuple) -> None:
        self.trailing = metadata

    def set_code(self, code: Any) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


def test_grpc_infer_is_bounded_by_the_replicas_admission(manifest: Any) -> None:
    """A full replica answers UNAVAILABLE at once over gRPC, as HTTP answers 503."""
    pytest.importorskip("tritonclient.grpc")
    import grpc

    from qkan_pack.serve._http import Admission
    from qkan_pack.serve._oip_grpc import GrpcApi

    counted: list[str] = []

    class Stats:
        def request(self, kind: str) -> None:
            counted.append(kind)

    class Core:
        stats = Stats()

        async def infer(self, inputs: Any) -> Any:
            return np.zeros((1, 2), np.float32)

    async def two_calls() -> tuple[_Context, _Context]:
        admission = Admission(1, 0)
        api = GrpcApi(_oip(manifest), Core(), None, admission, retry_after_s=1)
        request = api.pb.ModelInferRequest(model_name=NAME)
        request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
        request.raw_input_contents.append(np.zeros((1, 2), np.float32).tobytes())
        await admission.acquire()  # the one slot is taken
        full = _Context()
        await api.infer(request, full)
        admission.release()
        served = _Context()
        reply = await api.infer(request, served)
        assert reply.outputs[0].name == "output"
        return full, served

    full, served = asyncio.run(two_calls())
    assert full.code == grpc.StatusCode.UNAVAILABLE and "overloaded" in full.details
    assert full.trailing == (("grpc-retry-pushback-ms", "1000"),)  # gRPC's Retry-After
    assert served.code is None and counted == ["overloaded"] and served.trailing == ()


def test_an_unserved_rpc_answers_unimplemented_with_an_empty_reply(manifest: Any) -> None:
    """Ray's Python gRPC proxy serialises whatever a method returns: the None an unserved
    RPC returned became INTERNAL with a Ray traceback ("'NoneType' object has no attribute
    'SerializeToString'") instead of UNIMPLEMENTED."""
    pytest.importorskip("tritonclient.grpc")
    import grpc

    api = _grpc_api(_oip(manifest))
    for rpc in ("ModelStatistics", "CudaSharedMemoryStatus", "LogSettings"):
        context = _Context()
        reply = asyncio.run(api.answer(rpc, getattr(api.pb, f"{rpc}Request")(), context))
        assert context.code == grpc.StatusCode.UNIMPLEMENTED, rpc
        assert type(reply) is getattr(api.pb, f"{rpc}Response")
        assert reply.SerializeToString() == b""


@pytest.mark.serve
@pytest.mark.slow
def test_grpc_through_rays_own_proxy(artifact: Path, predictor: Predictor) -> None:
    """``--ingress python`` (also what ``auto`` takes without HAProxy): Ray's proxy pickles
    each message to pass it on, which the stubs' module name broke (UNKNOWN, PicklingError)."""
    grpc_client = pytest.importorskip("tritonclient.grpc")
    pytest.importorskip("ray")
    from tritonclient.utils import InferenceServerException

    grpc_port = free_port()
    running = Server(artifact, ["--ingress", "python", "--grpc-port", str(grpc_port)]).start()
    try:
        client = grpc_client.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        x = _rows(1)
        given = grpc_client.InferInput("x", [1, 2], "FP32")
        given.set_data_from_numpy(x)
        result = client.infer(read_artifact(artifact).manifest.metadata.name, [given])
        np.testing.assert_allclose(result.as_numpy("output"), predictor(x), rtol=1e-5, atol=1e-6)
        with pytest.raises(InferenceServerException, match=r"UNIMPLEMENTED.*not served"):
            client.get_cuda_shared_memory_status()  # not INTERNAL with Ray's traceback
        assert [m.name for m in client.get_model_repository_index().models] == [
            read_artifact(artifact).manifest.metadata.name]
    finally:
        running.stop()
        running.kill()


def test_outputs_are_named_by_what_the_shape_that_ran_returns(tmp_path: Path) -> None:
    """Declared shapes may return different structures (an extra output in batches, keys
    in another order): a requested output is found by its name in the reply that ran, never
    by its position among every shape's outputs (which sent the logits as ``output.probs``,
    or failed with an IndexError)."""
    from qkan_pack import build
    from qkan_pack.errors import MalformedRequestError as Malformed
    from qkan_pack.serve._oip import InferRequest, RequestedOutput

    from ..conftest import MODELS

    with pytest.warns(UserWarning, match="rows are not independent"):
        path = build(MODELS / "row_models.py", "1x8,8x8", config={"kind": "extra_output"},
                     output=tmp_path / "a", progress=False).path
    oip = OipModel(read_artifact(path).manifest, NAME, "1", batched=True, server_version="t")
    logits, probs = np.ones((8, 3), np.float32), np.full((8, 3), 0.5, np.float32)
    asked = InferRequest({}, outputs=[RequestedOutput("output.probs", False)])
    for reply in ({"logits": logits, "probs": probs}, {"probs": probs, "logits": logits}):
        ((name, values, _),) = oip.output_values(reply, asked)
        assert name == "output.probs" and np.array_equal(values, probs)
    with pytest.raises(Malformed, match=r"not returned for this request's shape"):
        oip.output_values({"logits": logits[:1]}, asked)
    every = oip.output_values({"logits": logits[:1]}, InferRequest({}))
    assert [name for name, _, _ in every] == ["output.logits"]
