"""Row independence, proved at build (``builder._row_proof``): models whose rows see each
other inside a batch are recorded as such, models whose rows do not are proved, and the
verdict survives the manifest round trip."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from qkan_pack import build
from qkan_pack.errors import ManifestError, StatefulModelError
from qkan_pack.format import RowProof, parse_manifest
from qkan_pack.runtime import read_artifact

from ..conftest import EXAMPLES, MODELS

ROWS = MODELS / "row_models.py"


def _rows(path: Path) -> list[RowProof | None]:
    return [entry.rows for entry in read_artifact(path).manifest.shapes]


@pytest.mark.parametrize(("kind", "shapes", "why"), [
    ("int8", "1x8,16x8", "depends on the rows batched with it"),
    ("moe", "1x8,16x8", "depends on the rows batched with it"),
    ("batch_max", "1x8,16x8", "depends on the rows batched with it"),
    ("train_norm", "16x8,32x8", "depends on the rows batched with it"),
    ("batch_softmax", "1x8,16x8", "depends on the rows batched with it"),
])
def test_rows_that_see_each_other_are_recorded_dependent(tmp_path: Path, kind: str, shapes: str,
                                                         why: str) -> None:
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(ROWS, shapes, config={"kind": kind}, output=tmp_path / kind,
                       progress=False)
    proofs = _rows(result.path)
    batched = [p for p, e in zip(proofs, result.manifest.shapes) if e.inputs[0][1][0] > 1]
    assert batched and all(p is not None and not p.independent and why in p.detail
                           for p in batched), proofs
    # a batch of one has nobody to mix with: no verdict recorded
    assert all(p is None for p, e in zip(proofs, result.manifest.shapes)
               if e.inputs[0][1][0] == 1)


def test_a_small_column_that_reads_the_batch_is_caught_at_a_batch_of_two(tmp_path: Path) -> None:
    """Adversarial pass F2: a batch of two showed no column's scale, and against the whole
    output's (1e7 larger) the small column's dependence on the other row was invisible."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(ROWS, "2x8", config={"kind": "small_column"}, output=tmp_path / "a",
                       progress=False)
    (proof,) = _rows(result.path)
    assert proof is not None and not proof.independent, proof


def test_a_longer_shape_does_not_loosen_a_shorter_ones_proof(tmp_path: Path) -> None:
    """Re-audit N2: channel scales pooled over every shape held 8x8 to 8x4096's (1e6 times
    larger) and recorded a row that reads its neighbour independent; each shape's scales
    are its own."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(ROWS, "8x8,8x4096", config={"kind": "length_leak"},
                       output=tmp_path / "a", progress=False)
    short, _ = _rows(result.path)
    assert short is not None and not short.independent, short


def test_a_dependence_only_far_beyond_the_draws_needs_the_input_range(tmp_path: Path) -> None:
    """A documented limit (docs/limits.md, docs/security.md): rows that interact only on
    values far beyond the build's draws are proved independent, and a client sending such
    values reaches another's batched reply. ``--input-range`` covering what clients send
    is the remedy: the same model is then recorded dependent."""
    plain = build(ROWS, "8x8", config={"kind": "far_threshold"}, output=tmp_path / "a",
                  progress=False)
    (seen,) = _rows(plain.path)
    assert seen is not None and seen.independent  # the limit
    with pytest.warns(UserWarning, match="rows are not independent"):
        ranged = build(ROWS, "8x8", config={"kind": "far_threshold"}, output=tmp_path / "b",
                       input_range=(-100.0, 100.0), progress=False)
    (proved,) = _rows(ranged.path)
    assert proved is not None and not proved.independent, proved


def test_a_dynamic_quantisation_caught_even_when_the_batch_max_stays(tmp_path: Path) -> None:
    """Zero padding leaves a batch maximum unchanged: the padding proof cannot see this
    model; the row proof runs rows alone and with other neighbours."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(ROWS, "4x8,16x8", config={"kind": "int8"}, output=tmp_path / "a",
                       progress=False)
    assert all(p is not None and not p.independent for p in _rows(result.path))


