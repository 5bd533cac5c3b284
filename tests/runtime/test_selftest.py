"""The one comparison: scale-aware tolerance, no blind spot for tiny outputs."""

from __future__ import annotations

import pytest
import torch

from qkan_pack.runtime import compare

TOL = (2e-3, 2e-4)


def test_identical_outputs_agree() -> None:
    x = torch.randn(4, 5)
    agreement = compare([x], [x.clone()], TOL)
    assert agreement.ok and agreement.max_abs == 0 and agreement.max_rel == 0


def test_a_one_percent_edit_is_refused_at_any_output_scale() -> None:
    """An absolute atol of 2e-4 would accept anything for outputs of 1e-12 (an untrained
    efficientnet's); atol counts in units of the output's largest magnitude instead."""
    for scale in (1e-12, 1.0, 1e3):
        want = torch.randn(8, 16, dtype=torch.float64) * scale
        assert compare([want * (1 + 1e-7)], [want], TOL).ok, scale
        bad = compare([want * 1.01], [want], TOL)
        assert not bad.ok and abs(bad.max_rel - 0.01) < 1e-3, scale


def test_nan_shape_dtype_and_integer_differences_fail() -> None:
    x = torch.randn(3)
    assert not compare([torch.full((3,), float("nan"))], [x], TOL).ok
    assert not compare([x[:2]], [x], TOL).ok
    assert not compare([x.double()], [x], TOL).ok
    ids = torch.arange(3)
    assert compare([ids], [ids.clone()], TOL).ok
    assert not compare([ids + 1], [ids], TOL).ok


def test_all_zero_outputs_must_match_exactly() -> None:
    zero = torch.zeros(4)
    assert compare([zero], [zero.clone()], TOL).ok
    assert not compare([zero + 1e-9], [zero], TOL).ok


def test_a_different_number_of_outputs_is_a_refusal_not_a_crash() -> None:
    """Audit: a config override that adds an output made the self-test's strict zip raise a
    bare ValueError out of ``Predictor.load``; now it is a failed comparison (SelfTestError)."""
    from qkan_pack import SelfTestError
    from qkan_pack.runtime import check_outputs

    one = [torch.ones(2)]
    for got, want in ((one, one * 2), (one * 2, one), ([], one)):
        assert not compare(got, want, (1e-3, 1e-3)).ok
        with pytest.raises(SelfTestError) as refused:
            check_outputs("1x2", "outputs and references", got, want, (1e-3, 1e-3), "hint")
        assert refused.value.max_abs == float("inf")
