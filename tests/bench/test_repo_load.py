"""``bench-serve REPO``: what a model repository's measurement refuses before any server
starts, and how its rounds become figures."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from qkan_pack.bench import ServeLoadReport, ServeLoadSettings, is_repository
from qkan_pack.bench._load import LoadResult
from qkan_pack.bench._repo_load import (
    _common_rows,
    check_repository_settings,
    render_repository_load,
    repository_ratios,
)
from qkan_pack.bench._serve_results import SERVE_SCHEMA, median_point, round_ratio_range, summarise
from qkan_pack.errors import BenchError

from ..conftest import MODELS


def _point(requests: int, clients: int = 8, p99: float = 1.0) -> object:
    return summarise(clients, LoadResult([p99] * requests, Counter({200: requests})), 1.0)


def test_a_directory_without_a_manifest_is_a_repository(tmp_path: Path) -> None:
    (tmp_path / "repo" / "m" / "1").mkdir(parents=True)
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "manifest.json").write_text("{}")
    assert is_repository(tmp_path / "repo") and not is_repository(tmp_path / "art")
    assert not is_repository(tmp_path / "missing")


@pytest.mark.parametrize("changes, named", [
    ({"protocols": ("json", "oip-binary")}, "--protocol other than json"),
    ({"kill_at_s": 1.0}, "--kill-at"),
    ({"large_body_mb": 1.0}, "--large-body-mb")])
def test_one_artifacts_measurements_are_refused_for_a_repository(changes: dict,
                                                                 named: str) -> None:
    with pytest.raises(BenchError, match=f"{named}.*give bench-serve REPO/<name>/<version>"):
        check_repository_settings(ServeLoadSettings(**changes))
    check_repository_settings(ServeLoadSettings())  # the JSON route alone is fine


def test_rounds_must_be_positive() -> None:
    with pytest.raises(BenchError, match="rounds must be at least 1, got 0"):
        ServeLoadSettings(rounds=0)


def test_models_with_other_inputs_are_refused_by_name(tmp_path: Path) -> None:
    """The load generator sends one kind of row to every route: a model of other inputs
    would answer 422 to every request, and the aggregate would measure refusals."""
    from qkan_pack import build

    root = tmp_path / "repo"
    narrow = build(MODELS / "plain_mlp.py", "1x2,8x2", output=tmp_path / "narrow",
                   progress=False).path
    wide = build(MODELS / "plain_mlp.py", "1x3,8x3", output=tmp_path / "wide",
                 config={"width": 3}, progress=False).path
    for name, artifact in (("a", narrow), ("b", narrow), ("c", wide)):
        shutil.copytree(artifact, root / name / "1")
    models = [{"name": n, "default_version": "1"} for n in ("a", "b", "c")]
    with pytest.raises(BenchError, match=r"models \['c'\] take other inputs than a"):
        _common_rows(str(root), models, ServeLoadSettings())
    assert _common_rows(str(root), models[:2], ServeLoadSettings())[0].shape == (2,)


def test_each_figure_is_the_median_of_its_rounds_and_every_error_shows() -> None:
    rounds = [_point(100, p99=2.0), _point(300, p99=1.0), _point(200, p99=9.0)]
    rounds[2].statuses["503"] = 4
    for point, replica_us in zip(rounds, (500.0, 700.0, 600.0)):
        point.cpu_us_per_request["replicas"] = replica_us
    point = median_point(rounds)
    assert (point.requests_per_s, point.p99_ms, point.ok) == (200.0, 2.0, 600)
    assert point.statuses == {"200": 600, "503": 4}
    assert point.cpu_us_per_request == {"replicas": 600.0}


def test_the_aggregate_and_one_model_are_ratios_to_the_model_alone() -> None:
    curves = {"alone": [_point(100, 8), _point(200, 32)],
              "all": [_point(95, 8), _point(150, 32)], "one": [_point(100, 8), _point(210, 32)]}
    ratios, ranges = repository_ratios(curves)
    assert ratios == {"all": {"8": 0.95, "32": 0.75}, "one": {"8": 1.0, "32": 1.05}}
    assert ranges == {}  # one round each: no spread to tell
    report = ServeLoadReport(
        schema=SERVE_SCHEMA, created="2000-01-01T00:00:00+00:00", artifact="repo", command=[],
        settings={"seconds": 1.0, "processes": 1, "rounds": 3},
        machine={"cpu": "cpu", "gpu": None}, curves=curves, ratios=ratios,
        server={"alone": {"ready": "serving m1"}, "repository": {"ready": "serving repo"}},
        repository={"models": ["m1", "m2"], "alone": "m1/1"})
    text = render_repository_load(report)
    assert "the model repository repo (2 models)" in text and "median of 3 round(s)" in text
    assert "alone: m1/1 served alone, POST /: serving m1" in text
    assert "POST /models/<name>: serving repo" in text and "one: m1 through" in text
    assert "all  0.95x at 8, 0.75x at 32" in text and "one  1.00x at 8, 1.05x at 32" in text
    assert "lowest-highest" not in text


def test_a_ratio_over_rounds_reports_the_range_of_its_rounds() -> None:
    """The median ratio and, beside it, the lowest and highest ratio of a single round (each
    round measures both curves back to back, so round i of one is set against round i of
    the other): how far one round may sit from the median is what a reader needs to judge
    a ratio near its target."""
    def rounds(*rates: float, clients: int = 8) -> object:
        return median_point([_point(rate, clients) for rate in rates])

    alone = rounds(100, 200, 100)
    curves = {"alone": [alone], "all": [rounds(95, 150, 110)], "one": [rounds(100, 210, 90)]}
    assert alone.round_requests_per_s == [100.0, 200.0, 100.0]
    ratios, ranges = repository_ratios(curves)
    # medians 110/100 and 100/100; per round 0.95, 0.75, 1.10 and 1.00, 1.05, 0.90
    assert ratios == {"all": {"8": 1.1}, "one": {"8": 1.0}}
    assert ranges == {"all": {"8": [0.75, 1.1]}, "one": {"8": [0.9, 1.05]}}
    report = ServeLoadReport(
        schema=SERVE_SCHEMA, created="2000-01-01T00:00:00+00:00", artifact="repo", command=[],
        settings={"seconds": 1.0, "processes": 1, "rounds": 3},
        machine={"cpu": "cpu", "gpu": None}, curves=curves, ratios=ratios, ratio_ranges=ranges,
        server={"alone": {"ready": "serving m1"}, "repository": {"ready": "serving repo"}},
        repository={"models": ["m1", "m2"], "alone": "m1/1"})
    text = render_repository_load(report)
    assert "alone at the same clients [lowest-highest round]:" in text
    assert "all  1.10x at 8 [0.75-1.10]" in text and "one  1.00x at 8 [0.90-1.05]" in text
    # rounds that do not pair up (a curve measured fewer times) give no range
    assert round_ratio_range(rounds(1, 2, 3), rounds(1, 2)) is None
    assert median_point([_point(5)]).round_requests_per_s == []


def test_protocol_rounds_rotate_the_order_and_take_each_point_s_median(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A single artifact's ``--rounds``: each round runs the protocols back to back at every
    client count, starting one further along each time (so that none always runs after the
    same one), and each point is the median of its rounds."""
    from qkan_pack.bench import _serve_load

    order: list[tuple[int, str]] = []
    rates = iter(range(1, 100))

    def measure(server: object, rows: object, clients: int, settings: object,
                has_stats: bool, protocol: str) -> object:
        order.append((clients, protocol))
        point = _point(next(rates), clients)
        point.protocol = protocol
        return point

    monkeypatch.setattr(_serve_load, "measure_point", measure)
    settings = ServeLoadSettings(clients=(8, 32), rounds=3,
                                 protocols=("json", "oip-binary", "oip-grpc"))
    points = _serve_load._measure_rounds(None, [], settings.protocols, settings, True)
    assert order[:6] == [(8, "json"), (8, "oip-binary"), (8, "oip-grpc"),
                         (32, "json"), (32, "oip-binary"), (32, "oip-grpc")]
    assert order[6:9] == [(8, "oip-binary"), (8, "oip-grpc"), (8, "json")]
    assert order[12:15] == [(8, "oip-grpc"), (8, "json"), (8, "oip-binary")]
    assert [(p.clients, p.protocol) for p in points] == order[:6]
    # json at 8 clients ran 1st, 9th and 14th: rates 1, 9, 14
    assert points[0].requests_per_s == 9.0