def test_independent_rows_are_proved(tmp_path: Path) -> None:
    result = build(ROWS, "1x8,4x8,16x8", output=tmp_path / "a", progress=False)
    assert _rows(result.path) == [None, RowProof(True), RowProof(True)]
    assert not any("rows are not independent" in note for note in result.notes)


def test_a_model_that_cannot_run_a_row_alone_is_proved_by_the_other_trials(tmp_path: Path) -> None:
    result = build(ROWS, "16x8", config={"kind": "fixed_batch"}, output=tmp_path / "a",
                   progress=False)
    (proof,) = _rows(result.path)
    assert proof is not None and proof.independent
    assert proof.detail.startswith("rows alone not compared (the model fails when row 0 runs")
    assert proof.detail.count("rows alone") == 1  # one note, not one per row


def test_the_examples_are_proved(tmp_path: Path) -> None:
    pytest.importorskip("qkan")
    plain = build(EXAMPLES / "plain_mlp.py", "1x4,32x4", output=tmp_path / "p", progress=False)
    assert _rows(plain.path) == [None, RowProof(True)]
    qkan = build(EXAMPLES / "qkan_mlp.py", "1x2,8x2,64x2", output=tmp_path / "q", progress=False)
    assert _rows(qkan.path) == [None, RowProof(True), RowProof(True)]


def test_a_model_computing_partly_in_complex64_is_proved(tmp_path: Path) -> None:
    """The HQKAN GPT's solver computes in complex64 even in its float64 copy: its rows alone
    differ from the batch by float32's rounding there, which held to each value's own
    magnitude read as a dependence. Rows alone are compared in float64 only where the model
    is float64 throughout."""
    pytest.importorskip("qkan")
    gpt = build(EXAMPLES / "hqkan_gpt.py", "1x32,4x32", dtype="int64", output=tmp_path / "g",
                progress=False)
    assert _rows(gpt.path) == [None, RowProof(True)]


def test_bert_and_a_cnn_are_proved(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    bert = build(MODELS / "hf_models.py", [{"input_ids": (4, 12), "attention_mask": (4, 12)}],
                 dtype="int64", output=tmp_path / "bert", progress=False)
    assert _rows(bert.path) == [RowProof(True)]
    cnn = build(MODELS / "pad_models.py", "4x3x8x8", config={"kind": "global_pool"},
                output=tmp_path / "cnn", progress=False)
    assert _rows(cnn.path) == [RowProof(True)]


def test_an_entry_without_rows_to_batch_gets_no_verdict(tmp_path: Path) -> None:
    """A per-batch output (a mean over the batch beside the rows): serve never took such an
    entry's rows, so nothing is proved, and build says nothing about rows."""
    source = tmp_path / "stat.py"
    source.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(3, 2)\n"
        "    def forward(self, x):\n"
        "        y = self.linear(x)\n"
        "        return y, y.mean()\n"
        "def build_model():\n"
        "    torch.manual_seed(0)\n"
        "    return M()\n")
    result = build(source, "4x3", output=tmp_path / "a", progress=False)
    assert _rows(result.path) == [None]
    assert not any("rows" in note for note in result.notes)


def _manifest_with_rows(tmp_path: Path, rows: object, entry: int = 1) -> bytes:
    result = build(ROWS, "1x8,4x8", output=tmp_path / "a", progress=False)
    raw = json.loads((result.path / "manifest.json").read_text())
    raw["shapes"][entry]["rows"] = rows
    return json.dumps(raw).encode()


