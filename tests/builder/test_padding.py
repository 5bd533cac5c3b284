"""Declared padding (``build --pad``): proven on the model at build, applied by the predictor,
refused where padding changes the answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkan_pack import InputError, PaddingError, Predictor, ShapeSpecError, build
from qkan_pack.format import dumps_manifest, parse_manifest, with_batch_sizes
from qkan_pack.runtime import read_artifact, rebuild_model

from ..conftest import EXAMPLES, MODELS

PADS = MODELS / "pad_models.py"
TOKENS = with_batch_sizes([{"input_ids": (8,), "attention_mask": (8,)},
                           {"input_ids": (16,), "attention_mask": (16,)}], [1, 4])
PAD_TOKENS = {"input_ids": 0, "attention_mask": 0}


def _eager(path: Path) -> torch.nn.Module:
    artifact = read_artifact(path)
    return rebuild_model(artifact, torch.device("cpu"), dict(artifact.manifest.model.config))


def _tokens(batch: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 50, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.int64)
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(PADS, TOKENS, dtype="int64", config={"kind": "masked_meanpool"},
                 output=tmp_path_factory.mktemp("pad") / "masked", pad=PAD_TOKENS,
                 progress=False).path


def test_the_manifest_records_axes_values_and_followers(masked: Path) -> None:
    padding = read_artifact(masked).manifest.padding
    assert padding is not None and dict(padding.values) == PAD_TOKENS
    batch, length = padding.axes
    assert batch.inputs == (("input_ids", 0), ("attention_mask", 0)) and batch.outputs == ((0, 0),)
    assert length.inputs == (("input_ids", 1), ("attention_mask", 1)) and length.outputs == ()
    manifest = read_artifact(masked).manifest
    assert parse_manifest(dumps_manifest(manifest)).padding == padding


@pytest.mark.parametrize(("batch", "length"), [(1, 1), (3, 5), (4, 9), (2, 16), (1, 8)])
def test_padded_calls_equal_eager_on_the_unpadded_input(masked: Path, batch: int,
                                                        length: int) -> None:
    eager = _eager(masked)
    with Predictor.load(masked) as predictor:
        inputs = _tokens(batch, length)
        with torch.no_grad():
            want = eager(**inputs)
        got = predictor(**inputs)
        assert got.shape == want.shape == (batch, 3)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_call_that_fits_nowhere_lists_the_ranges(masked: Path) -> None:
    with Predictor.load(masked) as predictor:
        with pytest.raises(InputError) as info:
            predictor(**_tokens(5, 8))  # batch 5 > 4
        assert "input_ids (1-4)x(1-16) int64" in str(info.value)
        assert {"dtype": "int64", "dims": [[1, 4], [1, 16]]} in [
            entry["input_ids"] for entry in info.value.ranges]
        with pytest.raises(InputError, match="fits no captured shape"):
            predictor(input_ids=torch.zeros(2, 8, dtype=torch.int64),
                      attention_mask=torch.zeros(2, 9, dtype=torch.int64))  # lengths disagree


def test_the_smallest_entry_is_chosen(masked: Path) -> None:
    from qkan_pack.format import fit_entry

    manifest = read_artifact(masked).manifest
    entries = [[tuple(s) for _, s in e.inputs] for e in manifest.shapes]
    names = manifest.input_names
    assert manifest.padding is not None
    index, sizes = fit_entry([(3, 10), (3, 10)], entries, names, manifest.padding)
    assert entries[index] == [(4, 16), (4, 16)] and sizes == (3, 10)
    index, _ = fit_entry([(1, 9), (1, 9)], entries, names, manifest.padding)
    assert entries[index] == [(1, 16), (1, 16)]  # 16 wasted beats 4x16 - 9 wasted


@pytest.mark.parametrize(("kind", "shapes", "pad", "dtype", "says"), [
    ("meanpool", TOKENS, PAD_TOKENS, "int64", "does it use attention_mask in pooling"),
    ("global_pool", [(1, 3, 8, 8), (1, 3, 16, 16)], {"x": 0.0}, "float32",
     "global pool"),
    ("batch_mean", "1x6,8x6", {"x": 0.0}, "float32", "Rows are not independent"),
    # the unmasked pool changes by 1e-8 of the output's scale, by much of its own columns'
    ("large_column", TOKENS, PAD_TOKENS, "int64", "does it use attention_mask in pooling"),
])
def test_padding_that_changes_answers_is_refused_and_nothing_is_written(
        tmp_path: Path, kind: str, shapes: Any, pad: dict, dtype: str, says: str) -> None:
    with pytest.raises(PaddingError, match=says) as info:
        build(PADS, shapes, dtype=dtype, config={"kind": kind}, output=tmp_path / "a", pad=pad,
              progress=False)
    assert info.value.max_rel is not None and info.value.max_rel > info.value.tolerance
    assert info.value.output is not None and info.value.input is not None
    assert not (tmp_path / "a").exists()


def test_an_image_pads_its_height_and_width_apart(tmp_path: Path) -> None:
    """Square entries share their sizes, but height and width are separate axes."""
    from qkan_pack.format import find_axes

    axes, problems = find_axes([{"x": (1, 3, 8, 8)}, {"x": (1, 3, 16, 16)}], ["x"])
    assert problems == [] and [a.inputs for a in axes] == [(("x", 2),), (("x", 3),)]


@pytest.mark.parametrize(("pad", "error", "says"), [
    ({"token_ids": 0}, ShapeSpecError, "not an input"),
    ({"input_ids": 0.5, "attention_mask": 0}, ShapeSpecError, "must be an integer"),
    ({"input_ids": 0}, PaddingError, "attention_mask dim 0 varies with input_ids"),
    ({"input_ids": 99, "attention_mask": 0}, PaddingError,
     "fails on shape .* padded back with attention_mask=0, input_ids=99.*Is each pad value"),
    # beyond int64: was a RuntimeError from torch.full after every reference had run
    ({"input_ids": 0, "attention_mask": 2**63}, ShapeSpecError,
     r"attention_mask: pad value 9223372036854775808 must be an integer from "
     r"-9223372036854775808 to 9223372036854775807 \(int64\)"),
])
def test_bad_declarations_say_what_is_wrong(tmp_path: Path, pad: dict, error: type,
                                            says: str) -> None:
    with pytest.raises(error, match=says):
        build(PADS, TOKENS, dtype="int64", config={"kind": "masked_meanpool"},
              output=tmp_path / "a", pad=pad, progress=False)


def test_a_float_pad_value_beyond_64_bit_integers_is_refused_before_running(
        tmp_path: Path) -> None:
    """`--pad x=99999999999999999999` on a float input passed the magnitude check and was
    "unexpected OverflowError: int too big to convert" from torch.full in the proof; an int
    beyond every float (10**400) was an OverflowError in the check itself."""
    from qkan_pack.format import check_pad_value

    with pytest.raises(ShapeSpecError, match=r"--pad \w+: pad value 99999999999999999999 is an "
                       r"integer beyond 64 bits, which torch cannot fill a float32 input with: "
                       r"write it as a float \(1e\+20\)"):
        build(PADS, "1x6,4x6", config={"kind": "rows"}, output=tmp_path / "a",
              pad={"x": 99999999999999999999}, progress=False)
    assert not (tmp_path / "a").exists()
    with pytest.raises(ShapeSpecError, match=r"pad value 1000.* must be a finite number"):
        check_pad_value(10**400, "float64", "--pad x", ShapeSpecError)
    for fits in (2**63 - 1, -(2**63), 1e20, -3):  # what torch fills a float buffer with
        check_pad_value(fits, "float32", "--pad x", ShapeSpecError)
        torch.full((1,), fits, dtype=torch.float32)


def test_a_pad_id_outside_the_embedding_is_refused_before_running(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(PaddingError, match=r"pad value 100 of input_ids is outside \[0, 100\)"):
        build(MODELS / "hf_models.py", TOKENS, dtype="int64", config={"arch": "bert"},
              output=tmp_path / "a", pad={"input_ids": 100, "attention_mask": 0},
              progress=False)


def test_nothing_to_pad_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PaddingError, match="nothing to pad"):
        build(PADS, "4x6", config={"kind": "rows"}, output=tmp_path / "a", pad={"x": 0.0},
              progress=False)


def test_a_transformers_encoder_and_a_causal_lm_pad_as_declared(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    for arch, follows in (("bert", ()), ("gpt2", ((0, 1),))):
        path = build(MODELS / "hf_models.py", TOKENS, dtype="int64", config={"arch": arch},
                     output=tmp_path / arch, pad=PAD_TOKENS, progress=False).path
        padding = read_artifact(path).manifest.padding
        assert padding is not None and padding.axes[1].outputs == follows, arch
        eager = _eager(path)
        with Predictor.load(path) as predictor:
            inputs = {"input_ids": torch.randint(0, 100, (3, 11)),
                      "attention_mask": torch.ones(3, 11, dtype=torch.int64)}
            with torch.no_grad():
                want = eager(**inputs).logits
            torch.testing.assert_close(predictor(**inputs).logits, want, rtol=1e-5, atol=1e-6)


def test_a_qkan_model_pads_its_batch(tmp_path: Path) -> None:
    pytest.importorskip("qkan")
    path = build(EXAMPLES / "qkan_mlp.py", "1x2,8x2,32x2", output=tmp_path / "q",
                 pad={"x": 0.0}, progress=False).path
    eager = _eager(path)
    with Predictor.load(path) as predictor:
        for rows in (2, 7, 9, 31):
            x = torch.randn(rows, 2)
            with torch.no_grad():
                want = eager(x)
            torch.testing.assert_close(predictor(x), want, rtol=1e-5, atol=1e-6)


def test_the_cli_declares_padding_and_inspect_shows_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from qkan_pack.cli import cli

    done = CliRunner().invoke(cli, [
        "build", str(PADS), "--input", "input_ids:8,16:int64", "--input",
        "attention_mask:8,16:int64", "--batch-sizes", "1,4", "--config", "kind=masked_meanpool",
        "--pad", "input_ids=0", "--pad", "attention_mask=0", "-o", str(tmp_path / "a")])
    assert done.exit_code == 0, done.output
    shown = CliRunner().invoke(cli, ["inspect", str(tmp_path / "a")])
    assert "padded     input_ids=0, attention_mask=0; calls may be smaller along:" in shown.output
    assert "input_ids dim 1, attention_mask dim 1: 8, 16" in shown.output
    data = json.loads(CliRunner().invoke(cli, ["inspect", str(tmp_path / "a"), "--json"]).output)
    assert data["manifest"]["padding"]["values"] == PAD_TOKENS
    bad = CliRunner().invoke(cli, ["build", str(PADS), "--shapes", "1x6,8x6", "--config",
                                   "kind=rows", "--pad", "x", "-o", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "NAME=VALUE" in bad.output


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 4), length=st.integers(1, 16), seed=st.integers(0, 2**16))
def test_any_call_that_fits_equals_eager(masked: Path, batch: int, length: int, seed: int) -> None:
    torch.manual_seed(seed)
    eager = _eager(masked)
    inputs = _tokens(batch, length)
    inputs["attention_mask"][:, length // 2 + 1:] = 0  # right padding of the caller's own
    with Predictor.load(masked) as predictor, torch.no_grad():
        torch.testing.assert_close(predictor(**inputs), eager(**inputs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("kind", "says"), [
    # one tensor per row: build crashed with IndexError naming its outputs
    ("per_row", r"the number of outputs changes with input_ids dim 0, attention_mask dim 0 "
                r"\(4 tensors at size 4, 3 at 3\)"),
    # the batch dimension squeezed away at batch 1: refused as "Rows are not independent"
    ("squeezed", r"output is 1x8x4 padded and sliced back, 8x4 unpadded"),
])
def test_outputs_whose_number_or_shape_change_with_an_axis_are_refused_as_such(
        tmp_path: Path, kind: str, says: str) -> None:
    with pytest.raises(PaddingError, match=says) as info:
        build(PADS, TOKENS, dtype="int64", config={"kind": kind}, output=tmp_path / "a",
              pad=PAD_TOKENS, progress=False)
    assert info.value.max_rel is None and "Rows are not independent" not in str(info.value)
    assert not (tmp_path / "a").exists()


def test_outputs_that_follow_an_axis_in_another_dim_are_sliced_there(tmp_path: Path) -> None:
    """A sequence-first output (length, batch, features): each axis is sliced back in the
    output dimension that follows it."""
    path = build(PADS, TOKENS, dtype="int64", config={"kind": "seq_first"},
                 output=tmp_path / "a", pad=PAD_TOKENS, progress=False).path
    batch, length = read_artifact(path).manifest.padding.axes
    assert batch.outputs == ((0, 1),) and length.outputs == ((0, 0),)
    eager = _eager(path)
    with Predictor.load(path) as predictor:
        for rows, tokens in ((1, 1), (3, 5), (2, 16)):
            inputs = _tokens(rows, tokens)
            with torch.no_grad():
                want = eager(**inputs)
            assert want.shape == (tokens, rows, 4)
            assert torch.equal(predictor(**inputs), want)


def test_a_manifest_whose_padding_the_entries_contradict_is_refused(masked: Path) -> None:
    """A re-hashed manifest saying the classifier's class dimension follows the length axis
    used to load, and cut every padded call's answer to its length (3 classes -> 2)."""
    from dataclasses import replace

    from qkan_pack import ManifestError
    from qkan_pack.format import PaddedAxis

    manifest = read_artifact(masked).manifest
    assert manifest.padding is not None
    batch, length = manifest.padding.axes
    edited = replace(manifest, padding=replace(manifest.padding, axes=(
        batch, PaddedAxis(length.inputs, ((0, 1),)))))
    with pytest.raises(ManifestError, match=r"axes\[1\]\.outputs\[0\] says output 0 dim 1 "
                                            r"follows axis input_ids dim 1, attention_mask dim 1"):
        parse_manifest(dumps_manifest(edited))
    too_big = replace(manifest, padding=replace(manifest.padding,
                                                values={"input_ids": 0, "attention_mask": 2**63}))
    with pytest.raises(ManifestError, match="must be an integer from"):
        parse_manifest(dumps_manifest(too_big))
