"""A call whose shapes no entry takes is refused with the fix (``format.shape_fix``): split a
batch larger than the largest declared one, declare the shape at build, or ``--pad`` where
padding could hold the call. The fields are data; the message is built from them."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from qkan_pack import InputError, Predictor, build
from qkan_pack.format import with_batch_sizes

from ..conftest import MODELS


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(MODELS / "plain_mlp.py", "2x2,8x2", output=tmp_path_factory.mktemp("m") / "a",
                 progress=False).path


def refusal(path: Path, *args: object, **kwargs: object) -> InputError:
    with Predictor.load(path, progress=False) as predictor, pytest.raises(InputError) as caught:
        predictor(*args, **kwargs)
    return caught.value


def test_a_batch_larger_than_the_largest_declared_says_to_split_it(mlp: Path) -> None:
    error = refusal(mlp, np.zeros((64, 2), np.float32))
    assert str(error).endswith("; to run it, split the batch: the largest declared is 8")
    assert error.largest_batch == 8 and error.given == {"input": (64, 2)}
    assert error.accepted and error.pad_inputs == ()  # the accepted signatures are still data


def test_a_shape_padding_could_hold_names_the_shapes_to_declare_and_pad(mlp: Path) -> None:
    error = refusal(mlp, np.zeros((3, 2), np.float32))
    assert ("; to run it, declare its shape at build: --shapes 2x2,8x2,3x2; or let smaller "
            "calls be padded: build with --pad x=0" in str(error))
    assert error.largest_batch is None and error.pad_inputs == ("input",)
    copy = pickle.loads(pickle.dumps(error))  # Ray pickles errors: the fields travel
    assert str(copy) == str(error) and copy.given == error.given


def test_a_shape_nothing_declared_holds_names_only_the_shapes_to_declare(mlp: Path) -> None:
    error = refusal(mlp, np.zeros((2, 5), np.float32))
    assert str(error).endswith("; to run it, declare its shape at build: --shapes 2x2,8x2,2x5")
    assert error.pad_inputs == () and error.largest_batch is None


def test_a_row_without_its_batch_dimension_is_told_to_add_it(mlp: Path) -> None:
    """Fifth pass L2: one row sent without its batch dimension was told to declare a rank-1
    shape (``--shapes 2x2,8x2,2``) only."""
    error = refusal(mlp, np.zeros(2, np.float32))
    assert ("; to run it, add the batch dimension (one row is a batch of one: 1x2, [[...]] in "
            "JSON, x[None] in Python); or declare its shape at build: --shapes 2x2,8x2,2"
            in str(error)), str(error)


def test_named_inputs_are_declared_with_input_options(tmp_path: Path) -> None:
    path = build(MODELS / "multi_io.py", [{"a": (1, 3), "b": (1, 2)}, {"a": (4, 3), "b": (4, 2)}],
                 dtype={"a": "float32", "b": "int64"}, output=tmp_path / "m", progress=False).path
    error = refusal(path, a=np.zeros((2, 3), np.float32), b=np.zeros((2, 2), np.int64))
    assert ("declare its shape at build: --input a:1x3,4x3,2x3 --input b:1x2,4x2,2x2; or let "
            "smaller calls be padded: build with --pad a=0 --pad b=0" in str(error))
    error = refusal(path, a=np.zeros((9, 3), np.float32), b=np.zeros((9, 2), np.int64))
    assert error.largest_batch == 4 and str(error).endswith("the largest declared is 4")


def test_a_padded_artifact_says_to_split_or_declare_never_to_pad(tmp_path: Path) -> None:
    tokens = with_batch_sizes([{"input_ids": (8,), "attention_mask": (8,)},
                               {"input_ids": (16,), "attention_mask": (16,)}], [1, 4])
    path = build(MODELS / "pad_models.py", tokens, dtype="int64",
                 config={"kind": "masked_meanpool"}, output=tmp_path / "p",
                 pad={"input_ids": 0, "attention_mask": 0}, progress=False).path

    def call(batch: int, length: int) -> InputError:
        ids = torch.ones(batch, length, dtype=torch.int64)
        return refusal(path, input_ids=ids, attention_mask=ids)

    assert call(6, 10).largest_batch == 4  # any length up to 16 pads: only the batch is over
    assert str(call(6, 10)).endswith("split the batch: the largest declared is 4")
    longer = call(2, 20)
    assert longer.largest_batch is None and longer.pad_inputs == ()
    assert "--input input_ids:1x8,4x8,1x16,4x16,2x20" in str(longer)


def test_a_shape_no_build_could_declare_gets_no_fix(mlp: Path) -> None:
    """A zero-size batch or a 0-d input cannot be declared: no fix that would fail again."""
    for shape in ((0, 2), ()):
        error = refusal(mlp, np.zeros(shape, np.float32))
        assert error.given is None and "to run it" not in str(error) and error.accepted


def test_a_batch_dimension_left_off_one_input_gets_no_shape_to_declare(tmp_path: Path) -> None:
    """`a` as 1x3 with `b` as [2] (one input sent as a row, the other without its batch
    dimension) suggested declaring `--input a:1x3,4x3,1x3 --input b:1x2,4x2,2`: a mistake in
    the call, not a shape to build. The accepted shapes still say what to send."""
    path = build(MODELS / "multi_io.py", [{"a": (1, 3), "b": (1, 2)}, {"a": (4, 3), "b": (4, 2)}],
                 dtype={"a": "float32", "b": "int64"}, output=tmp_path / "m", progress=False).path
    error = refusal(path, a=np.zeros((1, 3), np.float32), b=np.zeros((2,), np.int64))
    assert error.given is None and "to run it" not in str(error) and "declare" not in str(error)
    assert "a: 1x3 float32, b: 1x2 int64" in str(error)
    both = refusal(path, a=np.zeros((3,), np.float32), b=np.zeros((2,), np.int64))
    assert both.given == {"a": (3,), "b": (2,)}  # every input one rank down: declarable