@pytest.mark.parametrize(("rows", "entry", "match"), [
    ({"independent": "yes"}, 1, "independent must be true or false"),
    ({"independent": True, "why": "x"}, 1, r"rows\.why is not a key this format version defines"),
    ([True], 1, "must be"),
    ({"independent": True, "detail": "x" * 401}, 1, "at most 400"),
    ({"independent": True}, 0, "only for a shape whose inputs all lead with one batch size"),
])
def test_the_rows_verdict_is_validated(tmp_path: Path, rows: object, entry: int,
                                       match: str) -> None:
    with pytest.raises(ManifestError, match=match):
        parse_manifest(_manifest_with_rows(tmp_path, rows, entry))


def test_the_rows_verdict_round_trips(tmp_path: Path) -> None:
    manifest = parse_manifest(_manifest_with_rows(
        tmp_path, {"independent": False, "detail": "why"}))
    assert manifest.shapes[1].rows == RowProof(False, "why")
    assert not manifest.shapes[1].batches_rows


@pytest.mark.parametrize(("kind", "shapes", "why"), [
    ("shifted", "8x8", "depends on the rows batched with it|no row's own"),
    ("one_reads_another", "32x8", "depends on the rows batched with it"),
    ("fixed_table", "1x8,8x8", "no row's own"),
    ("extra_output", "1x8,8x8", "no row's own"),
    # second audit: a capacity twice the fair share, overflowed only by rows ahead alike
    ("balanced_moe", "1x8,64x8", "copies of row 63, ahead of the rows kept"),
    # second audit: a scale floor the draws never reach
    ("floored_scale", "1x8,8x8", "times as large"),
])
def test_rows_that_read_other_rows_or_outputs_of_no_row_are_dependent(
        tmp_path: Path, kind: str, shapes: str, why: str) -> None:
    """A row that reads another row (of its own parity, or one the alone sample skips), and
    an output that does not come out with one row per row, are found whichever trial shows
    them (the alone runs' structure is evidence, not a reason to skip)."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(ROWS, shapes, config={"kind": kind}, output=tmp_path / kind,
                       progress=False)
    batched = [p for p, e in zip(_rows(result.path), result.manifest.shapes)
               if e.inputs[0][1][0] > 1]
    assert batched and all(p is not None and not p.independent for p in batched), batched
    assert re.search(why, batched[0].detail), batched[0].detail


def test_rows_whose_rounding_follows_the_neighbours_are_not_proved_independent(
        tmp_path: Path) -> None:
    """A row's values are held to their own magnitude where the neighbours changed (the
    fifth pass's leak into small rows of a wide channel hid in the channel's scale): a model
    whose arithmetic for a row follows its neighbours (experts run on the rows routed to
    them) rounds its small values differently, and is served request by request."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(ROWS, "1x8,64x8", config={"kind": "gathered_moe"},
                       output=tmp_path / "a", progress=False)
    proof = _rows(result.path)[1]
    assert proof is not None and not proof.independent
    assert "replaced by other inputs" in proof.detail, proof.detail


def test_a_repeated_example_input_does_not_make_the_proof_vacuous(tmp_path: Path) -> None:
    """The hook repeats one sample: other inputs are drawn at random instead, and the
    batch-max quantisation shows."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(MODELS / "repeated_example.py", "1x4,8x4", output=tmp_path / "a",
                       progress=False)
    assert not result.manifest.shapes[1].batches_rows


def test_a_ragged_batch_is_proved_as_serve_stacks_it(tmp_path: Path) -> None:
    """Short rows padded beside full-length ones: the longest row's length divides every
    row. Both proofs passed it when each only ran rows of one length."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(ROWS, "1x4x4,4x8x4", config={"kind": "longest_row"},
                       output=tmp_path / "a", pad={"x": 0.0}, progress=False)
    proof = result.manifest.shapes[1].rows
    assert proof is not None and not proof.independent
    assert "cut to half their length" in proof.detail


