"""``GET /metrics`` (issue 43): Prometheus's own parser reads counts that match the requests
sent, over every protocol and from every replica; gRPC rows share replays as HTTP rows do.
The counters, the merge, HAProxy's counts and the gatherer's paced rows are checked without
a server first."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ._server import Server, grpc_server

pytest.importorskip("prometheus_client", reason="the serve extra is not installed")

TOKEN = "metrics-token-0123456789abcdef"
NAME = "mlp"


def _families(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape, by (sample name, sorted labels), read by Prometheus's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _total(samples: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels`` (all replicas)."""
    return sum(value for (sample, keys), value in samples.items() if sample == name
               and labels.items() <= dict(keys).items())


# -- the gatherer's paced rows, no server ------------------------------------------------


def test_paced_gaps_set_the_wait_and_a_lone_client_stops_waiting() -> None:
    from qkan_pack.serve._gather import LINGER_GAPS, MISSES_TO_REST, PROBE_EVERY_S, ArrivalPacing

    pacing = ArrivalPacing(bound_s=0.01)
    assert pacing.arrived(0.0) == 0.0  # nothing known yet: no wait
    assert pacing.arrived(0.001) == pytest.approx(LINGER_GAPS * 0.001)
    pacing.ran(0.5)
    assert pacing.arrived(0.5005) == pytest.approx(LINGER_GAPS * 0.001)  # from the run's end
    assert pacing.arrived(2.0) == pytest.approx(LINGER_GAPS * 0.001)  # an idle gap is no pace
    for _ in range(MISSES_TO_REST):
        pacing.closed(1)  # held groups that no row joined: one client
    now = 3.0
    assert pacing.arrived(now) > 0  # a probe
    assert pacing.arrived(now + PROBE_EVERY_S / 2) == 0.0  # resting until the next probe
    assert pacing.arrived(now + PROBE_EVERY_S * 1.5) > 0
    pacing.closed(2)  # the probe found company
    assert pacing.arrived(now + PROBE_EVERY_S * 1.6) > 0


def test_paced_rows_that_trickle_in_share_a_group_where_unpaced_ones_run_alone() -> None:
    """Regression (issue 43): gRPC requests reach the replica's loop one at a time with
    quiet passes between them, and each replayed alone (1.02 rows per replay at 32 gRPC
    clients against 23 for the JSON route). Rows that come 3 ms apart: unpaced, each runs
    alone as before; paced, they share groups."""
    from qkan_pack.serve._gather import RowGatherer

    groups: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        groups.append(list(items))
        return items

    async def trickle(paced: bool) -> list[list[int]]:
        groups.clear()
        gatherer = RowGatherer(run, max_rows=64, wait_s=0.5, until_quiet=True)
        tasks = []
        for i in range(12):
            tasks.append(asyncio.create_task(gatherer.submit(i, paced=paced)))
            await asyncio.sleep(0.003)
        assert await asyncio.gather(*tasks) == list(range(12))
        return list(groups)

    unpaced = asyncio.run(trickle(False))
    paced = asyncio.run(trickle(True))
    assert len(unpaced) == 12
    assert len(paced) <= 4 and max(map(len, paced)) >= 6, paced


