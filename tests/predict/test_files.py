"""``qkan-pack predict``'s files: inputs read exactly as serve reads them, outputs written
whole under the names the protocol uses, never inside an artifact."""

from __future__ import annotations

import base64
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qkan_pack import ArtifactError, InputFileError, ModelSourceError, build
from qkan_pack.format import manifest_schema
from qkan_pack.predict import named_outputs, read_inputs, summarize, write_outputs
from qkan_pack.runtime import read_artifact

from ..conftest import MODELS
from ..test_cli_machine import run


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(MODELS / "plain_mlp.py", "2x2", output=tmp_path_factory.mktemp("a") / "mlp",
                 progress=False).path


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(MODELS / "multi_io.py", [{"a": (1, 3), "b": (1, 2)}],
                 dtype={"a": "float32", "b": "int64"},
                 output=tmp_path_factory.mktemp("m") / "multi", progress=False).path


def _json_file(tmp_path: Path, value: Any) -> Path:
    path = tmp_path / "in.json"
    path.write_text(json.dumps(value))
    return path


# -- -o never writes inside an artifact ------------------------------------------------------


@pytest.mark.parametrize("inside", ["manifest.json", "weights.safetensors", "new.npz",
                                    "sub/out.npz"])
def test_an_output_inside_an_artifact_is_refused_before_the_load(artifact: Path, tmp_path: Path,
                                                                 inside: str) -> None:
    """`-o art/manifest.json` overwrote the manifest: build, warm and sign refuse such paths,
    and predict now asks the same question (runtime.refuse_unsafe_output)."""
    np.save(tmp_path / "x.npy", np.ones((2, 2), np.float32))
    before = {p: p.read_bytes() for p in artifact.rglob("*") if p.is_file()}
    done = run("predict", artifact, "--input", tmp_path / "x.npy", "-o", artifact / inside)
    assert done.exit_code == 1, done.output
    assert "lies inside the artifact" in done.output and "choose a path outside it" in done.output
    assert {p: p.read_bytes() for p in artifact.rglob("*") if p.is_file()} == before
    read_artifact(artifact)  # still verifies


def test_an_output_that_is_an_input_file_is_refused_before_the_load(artifact: Path,
                                                                     tmp_path: Path) -> None:
    """Sixth pass L4: `predict --input x.npy -o x.npy` replaced the inputs with the outputs."""
    np.save(tmp_path / "x.npy", np.ones((2, 2), np.float32))
    before = (tmp_path / "x.npy").read_bytes()
    done = run("predict", artifact, "--input", tmp_path / "x.npy", "-o", tmp_path / "x.npy")
    assert done.exit_code == 1, done.output
    assert "is also an --input file" in done.output
    assert (tmp_path / "x.npy").read_bytes() == before


def test_a_symlink_into_an_artifact_is_refused_too(artifact: Path, tmp_path: Path) -> None:
    """The write follows symlinks, so the refusal looks where the path resolves."""
    link = tmp_path / "out.json"
    os.symlink(artifact / "manifest.json", link)
    with pytest.raises(ArtifactError, match="lies inside the artifact"):
        write_outputs({"output": np.ones(2, np.float32)}, link)
    read_artifact(artifact)


