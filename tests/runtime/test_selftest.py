"""The one comparison: scale-aware tolerance, no blind spot for tiny outputs."""

from __future__ import annotations

import pytest
import torch

from qkan_pack.runtime import ChannelPool, compare
from qkan_pack.runtime._selftest import POOL_QUANTILE

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
    from qkan_pack.runtime._selftest import check_outputs

    one = [torch.ones(2)]
    for got, want in ((one, one * 2), (one * 2, one), ([], one)):
        assert not compare(got, want, (1e-3, 1e-3)).ok
        with pytest.raises(SelfTestError) as refused:
            check_outputs("1x2", "outputs and references", got, want, (1e-3, 1e-3), "hint")
        assert refused.value.max_abs == float("inf")


def test_a_non_float_leaf_does_not_mix_an_absolute_figure_into_max_rel() -> None:
    """An argmax label after logits of scale 1e3 turned max_rel into the logits' absolute
    difference (1e-4 instead of 1e-7): the float32 noise build records, and the figure a
    refusal reports, were off by the output's scale (found by an audit)."""
    want = torch.tensor([1000.0, -500.0], dtype=torch.float64)
    got = want * (1 + 1e-7)
    label = torch.tensor([1])
    alone = compare([got], [want], (0.0, 0.0))
    assert compare([got, label], [want, label.clone()], (0.0, 0.0)).max_rel == alone.max_rel
    small = want * 1e-6
    assert compare([small * (1 + 1e-5), label], [small, label.clone()], (0.0, 0.0)).max_rel == (
        pytest.approx(1e-5, rel=1e-6))
    changed = compare([got, label + 1], [want, label], TOL)
    assert not changed.ok and changed.max_abs == changed.max_rel == float("inf")


def test_a_nan_is_infinitely_far_in_both_figures() -> None:
    """max() dropped a NaN difference: outputs that were all NaN reported 0 difference."""
    x = torch.randn(4, dtype=torch.float64)
    for got, want in ((torch.full_like(x, float("nan")), x), (x, torch.full_like(x, float("nan")))):
        agreement = compare([got], [want], TOL)
        assert not agreement.ok and agreement.max_abs == agreement.max_rel == float("inf")


def test_per_channel_comparison_sees_a_small_wrong_column() -> None:
    want = torch.randn(16, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want[:, 0] *= 1e6
    got = want.clone()
    got[:, 1:] = 0  # the four small columns lost
    assert compare([got], [want], (0.0, 1e-4)).ok  # a millionth of the whole output's scale
    agreement = compare([got], [want], (0.0, 1e-4), channel_spread=1e3)
    assert not agreement.ok and agreement.max_rel == pytest.approx(1.0)


def test_a_pool_of_references_gives_one_row_its_channels_scales() -> None:
    """Adversarial pass F2: one row shows no channel's scale; the references' pool does."""
    rows = torch.randn(8, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    rows[:, 0] *= 1e6
    pool = ChannelPool()
    pool.add([torch.zeros(4), rows])  # output 1; output 0 has no channels
    want = rows[:1].clone()
    got = want.clone()
    got[:, 1:] = 0
    assert compare([got], [want], (0.0, 1e-4), channel_spread=1e3).ok
    assert compare([got], [want], (0.0, 1e-4), channel_spread=1e3, pool=pool).ok  # output 0's
    found = compare([got], [want], (0.0, 1e-4), channel_spread=1e3, pool=pool, first_output=1)
    assert not found.ok and found.max_rel == pytest.approx(1.0)
    noisy = want * (1 + 1e-7)
    assert compare([noisy], [want], (0.0, 1e-6), channel_spread=1e3, pool=pool,
                   first_output=1).ok


def test_per_channel_comparison_leaves_similar_channels_and_single_rows_alone() -> None:
    """Channels within 1e3 of each other share one scale; a batch of one has no channel
    scale (a logit near zero in one row is no small channel)."""
    want = torch.tensor([[2.0, 1e-5, -3.0]], dtype=torch.float64)
    got = want + torch.tensor([[0.0, 1e-5, 0.0]], dtype=torch.float64)
    assert compare([got], [want], (0.0, 1e-4), channel_spread=1e3).ok
    rows = torch.randn(16, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    noisy = rows * (1 + 1e-7)
    assert compare([noisy], [rows], (0.0, 1e-6), channel_spread=1e3).ok


def test_a_pool_is_quantiled_only_where_the_output_is_short_and_past_two_to_the_24_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifth pass M3: ``torch.quantile`` refuses more than 2**24 rows, and every gated
    comparison took the pool's quantile, used or not: an output of 2**24 + 8 rows (a
    flattened 4096x4096 image's pixels and more) failed its bf16 build."""
    from qkan_pack.runtime import _selftest

    rows = torch.randn(2**24 + 8, 1, dtype=torch.float64).abs()
    assert _selftest._lower_quantile(rows).shape == (1,)
    small = torch.rand(37, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.equal(_selftest._lower_quantile(small),
                       torch.quantile(small, POOL_QUANTILE, dim=0, interpolation="lower"))
    pool = ChannelPool()
    pool.add([small])
    monkeypatch.setattr(_selftest, "_lower_quantile", lambda rows: pytest.fail("pooled"))
    assert compare([small], [small], (0.0, 1e-6), channel_spread=1e3, pool=pool).ok


def test_only_channels_beyond_the_spread_are_held_to_their_own_scale() -> None:
    """Fifth pass M1: one all-zero column put every column on its own scale, and a reduced
    precision's ordinary error on a column 4x below the largest was refused; a column more
    than the spread below the largest is still held to itself."""
    want = torch.tensor([[0.4, 0.1, 2e-4, 0.0]] * 4, dtype=torch.float64)
    got = want + torch.tensor([0.0, 2e-3, 0.0, 0.0], dtype=torch.float64)  # 0.5% of 0.4
    assert compare([got], [want], (0.0, 1e-2), channel_spread=100).ok
    lost = want.clone()
    lost[:, 2] = 0  # the small column wholly wrong
    found = compare([lost], [want], (0.0, 1e-2), channel_spread=100)
    assert not found.ok and found.max_rel == pytest.approx(1.0)