def test_a_lone_paced_client_waits_only_until_holding_rests(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from qkan_pack.serve import _gather
    from qkan_pack.serve._gather import MISSES_TO_REST, RowGatherer

    monkeypatch.setattr(_gather, "PROBE_EVERY_S", 60.0)  # one probe in this test, at most

    async def one_client() -> list[float]:
        gatherer = RowGatherer(lambda items: items, max_rows=8, wait_s=0.5, until_quiet=True)
        loop, took = asyncio.get_running_loop(), []
        for i in range(MISSES_TO_REST + 8):
            started = loop.time()
            await gatherer.submit(i, paced=True)
            took.append(loop.time() - started)
            await asyncio.sleep(0.005)
        return took

    took = asyncio.run(one_client())
    assert sum(t > 0.009 for t in took[2:MISSES_TO_REST]) >= MISSES_TO_REST // 2  # held: ~15 ms
    assert all(t < 0.009 for t in took[-6:]), took  # rested: no wait after its one probe


# -- the counters and the scrape, no server --------------------------------------------------


def test_stats_reset_restarts_the_view_but_never_the_exported_totals() -> None:
    from qkan_pack.serve._stats import Entry, ReplicaStats

    stats = ReplicaStats(["8x2"], {"8x2": Entry(8, 16)})
    stats.replay("8x2", 5, 0.001)
    stats.request("rows")
    assert stats.view(reset=True)["rows_per_replay"] == {"5": 1}
    stats.replay("8x2", 3, 0.001)
    assert stats.view()["rows_per_replay"] == {"3": 1}
    total = stats.snapshot()
    assert total.rows_per_replay == {5: 1, 3: 1} and total.requests["rows"] == 1
    assert total.rows == {("8x2", "request"): 8, ("8x2", "filler"): 8}
    assert total.elements == {("8x2", "request"): 16, ("8x2", "padding"): 16}


def test_the_merge_keeps_every_replica_and_one_of_each_shared_series() -> None:
    from qkan_pack.serve._metrics import Ingress, ReplicaInfo, exposition, merge, replica_families
    from qkan_pack.serve._stats import ReplicaStats

    parts = []
    for replica, (successes, unauthorized) in {"a": (3, 1), "b": (2, 4)}.items():
        stats = ReplicaStats([])
        for _ in range(successes):
            stats.answered("json", "success", 0.002)
        info = ReplicaInfo(NAME, "1", replica, "cpu", 0.5, 1.0, (("8x2", "replay", 0.0),), 8)
        parts.append(replica_families(stats.snapshot(), info, None, Ingress(unauthorized)))
    text, content_type = exposition(merge(parts))
    samples = _families(text.decode())
    assert content_type.startswith("text/plain")
    assert _total(samples, "qkan_pack_requests_total", replica="a") == 3
    assert _total(samples, "qkan_pack_requests_total", outcome="success") == 5
    assert _total(samples, "qkan_pack_request_duration_seconds_count", model=NAME) == 5
    # HAProxy's counts, read by both replicas at different moments: the latest read
    assert _total(samples, "qkan_pack_ingress_refusals_total", reason="unauthorized") == 4


def test_pending_requests_are_the_admission_s_slots_in_use_and_its_queue() -> None:
    """``qkan_pack_pending_requests``: requests holding one of the replica's slots (at_work)
    and those queued for one (waiting), as the admission holds them at the scrape; a
    cancelled waiter leaves the queue."""
    from qkan_pack.errors import OverloadedError
    from qkan_pack.serve._http import Admission
    from qkan_pack.serve._metrics import ReplicaInfo, exposition, merge, replica_families
    from qkan_pack.serve._stats import ReplicaStats

    async def scenario() -> list[tuple[int, int]]:
        admission = Admission(2, 2)
        seen = [admission.pending()]
        await admission.acquire()
        await admission.acquire()
        waiters = [asyncio.ensure_future(admission.acquire()) for _ in range(2)]
        await asyncio.sleep(0)
        seen.append(admission.pending())
        with pytest.raises(OverloadedError):
            await admission.acquire()
        admission.release()  # hands its slot to the first waiter
        await asyncio.sleep(0)
        seen.append(admission.pending())
        waiters[1].cancel()
        await asyncio.sleep(0)
        seen.append(admission.pending())
        for _ in range(2):
            admission.release()
        seen.append(admission.pending())
        return seen

    assert asyncio.run(scenario()) == [(0, 0), (2, 2), (2, 1), (2, 0), (0, 0)]
    info = ReplicaInfo(NAME, "1", "a", "cpu", 0.5, 1.0, (), 8)
    text, _ = exposition(merge([replica_families(ReplicaStats([]).snapshot(), info,
                                                 pending=(2, 1))]))
    samples = _families(text.decode())
    assert _total(samples, "qkan_pack_pending_requests", replica="a", state="at_work") == 2
    assert _total(samples, "qkan_pack_pending_requests", model=NAME, state="waiting") == 1


def test_triton_statistics_are_read_from_the_counters_and_summed_over_replicas() -> None:
    """Triton's statistics extension (what perf_analyzer reads): successes and their time,
    failures (not a missing token), queue waits, replays per captured batch size; two
    replicas' entries summed, the latest inference kept."""
    from qkan_pack.serve._statistics import merged_statistics, replica_statistics
    from qkan_pack.serve._stats import Entry, ReplicaStats

    entries = {"1x2": Entry(1, 2), "8x2": Entry(8, 16)}
    parts = []
    for _ in range(2):  # two replicas
        stats = ReplicaStats(list(entries), entries)
        for _request in range(3):
            stats.answered("json", "success", 0.002)
        stats.answered("oip-grpc", "success", 0.004)
        stats.answered("json", "client_error", 0.0)
        stats.answered("json", "unauthorized", 0.0)
        stats.waited([0.001, 0.003, 0.0, 0.0])
        stats.replay("8x2", 3, 0.0005)
        stats.replay("1x2", 1, 0.0002)
        parts.append(replica_statistics(stats.snapshot(), entries, NAME, "1"))
    one = parts[0]
    assert (one["name"], one["version"]) == (NAME, "1")
    assert one["inference_count"] == 4 and one["execution_count"] == 2
    assert one["last_inference"] >= int(time.time() * 1000) - 60_000
    inference = one["inference_stats"]
    assert inference["success"] == {"count": 4, "ns": 10_000_000}
    assert inference["fail"] == {"count": 1, "ns": 0}
    assert inference["queue"] == {"count": 4, "ns": 4_000_000}
    assert inference["compute_infer"] == {"count": 2, "ns": 700_000}
    assert inference["compute_input"] == inference["cache_hit"] == {"count": 0, "ns": 0}
    assert [(b["batch_size"], b["compute_infer"]) for b in one["batch_stats"]] == [
        (1, {"count": 1, "ns": 200_000}), (8, {"count": 1, "ns": 500_000})]
    both = merged_statistics(parts)
    assert both["inference_count"] == 8 and both["execution_count"] == 4
    assert both["inference_stats"]["success"] == {"count": 8, "ns": 20_000_000}
    assert both["batch_stats"][1] == {"batch_size": 8, "compute_input": {"count": 0, "ns": 0},
                                      "compute_infer": {"count": 2, "ns": 1_000_000},
                                      "compute_output": {"count": 0, "ns": 0}}
    assert both["last_inference"] == max(p["last_inference"] for p in parts)


def test_haproxy_counts_parse_from_its_admin_answers() -> None:
    from qkan_pack.serve._haproxy_admin import parse_ingress_counts

    stat = ("# pxname,svname,dreq,req_tot,\n"
            "http_frontend,FRONTEND,0,40,\n"
            "http-app,BACKEND,7,30,\n"
            "http-app,SERVE_REPLICA_x,0,23,\n"
            "grpc-app,BACKEND,2,9,\n"
            "default_backend,BACKEND,5,5,\n"
            "qkan-pack-unavailable,FRONTEND,0,3,\n"
            "qkan-pack-unavailable-grpc,FRONTEND,0,4,\n")
    table = ("# table: qkan-pack-counts, type: integer, size:1, used:1\n"
             "0x5611: key=0 use=0 exp=0 shard=0 gpc0=11 gpc1=0\n")
    assert parse_ingress_counts(stat, table) == {
        "unauthorized": 11, "overloaded": {"http": 7, "grpc": 2},
        "unavailable": {"http": 3, "grpc": 4}}
    assert parse_ingress_counts("", "")["unauthorized"] == 0


# -- a server: every protocol, two replicas ------------------------------------------------


@pytest.fixture(scope="module")
def server(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'qkan-pack[serve]')")
    with grpc_server(artifact, ["--name", NAME, "--replicas", "2"],
                     tmp_path_factory.mktemp("token"), TOKEN) as running:
        yield running


def _scrape(server: Server) -> dict[tuple[str, tuple], float]:
    status, headers, raw = server.request("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain"), (status, raw)
    return _families(raw.decode())


def _post(server: Server, path: str, body: bytes, header_length: int | None) -> int:
    """A binary request of the protocol (``Inference-Header-Content-Length``) with the token."""
    import http.client

    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", path, body, headers)
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()


def _grpc_infer(server: Server, count: int, token: str | None = TOKEN) -> None:
    grpc_client = pytest.importorskip("tritonclient.grpc")
    client = grpc_client.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    given = grpc_client.InferInput("x", [1, 2], "FP32")
    given.set_data_from_numpy(np.random.default_rng(count).random((1, 2), dtype=np.float32))
    headers = {"authorization": f"Bearer {token}"} if token else None
    done = 0
    while done < count:
        try:
            client.infer(NAME, [given], headers=headers)
            done += 1
        except grpc_client.InferenceServerException as exc:
            if "UNAVAILABLE" not in str(exc):  # a full server: back off, as a client would
                raise
            time.sleep(0.1)


@pytest.mark.serve
@pytest.mark.slow
def test_metrics_count_what_was_sent_over_every_protocol(server: Server) -> None:
    """Successes over the JSON route, the protocol's HTTP and gRPC; a 422; a 401 over HTTP
    (HAProxy's, counted from its admin socket) and over gRPC (the replica's); a burst of
    64 rows against 2 x (8 at work + 4 waiting), whose 503s HAProxy answers."""
    grpc_client = pytest.importorskip("tritonclient.grpc")
    before = _scrape(server)
    row = b'{"inputs": [[0.1, 0.2]]}'
    assert all(server.request("/", row)[0] == 200 for _ in range(5))
    assert server.request("/", b'{"inputs": [[0.1, 0.2, 0.3]]}')[0] == 422
    assert server.request("/", row, token=None)[0] == 401
    header = (b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32",'
              b'"parameters":{"binary_data_size":8}}]}')
    body = header + np.zeros((1, 2), np.float32).tobytes()
    assert _post(server, f"/v2/models/{NAME}/infer", body, len(header)) == 200
    assert _post(server, f"/v2/models/{NAME}/infer", body, None) == 400  # no header length
    _grpc_infer(server, 3)
    with pytest.raises(grpc_client.InferenceServerException, match="UNAUTHENTICATED"):
        _grpc_infer(server, 1, token=None)

    def burst(_: int) -> int:
        return server.request("/", row)[0]

    with ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(burst, range(64)))
    assert set(statuses) <= {200, 503}
    after = _scrape(server)

    def delta(name: str, **labels: str) -> float:
        return _total(after, name, **labels) - _total(before, name, **labels)

    json_ok = 5 + statuses.count(200)
    assert delta("qkan_pack_requests_total", protocol="json", outcome="success") == json_ok
    assert delta("qkan_pack_requests_total", protocol="json", outcome="client_error") == 1
    assert delta("qkan_pack_requests_total", protocol="oip-http", outcome="client_error") == 1
    assert delta("qkan_pack_requests_total", protocol="oip-http", outcome="success") == 1
    assert delta("qkan_pack_requests_total", protocol="oip-grpc", outcome="success") == 3
    assert delta("qkan_pack_requests_total", protocol="oip-grpc", outcome="unauthorized") == 1
    assert delta("qkan_pack_ingress_refusals_total", reason="unauthorized") == 1
    assert statuses.count(503) == (delta("qkan_pack_ingress_refusals_total", reason="overloaded")
                                   + delta("qkan_pack_requests_total", outcome="overloaded"))
    assert delta("qkan_pack_request_duration_seconds_count", protocol="json") == json_ok
    rows = json_ok + 1 + 3  # every success was one row
    assert delta("qkan_pack_queue_duration_seconds_count", model=NAME) == rows
    assert delta("qkan_pack_rows_per_replay_sum", model=NAME) == rows
    assert delta("qkan_pack_replayed_rows_total", kind="request") == rows
    assert _total(after, "qkan_pack_scrape_replicas", state="answered") == 2
    depth = {(dict(k)["replica"], dict(k)["state"]): v for (name, k), v in after.items()
             if name == "qkan_pack_pending_requests"}
    assert len(depth) == 4 and set(depth.values()) == {0}  # both replicas, nothing in flight
    replicas = {dict(k)["replica"] for (name, k) in after if name == "qkan_pack_model_loads_total"}
    assert len(replicas) == 2 and _total(after, "qkan_pack_model_loads_total", model=NAME) == 2
    assert server.json("/stats")[0] == 200  # the replica's own view is still there


@pytest.mark.serve
@pytest.mark.slow
def test_concurrent_grpc_rows_share_replays(server: Server) -> None:
    """Regression (issue 43): each gRPC ModelInfer replayed alone (1.01 to 1.09 rows per
    replay at 32 clients, against ~30 for the JSON route). 12 concurrent gRPC clients now
    share replays (the artifact's largest batch is 8)."""
    pytest.importorskip("tritonclient.grpc")
    before = _scrape(server)
    started = time.monotonic()
    with ThreadPoolExecutor(12) as pool:
        list(pool.map(lambda _: _grpc_infer(server, 25), range(12)))
    assert time.monotonic() - started < 120
    after = _scrape(server)

    def delta(name: str) -> float:
        return _total(after, name, model=NAME) - _total(before, name, model=NAME)

    rows, replays = delta("qkan_pack_rows_per_replay_sum"), delta("qkan_pack_rows_per_replay_count")
    assert rows == 12 * 25
    assert rows / replays > 1.5, (rows, replays)