@pytest.mark.parametrize("link_to", ["missing/out.npy", "missing/deeper/out.npy"])
def test_a_symlink_to_a_missing_folder_is_refused_and_nothing_is_created(
        tmp_path: Path, link_to: str) -> None:
    """``-o dang.npy``, a symlink to ``/nonexistent/zz``, wrote through it and created
    ``/nonexistent`` (as root, anywhere): predict creates only the folders of the path it
    is given."""
    link = tmp_path / "dang.npy"
    os.symlink(tmp_path / link_to, link)
    folder = tmp_path / "folder"
    os.symlink(tmp_path / "gone", folder)
    for path in (link, folder / "out.npy", folder / "sub" / "out.npy"):
        with pytest.raises(InputFileError, match=r"is a symlink to .* does not exist: predict "
                                                 r"creates the missing folders of the path"):
            write_outputs({"output": np.ones(2, np.float32)}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dang.npy", "folder"]
    (tmp_path / "there").mkdir()
    os.symlink(tmp_path / "there", tmp_path / "linked")
    written = [write_outputs({"output": np.ones(2, np.float32)}, path)[0]
               for path in (tmp_path / "linked" / "new" / "out.npy", tmp_path / "a" / "b.npy")]
    assert [np.load(path).tolist() for path in written] == [[1.0, 1.0]] * 2
    assert (tmp_path / "there" / "new" / "out.npy").is_file()


# -- JSON inputs: serve's strict reading -----------------------------------------------------


def test_json_integers_arrive_exactly(tmp_path: Path) -> None:
    """9007199254740993 (2**53 + 1) came through float64 as ...992."""
    big = 2**53 + 1
    read = read_inputs([(None, _json_file(tmp_path, [[big, -big]]))], ["ids"], {"ids": "int64"})
    assert read["ids"].dtype == np.int64 and read["ids"].tolist() == [[big, -big]]


@pytest.mark.parametrize("value", [[0, 1, 2], [0.5, -1, 0], ["false", "no", ""], [0, 1]])
def test_json_booleans_are_true_or_false_only(tmp_path: Path, value: list) -> None:
    """`[0, 1, 2]`, `[0.5, -1, 0]` and `["false", "no", ""]` were accepted (and "false" was
    True)."""
    with pytest.raises(InputFileError) as caught:
        read_inputs([(None, _json_file(tmp_path, [value]))], ["mask"], {"mask": "bool"})
    assert str(tmp_path / "in.json") in str(caught.value)
    assert ("send true/false" in caught.value.problem
            or "must hold numbers (or booleans) only" in caught.value.problem)
    read = read_inputs([(None, _json_file(tmp_path, [[True, False]]))], ["mask"], {"mask": "bool"})
    assert read["mask"].dtype == np.bool_ and read["mask"].tolist() == [[True, False]]


@pytest.mark.parametrize(("value", "dtype"), [
    ([[True, 2, 3, 4]], "float32"), ([[1, 2], [False, 3]], "int64"), ([[0.5, True]], "float16"),
    ({"a": [[0.5, 1.5, 2.5]], "b": [[True, 7]]}, "int64"),
])
def test_json_booleans_mixed_with_numbers_are_refused(tmp_path: Path, value: Any,
                                                      dtype: str) -> None:
    """Audit M6: numpy read ``[true, 2]`` as the integers ``[1, 2]``, so predict ran a float
    or integer input on booleans."""
    names = list(value) if isinstance(value, dict) else ["x"]
    dtypes = {name: dtype if name != "a" else "float32" for name in names}
    with pytest.raises(InputFileError) as caught:
        read_inputs([(None, _json_file(tmp_path, value))], names, dtypes)
    assert "mixes true/false with numbers" in caught.value.problem


def _served_and_read(value: Any, file_value: Any, dtype: str,
                     tmp_path: Path) -> tuple[Any, Any]:
    """(what serve's JSON route fits from ``value`` as input x of ``dtype``, what predict
    reads from a JSON file of ``file_value``), each the refusal's words where it refuses."""
    pytest.importorskip("orjson", reason="the serve extra is not installed")
    from qkan_pack.errors import InputError
    from qkan_pack.serve import fit, parse_tensor

    try:
        served: Any = fit(parse_tensor(value, "input 'x'"), "x", dtype, ())
    except InputError as exc:
        served = exc.problem
    try:
        read: Any = read_inputs([(None, _json_file(tmp_path, file_value))], ["x"],
                                {"x": dtype})["x"]
    except InputFileError as exc:
        read = exc.problem
    return served, read


@pytest.mark.parametrize(("value", "dtype"), [
    ([[2**53 + 1]], "int64"), ([[1.0, 2.0]], "int64"), ([[300]], "int8"), ([[True]], "int32"),
    ([[0, 1]], "bool"), ([["1"]], "float32"), ([[1e308]], "float32"), ([[1, 2], [3]], "float32"),
    ([[0.5, 1]], "float16"), ([[1.5, 3e38]], "bfloat16"), ([[1.5, -2]], "bfloat16"),
    ([[2**63]], "int64"), ([[2**64]], "int64"), ([[-1]], "uint8"), ([[True, False]], "bool"),
    ([[1, 2**64 - 1]], "int64"), ([[1, 2**63]], "int64"), ([[-(2**63) - 1]], "int64"),
    ([[10**20]], "float32"), ([[-1, 2**64 - 1]], "float32"), ([[-1, 2**64 - 1]], "bfloat16"),
    ([[-1, 2**63]], "bool"), ([[]], "int64"), ([[]], "bool"), ([], "float32"),
])
def test_predict_and_serve_read_json_numbers_alike(tmp_path: Path, value: Any,
                                                   dtype: str) -> None:
    """One parser: what predict reads from a JSON file is what serve's JSON route fits, and
    what one refuses the other refuses with the same words."""
    served, read = _served_and_read(value, value, dtype, tmp_path)
    if isinstance(served, str):
        assert read == served
        return
    if dtype == "bfloat16":  # serve keeps bfloat16 as its raw bits, predict as a tensor
        read = read.view(torch.int16).numpy().view(np.uint16)
    assert read.dtype == served.dtype and np.array_equal(read, served)


@pytest.mark.parametrize(("value", "dtype", "shown"), [
    ([1, 2**64 - 1], "int64", "18446744073709551615"),
    ([-1, 2**64 - 1], "int32", "18446744073709551615"), ([[0.5], [-3e9]], "int32", "-3e+09"),
])
def test_integers_beyond_the_range_read_as_floats_are_said_to_be_outside_it(
        tmp_path: Path, value: Any, dtype: str, shown: str) -> None:
    """`[1, 18446744073709551615]` (numpy reads int64 beside uint64 as float64) for an int
    input was said to hold floats; it holds a number outside the input's range, named
    exactly (float64 had rounded it to 1.84467e+19, 2**64)."""
    with pytest.raises(InputFileError) as caught:
        read_inputs([(None, _json_file(tmp_path, value))], ["ids"], {"ids": dtype})
    assert caught.value.problem.startswith(f"input 'ids' holds {shown}, outside the {dtype} "
                                           "range [")
    with pytest.raises(InputFileError, match="holds floats, which do not convert to int64"):
        read_inputs([(None, _json_file(tmp_path, [1, 2.5]))], ["ids"], {"ids": "int64"})


@pytest.mark.parametrize(("value", "shown"), [
    ([[1, 2**63]], "9223372036854775808"), ([[2**63]], "9223372036854775808"),
    ([[-5, 2**63 + 1]], "9223372036854775809"),
    ([[1, 10**20]], "100000000000000000000"), ([[-(2**63) - 1]], "-9223372036854775809"),
    ([[10**400]], "100000000000000000000000... (401 digits)"),
])
def test_integers_beyond_int64_are_said_to_be_outside_its_range(
        tmp_path: Path, value: Any, shown: str) -> None:
    """`[1, 2**63]` for an int64 input was said to hold floats (float64(2**63 - 1) is 2**63,
    so the range check let it through), and an integer beyond 64 bits (`10**20`) to hold no
    numbers: each is the value, outside int64's range, naming the input."""
    with pytest.raises(InputFileError) as caught:
        read_inputs([(None, _json_file(tmp_path, value))], ["ids"], {"ids": "int64"})
    assert caught.value.problem.startswith(
        f"input 'ids' holds {shown}, outside the int64 range [-9223372036854775808, "
        "9223372036854775807]"), caught.value.problem


@pytest.mark.parametrize("request_body", [
    {"inputs": {"a": [[0.5, 1.5, 2.5]], "b": [[1, 7]]}},
    {"inputs": {"a": [[0.5, 1.5, 2.5]], "b": [[1, 7]]}, "encoding": "list"},
])
def test_a_serve_request_body_is_read_as_its_inputs(tmp_path: Path, request_body: Any) -> None:
    """`predict --input body.json` with the body sent to serve's POST / said the file held
    no numbers: predict reads serve's JSON, so it reads the request's inputs."""
    inputs = request_body["inputs"]
    read = read_inputs([(None, _json_file(tmp_path, request_body))], ["a", "b"],
                       {"a": "float32", "b": "int64"})
    assert read["a"].dtype == np.float32 and read["a"].tolist() == inputs["a"]
    assert read["b"].dtype == np.int64 and read["b"].tolist() == inputs["b"]
    single = read_inputs([(None, _json_file(tmp_path, {"inputs": [[1, 2]]}))], ["x"],
                         {"x": "float32"})
    assert single["x"].tolist() == [[1.0, 2.0]]


@pytest.mark.parametrize(("extra", "unknown"), [
    ({"outputs": ["x"]}, "['outputs']"), ({"x": [[1, 2]]}, "['x']"),
    ({"encoding": "list", "id": 1, "x": 2}, "['id', 'x']"),
])
def test_a_serve_request_with_unknown_keys_names_them(tmp_path: Path, extra: dict,
                                                      unknown: str) -> None:
    """A body with a key serve's ``POST /`` refuses was read as arrays by name and refused
    as holding no numbers; it is a request, and its unknown keys are named as serve names
    them."""
    body = {"inputs": {"x": [[1, 2]]}, **extra}
    with pytest.raises(InputFileError) as caught:
        read_inputs([(None, _json_file(tmp_path, body))], ["x"], {"x": "float32"})
    assert caught.value.problem == (f'is a serve request (it has "inputs") with unknown key(s) '
                                    f"{unknown}; a request holds ['encoding', 'inputs'] only")


def test_an_input_given_twice_is_refused_naming_it(tmp_path: Path) -> None:
    """``--input in.json --input x=in.json`` was accepted, one of them silently ignored."""
    first = _json_file(tmp_path, [[1, 2]])
    second = tmp_path / "other.json"
    second.write_text('{"a": [[0.5, 1.5, 2.5]], "b": [[3, 4]]}')
    for given, names in [([(None, first), ("x", first)], ["x"]),
                         ([("b", first), (None, second)], ["a", "b"])]:
        with pytest.raises(InputFileError) as caught:
            read_inputs(given, names, {"x": "int64", "a": "float32", "b": "int64"})
        twice = "x" if names == ["x"] else "b"
        assert caught.value.problem == (f"input {twice!r} is given twice (--input {first} "
                                        "gives it too): give each input once")


@pytest.mark.parametrize(("names", "said"), [
    (["x"], "no input is named 'y'; inputs are x"),
    (["ids"], "no input is named 'y'; inputs are ids (or x)"),
    (["a", "b"], "no input is named 'y'; inputs are a, b"),
])
def test_an_unknown_input_name_lists_the_inputs(tmp_path: Path, names: list[str],
                                                said: str) -> None:
    """A model whose one input is x was said to take "x (or x)"."""
    with pytest.raises(InputFileError) as caught:
        read_inputs([("y", _json_file(tmp_path, [[1, 2]]))], names,
                    dict.fromkeys(names, "float32"))
    assert caught.value.problem == said


def test_an_empty_row_for_an_integer_input_is_refused_for_its_shape(multi: Path,
                                                                    tmp_path: Path) -> None:
    """``{"b": [[]]}`` for an int64 input was said to hold floats (numpy reads an empty list
    as float64): it holds no values, so it is its shape that no declared one accepts."""
    read = read_inputs([(None, _json_file(tmp_path, {"a": [[]], "b": [[]]}))], ["a", "b"],
                       {"a": "float32", "b": "int64"})
    assert read["b"].dtype == np.int64 and read["b"].shape == (1, 0)
    body = _json_file(tmp_path, {"a": [[0.5, 1.5, 2.5]], "b": [[]]})
    done = run("predict", multi, "--input", body)
    assert done.exit_code == 1, done.output
    assert done.output.endswith("input shape 1x3, 1x0 is not in the manifest; accepted: "
                                "a: 1x3 float32, b: 1x2 int64\n"), done.output


def _b64(array: np.ndarray, dtype: str | None = None) -> dict[str, Any]:
    return {"b64": base64.b64encode(array.tobytes()).decode(), "dtype": dtype or array.dtype.name,
            "shape": list(array.shape)}


@pytest.mark.parametrize("encoding", [None, "list", "base64"])
def test_a_serve_request_with_base64_tensors_is_read_as_serve_reads_it(
        tmp_path: Path, encoding: str | None) -> None:
    """`predict --input body.json` with a body that serve's POST / takes, its tensors sent
    as ``{"b64", "dtype", "shape"}``, said input 'x' "must hold numbers", and one with
    ``"encoding": "base64"`` (how serve writes its reply) was refused: both are read, the
    tensors to the bytes sent, alone and by name, and ``encoding`` has no other effect."""
    x = np.random.default_rng(0).standard_normal((1, 2)).astype(np.float32)
    a = np.random.default_rng(1).standard_normal((1, 3)).astype(np.float32)
    b = np.array([[7, -(2**40)]], np.int64)
    extra = {} if encoding is None else {"encoding": encoding}
    single = read_inputs([(None, _json_file(tmp_path, {"inputs": _b64(x), **extra}))], ["x"],
                         {"x": "float32"})
    assert single["x"].dtype == np.float32 and np.array_equal(single["x"], x)
    alone = read_inputs([(None, _json_file(tmp_path, _b64(x)))], ["x"], {"x": "float32"})
    assert np.array_equal(alone["x"], x)
    body = {"inputs": {"a": _b64(a), "b": b.tolist()}, **extra}
    read = read_inputs([(None, _json_file(tmp_path, body))], ["a", "b"],
                       {"a": "float32", "b": "int64"})
    assert np.array_equal(read["a"], a) and read["b"].dtype == np.int64
    assert np.array_equal(read["b"], b)
    b_file, a_file = tmp_path / "b.json", tmp_path / "a.json"
    b_file.write_text(json.dumps(_b64(b)))
    a_file.write_text(json.dumps(a.tolist()))
    named = read_inputs([("b", b_file), ("a", a_file)], ["a", "b"],
                        {"a": "float32", "b": "int64"})
    assert np.array_equal(named["b"], b) and np.array_equal(named["a"], a)


def test_a_base64_bfloat16_tensor_keeps_its_bits(tmp_path: Path) -> None:
    """A bfloat16 input sent as base64 bits arrives as a bfloat16 tensor of those bits."""
    tensor = torch.tensor([[1.5, -2.25, 3e38]], dtype=torch.bfloat16)
    bits = tensor.view(torch.int16).numpy()
    read = read_inputs([(None, _json_file(tmp_path, _b64(bits, "bfloat16")))], ["x"],
                       {"x": "bfloat16"})["x"]
    assert read.dtype == torch.bfloat16 and torch.equal(read.view(torch.int16), tensor.view(
        torch.int16))


@pytest.mark.parametrize(("tensor", "dtype"), [
    ({"b64": base64.b64encode(np.zeros((1, 2), np.float64).tobytes()).decode(),
      "dtype": "float64", "shape": [1, 2]}, "float32"),
    ({"b64": base64.b64encode(np.zeros(3, np.float32).tobytes()).decode(),
      "dtype": "float32", "shape": [1, 2]}, "float32"),
    ({"b64": "not base64!", "dtype": "float32", "shape": [1, 2]}, "float32"),
    ({"b64": "AAAAAAAAAAA=", "dtype": "float99", "shape": [1, 2]}, "float32"),
    ({"b64": "AAAAAAAAAAA=", "dtype": "float32", "shape": [1, -2]}, "float32"),
    ({"b64": "AAAAAAAAAAA=", "dtype": "float32"}, "float32"),
    ({"b64": base64.b64encode(np.array([[np.nan, 1]], np.float32).tobytes()).decode(),
      "dtype": "float32", "shape": [1, 2]}, "float32"),
    ({"b64": base64.b64encode(bytes([1, 2])).decode(), "dtype": "bool", "shape": [1, 2]},
     "bool"),
    ({"b64": base64.b64encode(np.array([[1, 2]], np.int64).tobytes()).decode(),
      "dtype": "int64", "shape": [1, 2]}, "int64"),
])
def test_predict_and_serve_read_base64_tensors_alike(tmp_path: Path, tensor: dict,
                                                      dtype: str) -> None:
    """One reader (``runtime.b64_tensor``, ``runtime.typed_input``): what predict reads from
    a base64 tensor is what serve's JSON route fits, and what one refuses (another dtype
    than the input's, a byte count that is not the shape's, text that is not base64, an
    unknown dtype, a bad shape, a missing key, NaN, a bool byte of 2) the other refuses
    with the same words."""
    served, read = _served_and_read(tensor, {"inputs": tensor}, dtype, tmp_path)
    if isinstance(served, str):
        assert read == served
        return
    assert isinstance(read, np.ndarray) and read.dtype == served.dtype
    assert np.array_equal(read, served)


def test_an_input_named_b64_is_read_by_name(tmp_path: Path) -> None:
    """A model whose inputs are called ``b64`` and ``shape`` was fed by name until the file's
    object was taken for one base64 tensor: an object whose keys all name inputs is inputs
    by name, here and in serve's POST /."""
    pytest.importorskip("orjson", reason="the serve extra is not installed")
    from qkan_pack.serve import parse_request

    inputs = {"b64": [[0.5, 1.5]], "shape": [[2, 3]]}
    dtypes = {"b64": "float32", "shape": "int64"}
    for body in (inputs, {"inputs": inputs}):
        read = read_inputs([(None, _json_file(tmp_path, body))], list(dtypes), dtypes)
        assert read["b64"].tolist() == [[0.5, 1.5]] and read["shape"].tolist() == [[2, 3]]
    given, _ = parse_request(json.dumps({"inputs": inputs}).encode(), list(dtypes))
    assert sorted(given) == ["b64", "shape"]
    one = read_inputs([(None, _json_file(tmp_path, {"b64": [[0.5, 1.5]]}))], ["b64"],
                      {"b64": "float32"})
    assert one["b64"].tolist() == [[0.5, 1.5]]


@pytest.mark.parametrize(("tensor", "said"), [
    ({"b64": "AAAAAAAAAAA=", "dtype": "float32", "shape": [1, 2], "order": "C"},
     'a base64 tensor has exactly the keys "b64", "dtype", "shape"; got [\'b64\', '
     "'dtype', 'order', 'shape']"),
    ({"b64": 12345, "dtype": "float32", "shape": [1, 2]},
     ".b64 must be a string of base64 text, not int"),
    ({"b64": "AAAA\nAAAAAAA=", "dtype": "float32", "shape": [1, 2]},
     "it holds line breaks or spaces: encode without them (base64 -w 0, Python's "
     "base64.b64encode)"),
    ({"b64": "", "dtype": "float32", "shape": [0, 2**31 - 1, 2**31 - 1, 2**31 - 1]},
     ".shape [0, 2147483647, 2147483647, 2147483647] is beyond what one array can index"),
])
def test_a_malformed_base64_tensor_is_said_as_serve_says_it(tmp_path: Path, tensor: dict,
                                                             said: str) -> None:
    """An object with a key beyond b64/dtype/shape was said to "hold numbers only" by
    predict (serve named the key), a non-string b64 and a line-wrapped one were refused in
    Python's words, and an unindexable shape in numpy's: each is now said in the request's
    terms, alone, by name and inside a request, by predict and serve alike."""
    pytest.importorskip("orjson", reason="the serve extra is not installed")
    from qkan_pack.errors import MalformedRequestError
    from qkan_pack.serve import parse_request

    for body in (tensor, {"x": tensor}, {"inputs": tensor}, {"inputs": {"x": tensor}}):
        with pytest.raises(InputFileError) as caught:
            read_inputs([(None, _json_file(tmp_path, body))], ["x"], {"x": "float32"})
        assert said in caught.value.problem, (body, caught.value.problem)
    with pytest.raises(MalformedRequestError) as refused:
        parse_request(json.dumps({"inputs": tensor}).encode(), ["x"])
    assert said in refused.value.problem


def test_a_serve_request_with_an_unknown_encoding_is_refused(tmp_path: Path) -> None:
    body = {"inputs": [[0.5, 1.5]], "encoding": "hex"}
    with pytest.raises(InputFileError) as caught:
        read_inputs([(None, _json_file(tmp_path, body))], ["x"], {"x": "float32"})
    assert caught.value.problem == ('is a serve request with "encoding": "hex", which is none '
                                    "of list, base64 (the reply's encoding)")


def test_predict_runs_a_base64_request_body_as_serve_answers_it(artifact: Path,
                                                                tmp_path: Path) -> None:
    """End to end: the CLI's outputs for a base64 body are those for the same values as
    lists."""
    x = np.random.default_rng(2).standard_normal((2, 2)).astype(np.float32)
    b64_body, list_body = tmp_path / "b64.json", tmp_path / "list.json"
    b64_body.write_text(json.dumps({"inputs": _b64(x), "encoding": "base64"}))
    list_body.write_text(json.dumps({"inputs": x.tolist()}))
    outputs = []
    for body in (b64_body, list_body):
        done = run("predict", artifact, "--input", body, "-o", tmp_path / f"{body.stem}.npy",
                   "--device", "cpu")
        assert done.exit_code == 0, done.output
        outputs.append(np.load(tmp_path / f"{body.stem}.npy"))
    assert np.array_equal(outputs[0], outputs[1])


def test_an_input_named_inputs_keeps_its_name(tmp_path: Path) -> None:
    """A model whose input is called ``inputs`` reads that key as the input, as serve does,
    not as a request wrapping the others."""
    first = _json_file(tmp_path, {"inputs": [[1, 2]]})
    mask = tmp_path / "mask.json"
    mask.write_text("[[3, 4]]")
    read = read_inputs([(None, first), ("mask", mask)], ["inputs", "mask"],
                       {"inputs": "float32", "mask": "float32"})
    assert read["inputs"].tolist() == [[1.0, 2.0]] and read["mask"].tolist() == [[3.0, 4.0]]


def _array_file(tmp_path: Path, suffix: str, array: Any) -> Path:
    from safetensors.torch import save_file

    path = tmp_path / f"in{suffix}"
    if suffix == ".safetensors":
        save_file({"x": array if isinstance(array, torch.Tensor) else torch.from_numpy(array)},
                  path)
    elif suffix == ".npz":
        np.savez(path, x=array)
    else:
        np.save(path, array)
    return path


@pytest.mark.parametrize(("suffix", "array", "want", "how"), [
    (".safetensors", torch.ones(2, 2, dtype=torch.float16), "float32",
     "convert its tensor with tensor.to(torch.float32) and save the file again "
     "(safetensors.torch.save_file)"),
    (".safetensors", torch.ones(2, 2, dtype=torch.bfloat16), "float32",
     "convert its tensor with tensor.to(torch.float32)"),
    (".npy", np.ones((2, 2), np.float16), "float32",
     "convert it with array.astype(numpy.float32) and save the file again"),
    (".npz", np.ones((2, 2), np.int32), "int64", "convert it with array.astype(numpy.int64)"),
    (".npy", np.ones((2, 2), np.float32), "bfloat16", "numpy has no bfloat16: write a "
     ".safetensors file of a bfloat16 tensor"),
])
def test_a_file_of_another_dtype_says_both_and_how_to_convert_it(
        tmp_path: Path, suffix: str, array: Any, want: str, how: str) -> None:
    """A .safetensors file of float16 for a float32 input was told to use
    ``array.astype``, numpy's words for a torch file, and not which dtype was wanted."""
    path = _array_file(tmp_path, suffix, array)
    found = str(array.dtype).removeprefix("torch.")
    with pytest.raises(InputFileError) as caught:
        read_inputs([(None, path)], ["x"], {"x": want})
    assert caught.value.path == f"--input {path}"
    assert caught.value.problem.startswith(
        f"input 'x' is {found} in the file, and the model takes {want}: {how}"), \
        caught.value.problem


def test_a_file_of_integers_beyond_the_inputs_range_says_so(tmp_path: Path) -> None:
    """uint64 2**63 for an int64 input was told to convert with ``astype(numpy.int64)``,
    which wraps it to -2**63."""
    path = _array_file(tmp_path, ".npz", np.array([[1, 2**63]], np.uint64))
    with pytest.raises(InputFileError) as caught:
        read_inputs([(None, path)], ["x"], {"x": "int64"})
    assert caught.value.problem == ("input 'x' holds 9223372036854775808, outside the int64 "
                                    "range [-9223372036854775808, 9223372036854775807]")
    fits = read_inputs([(None, _array_file(tmp_path, ".npy", np.ones((1, 2), np.int64)))], ["x"],
                       {"x": "int64"})
    assert fits["x"].dtype == np.int64


# -- outputs ---------------------------------------------------------------------------------


def test_output_names_numpy_reserves_are_written(tmp_path: Path) -> None:
    """`np.savez(path, **arrays)` dropped an output named allow_pickle and failed on one named
    file."""
    outputs = {"allow_pickle": np.arange(3, dtype=np.float32), "file": np.ones((2, 2), np.int64),
               "output.a[0]": np.zeros(1, np.float32)}
    path, notes = write_outputs(outputs, tmp_path / "out.npz")
    assert notes == []
    with np.load(path, allow_pickle=False) as got:
        assert sorted(got.files) == sorted(outputs)
        for name, value in outputs.items():
            assert got[name].dtype == value.dtype and np.array_equal(got[name], value)


def test_bfloat16_outputs_are_written_and_summarised(tmp_path: Path) -> None:
    """Every bfloat16 output crashed predict (.npy, .safetensors and the table)."""
    from safetensors.torch import load_file

    value = torch.tensor([[1.5, -2.25], [3.0e38, 0.1]]).bfloat16()
    exact = value.float().numpy()
    path, notes = write_outputs({"output": value}, tmp_path / "out.safetensors")
    assert notes == [] and torch.equal(load_file(str(path))["output"], value)
    for suffix in (".npy", ".npz", ".json"):
        path, notes = write_outputs({"output": value}, tmp_path / f"out{suffix}")
        assert notes == [f"output output is bfloat16, written as float32 ({suffix} has no "
                         "bfloat16; .safetensors keeps it)"]
        if suffix == ".json":
            got = np.asarray(json.loads(path.read_text())["output"], np.float32)
        else:
            got = np.load(path)["output"] if suffix == ".npz" else np.load(path)
        assert got.dtype == np.float32 and np.array_equal(got, exact)
    table = summarize({"output": value})
    assert table.splitlines()[1].split()[:3] == ["output", "2x2", "bfloat16"]
    assert table.splitlines()[1].split()[-1] == f"{exact.max():.4g}"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_json_output_never_holds_nan_or_infinity(tmp_path: Path, bad: float) -> None:
    """`-o x.json` wrote NaN, which is not JSON; the refusal leaves the file as it was."""
    path = tmp_path / "out.json"
    path.write_text("kept\n")
    with pytest.raises(InputFileError, match=r"output output holds NaN or Infinity, which JSON "
                                             r"cannot hold: write \.npz or \.safetensors"):
        write_outputs({"output": np.array([1.0, bad], np.float32)}, path)
    assert path.read_text() == "kept\n"
    assert not list(tmp_path.glob(".out.json.*"))  # no staging file left behind
    written, _ = write_outputs({"output": np.array([1.0, bad], np.float32)}, tmp_path / "o.npz")
    assert np.array_equal(np.load(written)["output"], [1.0, bad], equal_nan=True)


def test_predict_names_outputs_as_the_manifest_and_the_protocol_do(multi: Path,
                                                                    tmp_path: Path) -> None:
    """predict flattened `{"y": ..., "parts": (...)}` to y, parts.0 while GET / and the Open
    Inference Protocol say output.y, output.parts[0]: one rule (OutputNode.leaf_names)."""
    np.savez(tmp_path / "in.npz", a=np.ones((1, 3), np.float32), b=np.ones((1, 2), np.int64))
    done = run("predict", multi, "--input", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    assert done.exit_code == 0, done.output
    protocol = [o["name"] for o in manifest_schema(read_artifact(multi).manifest)["outputs"]]
    with np.load(tmp_path / "out.npz") as got:
        assert list(got.files) == protocol
    assert protocol == ["output.y", "output.parts[0]", "output.parts[1][0]", "output.parts[1][1]"]
    assert list(named_outputs(torch.ones(2))) == ["output"]


CLASHING = textwrap.dedent("""
    import torch
    from torch import nn

    class Clash(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.linear = nn.Linear(2, 2)

        def forward(self, x):
            y = self.linear(x)
            return {"a.b": y, "a": {"b": 10 * y}}

    def build_model():
        return Clash()
""")


def test_outputs_whose_names_collide_are_refused_at_build(tmp_path: Path) -> None:
    """`{"a.b": y, "a": {"b": 10*y}}`: predict kept one, the protocol's reply the other."""
    model = tmp_path / "clash.py"
    model.write_text(CLASHING)
    with pytest.raises(ModelSourceError) as caught:
        build(model, "1x2", output=tmp_path / "a", progress=False)
    assert caught.value.stage == "build forward"
    assert ("returns two outputs named output.a.b: output['a.b'] and output['a']['b']"
            in str(caught.value))
    assert "rename one of the keys" in str(caught.value) and not (tmp_path / "a").exists()


NAMED = textwrap.dedent("""
    from types import SimpleNamespace

    import torch
    from torch import nn

    KEYS = {
        "text": ["ok", "line\\nOK: verified signature of ACME", "\\x1b[31mred"],
        "nul": ["a\\x00b", "a"],
        "path": ["../../pwn", "plain"],
        "backslash": ["..\\\\pwn", "plain"],
        "one": ["only"],
    }

    class Named(nn.Module):
        def __init__(self, keys):
            super().__init__()
            torch.manual_seed(0)
            self.linear = nn.Linear(2, 3)
            self.keys = keys
            self.config = SimpleNamespace(id2label={0: "cat", 1: "dog\\nOK: verified", 2: "\\u202eeert"})

        def forward(self, x):
            y = self.linear(x)
            return {k: y * (i + 1) for i, k in enumerate(self.keys)}

    def build_model(keys="text"):
        return Named(KEYS[keys])
""")


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Artifacts whose outputs are a dict with the keys ``KEYS[kind]``, built once per kind."""
    folder = tmp_path_factory.mktemp("named")
    model = folder / "named.py"
    model.write_text(NAMED)
    built: dict[str, Path] = {}

    def artifact(kind: str) -> Path:
        if kind not in built:
            built[kind] = build(model, "1x2", config={"keys": kind}, output=folder / kind,
                                progress=False).path
        return built[kind]

    return artifact


def test_the_summary_shows_the_artifacts_text_on_one_line_each(named: Any,
                                                               tmp_path: Path) -> None:
    """An output key or a class label with a newline printed a line of the artifact's
    choosing ("OK: verified signature of ACME"); inspect already escaped them."""
    np.save(tmp_path / "x.npy", np.ones((1, 2), np.float32))
    done = run("predict", named("text"), "--input", tmp_path / "x.npy")
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("OK")], lines
    assert "\x1b" not in done.stdout and "\u202e" not in done.stdout
    assert any(line.startswith("output.line\\nOK: verified signature of ACME ")
               for line in lines), lines
    assert any(line.startswith("output.\\x1b[31mred ") for line in lines), lines
    tops = [line for line in lines if "top class per row" in line]
    assert len(tops) == 3 and all(line.count("\n") == 0 for line in tops)
    assert {line.split(": ", 1)[1] for line in tops} <= {"cat", "dog\\nOK: verified",
                                                          "\\u202eeert"}
    assert len(lines) == 1 + 2 * 3  # a header, a row and a top-class line per output


@pytest.mark.parametrize(("kind", "name"), [("nul", "output.a\x00b"), ("path", "output.../../pwn"),
                                            ("backslash", "output...\\pwn")])
def test_npz_output_names_that_are_no_member_names_are_refused_before_the_load(
        named: Any, tmp_path: Path, kind: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`a\\x00b` was written as member `a` (beside an output `a`: one silently lost), and
    `../../pwn` as a member path climbing out of wherever the archive is unpacked. Refused,
    from the manifest, before the load; .safetensors and .json hold them."""
    from qkan_pack.runtime import Predictor

    path = named(kind)
    np.save(tmp_path / "x.npy", np.ones((1, 2), np.float32))
    loads: list[Any] = []
    monkeypatch.setattr(Predictor, "load", lambda *a, **k: loads.append(a) or pytest.fail())
    done = run("predict", path, "--input", tmp_path / "x.npy", "-o", tmp_path / "out.npz")
    assert done.exit_code == 1 and loads == [], done.output
    assert f"output {name!r} has a NUL, slash or backslash" in done.output
    assert "write .safetensors or .json" in done.output
    assert not list(tmp_path.glob("*.npz")) and not list(tmp_path.glob(".out.npz*"))
    with pytest.raises(InputFileError, match=r"an \.npz member name cannot hold"):
        write_outputs({name: np.ones(2, np.float32), "plain": np.ones(2, np.float32)},
                      tmp_path / "out.npz")  # the Python API, after its own forward
    monkeypatch.undo()
    for suffix in (".safetensors", ".json"):
        done = run("predict", path, "--input", tmp_path / "x.npy", "-o", tmp_path / f"o{suffix}")
        assert done.exit_code == 0, done.output
    from safetensors.numpy import load_file

    assert name in load_file(str(tmp_path / "o.safetensors"))
    assert name in json.loads((tmp_path / "o.json").read_text())


def test_several_outputs_to_npy_are_refused_before_the_load(
        named: Any, multi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`-o out.npy` for a multi-output model was refused only after the load and the forward;
    the manifest already says how many outputs there are."""
    from qkan_pack.runtime import Predictor

    np.savez(tmp_path / "in.npz", a=np.ones((1, 3), np.float32), b=np.ones((1, 2), np.int64))
    real_load = Predictor.load
    loads: list[Any] = []
    monkeypatch.setattr(Predictor, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    done = run("predict", multi, "--input", tmp_path / "in.npz", "-o", tmp_path / "out.npy")
    assert done.exit_code == 1 and loads == [], done.output
    assert ("the model returns 4 tensors ('output.y', 'output.parts[0]', 'output.parts[1][0]', "
            "'output.parts[1][1]'); .npy holds one: write .npz, .safetensors or .json"
            in done.output)
    assert not (tmp_path / "out.npy").exists()
    np.save(tmp_path / "x.npy", np.ones((1, 2), np.float32))
    done = run("predict", named("one"), "--input", tmp_path / "x.npy", "-o", tmp_path / "one.npy")
    assert done.exit_code == 0 and len(loads) == 1, done.output
    assert np.load(tmp_path / "one.npy").shape == (1, 3)