@pytest.mark.parametrize(("kind", "range_"), [
    ("running_max", None), ("observer", None), ("attribute_max", None),
    ("state_at_one_row", None),  # second audit: state moved by single-row calls only
    ("calibrated_clip", (-1.0, 1.0)),  # second audit: only plausible values move it
])
def test_a_model_whose_answers_follow_earlier_calls_is_refused(tmp_path: Path, kind: str,
                                                               range_: Any) -> None:
    with pytest.raises(StatefulModelError, match="answers depend on earlier calls") as info:
        build(ROWS, "1x8,8x8", config={"kind": kind}, output=tmp_path / kind, progress=False,
              input_range=range_)
    assert info.value.changed
    assert not (tmp_path / kind).exists()


@pytest.mark.parametrize(("kind", "shapes"), [("cast_everything", "1x64,8x64"),
                                              ("half_logits", "1x64,8x64")])
def test_a_float64_copy_that_stays_narrow_records_no_noise(tmp_path: Path, kind: str,
                                                            shapes: str) -> None:
    """Seventh pass M1: a model casting every operand to float32 (or returning bfloat16)
    computes so in its float64 copy too; both runs agreed exactly and the noise was recorded
    as 0, the proofs' and the load's tightest bound. Nothing was measured: None."""
    result = build(MODELS / "narrow_models.py", shapes, config={"kind": kind},
                   output=tmp_path / "a", progress=False)
    assert [entry.noise for entry in read_artifact(result.path).manifest.shapes] == [None, None]


def test_a_long_float32_dot_product_is_not_recorded_dependent(tmp_path: Path) -> None:
    """Seventh pass M1: with its noise recorded as 0, a row alone (other kernels over 65,536
    products) moved by 2e-6 of the scale, beyond the 1e-6 floor: a false "dependent"."""
    result = build(MODELS / "narrow_models.py", "1x65536,8x65536",
                   config={"kind": "cast_everything", "features": 65536},
                   output=tmp_path / "a", progress=False)
    assert _rows(result.path) == [None, RowProof(True)]


def test_a_squeezed_head_says_how_to_keep_its_batch_dimension(tmp_path: Path) -> None:
    """Seventh pass L2: `.squeeze()` on a (B, 1) head gives a scalar at a batch of one; the
    verdict (dependent: serve cannot slice it) now names the fix."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(ROWS, "1x8,8x8", config={"kind": "squeezed"}, output=tmp_path / "a",
                       progress=False)
    proof = _rows(result.path)[1]
    assert proof is not None and not proof.independent
    assert "`.squeeze(-1)` keeps the batch dimension" in proof.detail, proof.detail


def test_rows_alone_within_a_chaotic_models_own_rounding_are_left_to_float64(
        tmp_path: Path) -> None:
    """Ninth pass L1: a deep tanh MLP's float32 rounding (noise ~4e-4) exceeds the proof's
    1e-4 bound, so its rows alone in float32 moved past it and the model was recorded
    dependent, the verdict blaming the other rows. Where its float64 runs of rows alone
    agree, they decide, and the verdict says what the float32 runs showed."""
    result = build(ROWS, "1x8,32x8", config={"kind": "chaotic"}, output=tmp_path / "a",
                   progress=False)
    entry = result.manifest.shapes[1]
    proof = _rows(result.path)[1]
    assert entry.noise is not None and entry.noise > 1e-4, entry.noise
    assert proof is not None and proof.independent, proof
    assert "within the model's own rounding" in proof.detail, proof.detail


def test_rows_alone_within_rounding_but_float32_only_are_not_blamed_on_other_rows(
        tmp_path: Path) -> None:
    """Ninth pass L1, where no float64 run compares rows alone: still not proved (serve
    answers request by request), and the verdict names the model's rounding, not the rows
    batched with it."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        result = build(ROWS, "1x8,32x8", config={"kind": "chaotic_narrowed"},
                       output=tmp_path / "a", progress=False)
    proof = _rows(result.path)[1]
    assert proof is not None and not proof.independent, proof
    assert "within the model's own float32 rounding" in proof.detail, proof.detail
    assert "depends on the rows batched" not in proof.detail, proof.detail
