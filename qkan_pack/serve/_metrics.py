"""``GET /metrics``: every replica's counters (``_stats``) as Prometheus metric families,
labelled by model, version and replica, merged into one scrape.

How replicas are aggregated: the replica that answers the scrape asks every replica of its
deployment for its families over the deployment handle (``DeploymentHandle.broadcast``, each
replica's ``metric_families``), itself included, and writes them out together; a replica
that does not answer within ``SCRAPE_TIMEOUT_S`` is left out and counted in
``qkan_pack_scrape_replicas{state="failed"}``. Series stay per replica (the ``replica``
label) rather than summed: a replica that stops takes its counts with it, and a sum over
replicas would then go down, which Prometheus reads as a counter reset; ``sum by (model,
version) (rate(...))`` is the query-side total.

Why not Ray's own metrics pipeline (``ray.serve.metrics``): Ray exports it from each node's
metrics agent, on a port of its own without authentication (``serve`` keeps it on loopback),
every few seconds; a scrape of ``/metrics`` through the served port, behind the token,
would not see it, and each record call crosses into Ray's core worker on the request path.

Requests that never reach a replica (HAProxy's 401 for a missing token, its 503 when every
replica is full or none is up) are counted by HAProxy (``_haproxy``); a replica on HAProxy's
node reads those counts from HAProxy's admin socket and exports them as
``qkan_pack_ingress_refusals_total``. Several replicas read the same counts: the merge keeps
one of each series (the largest: the freshest read of a counter).

Nothing here is on the request path: families are built when a scrape asks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._stats import Buckets, Snapshot

#: The text format's content type (``exposition``).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: How long a scrape waits for every replica's families.
SCRAPE_TIMEOUT_S = 5.0
#: Bounds of the rows-per-replay histogram (the largest captured batch is added).
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
REPLICA_LABELS = ("model", "version", "replica")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaInfo:
    """What a replica says about itself beside its counters: the model it serves, how its
    load went, and its device."""

    model: str
    version: str
    replica: str
    device: str
    load_seconds: float
    ready_at: float
    #: (shape, test, max_abs): the reference and replay self-tests' largest difference per
    #: captured shape (every one passed: the replica serves).
    self_tests: tuple[tuple[str, str, float], ...] = ()
    max_rows: int = 1

    @property
    def labels(self) -> list[str]:
        return [self.model, self.version, self.replica]


@dataclass
class Ingress:
    """HAProxy's own refusals (``_haproxy_admin.ingress_counts``): 401s; per protocol, 503s
    (gRPC: UNAVAILABLE) for a full backend and when no replica could take a request."""

    unauthorized: int = 0
    overloaded: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, int] = field(default_factory=dict)


def replica_families(snapshot: Snapshot, info: ReplicaInfo,
                     gpu_memory: Mapping[str, int] | None = None,
                     ingress: Ingress | None = None,
                     pending: tuple[int, int] | None = None) -> list[Any]:
    """One replica's families (``prometheus_client`` metric families, picklable).
    ``pending``: its admission's (at work, waiting) requests at the scrape."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    labels, names = info.labels, list(REPLICA_LABELS)
    families: list[Any] = [_counters(
        "qkan_pack_requests", "Inference requests a replica answered, by protocol and outcome "
        "(success, client_error, unauthorized, overloaded, server_error); 401s on any route "
        "count as unauthorized.", names, ("protocol", "outcome"), labels, snapshot.answered)]
    if pending is not None:
        depth = GaugeMetricFamily(
            "qkan_pack_pending_requests", "Inference requests in the replica at the scrape: "
            "at_work (admitted: parsing, batched, replaying, replying) and waiting (queued for "
            "a slot, within --max-queued-requests).", labels=[*names, "state"])
        for state, count in zip(("at_work", "waiting"), pending):
            depth.add_metric([*labels, state], count)
        families.append(depth)
    families.append(_histograms(
        "qkan_pack_request_duration_seconds", "Successful inference requests' latency in the "
        "replica, from its handler's start to the reply.", names, "protocol", labels,
        snapshot.latency))
    families.append(_histograms(
        "qkan_pack_queue_duration_seconds", "Each request's wait in the batcher for its "
        "replay (0 for a request replayed on arrival).", names, None, labels,
        {"": snapshot.queue}))
    families.append(_histograms(
        "qkan_pack_replay_duration_seconds", "Replays (graph calls) per captured shape and "
        "their duration; _count is the replays per shape.", names, "shape", labels,
        snapshot.replay_seconds))
    families.append(_rows_per_replay(snapshot.rows_per_replay, info, names))
    families.append(_counters(
        "qkan_pack_replayed_rows", "Batch rows replays computed per captured shape: requests' "
        "rows, and filler rows (copies of a row completing a captured batch).", names,
        ("shape", "kind"), labels, snapshot.rows))
    families.append(_counters(
        "qkan_pack_replayed_elements", "Input elements replays computed per captured shape: "
        "requests' own, and padding (filler rows, padded lengths).", names, ("shape", "kind"),
        labels, snapshot.elements))
    loads = CounterMetricFamily(
        "qkan_pack_model_loads", "Model loads by result; a replica counts its own load once it "
        "serves (a load that fails never serves).", labels=[*names, "result"])
    loads.add_metric([*labels, "success"], 1)
    load_seconds = GaugeMetricFamily(
        "qkan_pack_model_load_duration_seconds", "From the load's start to ready: verify, "
        "import, weights, self-tests, capture.", labels=names)
    load_seconds.add_metric(labels, info.load_seconds)
    ready = GaugeMetricFamily(
        "qkan_pack_model_ready_timestamp_seconds", "When the replica became ready (Unix time).",
        labels=[*names, "device"])
    ready.add_metric([*labels, info.device], info.ready_at)
    self_test = GaugeMetricFamily(
        "qkan_pack_self_test_max_abs_error", "Largest difference the load's self-tests "
        "measured per captured shape: against the build's references, and graph replay "
        "against eager; every one passed its tolerance.", labels=[*names, "shape", "test"])
    for shape, test, value in info.self_tests:
        self_test.add_metric([*labels, shape, test], value)
    families += [loads, load_seconds, ready, self_test]
    if gpu_memory:
        for kind, value in sorted(gpu_memory.items()):
            gauge = GaugeMetricFamily(
                f"qkan_pack_gpu_memory_{kind}_bytes", f"GPU memory the replica's process holds "
                f"({kind}: torch.cuda.memory_{kind}).", labels=[*names, "device"])
            gauge.add_metric([*labels, info.device], value)
            families.append(gauge)
    if ingress is not None:
        families.append(ingress_family(ingress))
    return families


def _counters(name: str, documentation: str, names: Sequence[str], keys: Sequence[str],
              labels: Sequence[str], data: Mapping[Any, int]) -> Any:
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, documentation, labels=[*names, *keys])
    for values, count in sorted(data.items()):
        family.add_metric([*labels, *values], count)
    return family


def _histograms(name: str, documentation: str, names: Sequence[str], key: str | None,
                labels: Sequence[str], data: Mapping[str, Buckets]) -> Any:
    from prometheus_client.core import HistogramMetricFamily

    family = HistogramMetricFamily(name, documentation,
                                   labels=[*names, key] if key else list(names))
    for value, buckets in sorted(data.items()):
        family.add_metric([*labels, value] if key else list(labels),
                          _cumulative(buckets.bounds, buckets.counts), buckets.total)
    return family


def _cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (``Buckets``) as Prometheus's cumulative ``le`` buckets."""
    out: list[tuple[str, float]] = []
    total = 0
    for bound, count in zip((*map(_bound_text, bounds), "+Inf"), counts):
        total += count
        out.append((bound, total))
    return out


def _bound_text(bound: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(bound)


def _rows_per_replay(counts: Mapping[int, int], info: ReplicaInfo, names: Sequence[str]) -> Any:
    bounds = sorted({b for b in ROW_BUCKETS if b < info.max_rows} | {info.max_rows})
    buckets = Buckets(bounds)
    for rows, count in counts.items():
        buckets.counts[min(len(bounds), _index(bounds, rows))] += count
        buckets.total += rows * count
    return _histograms("qkan_pack_rows_per_replay", "Requests' rows each replay carried "
                       "(the batcher's fill).", names, None, info.labels, {"": buckets})


def _index(bounds: Sequence[int], rows: int) -> int:
    from bisect import bisect_left

    return bisect_left(bounds, rows)


def ingress_family(ingress: Ingress) -> Any:
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(
        "qkan_pack_ingress_refusals", "Requests HAProxy answered without a replica: a missing "
        "or wrong token (401), every replica full (503), no replica up (503).",
        labels=["protocol", "reason"])
    family.add_metric(["http", "unauthorized"], ingress.unauthorized)
    for protocol, count in sorted(ingress.overloaded.items()):
        family.add_metric([protocol, "overloaded"], count)
    for protocol in sorted({"http", "grpc", *ingress.unavailable}):
        family.add_metric([protocol, "unavailable"], ingress.unavailable.get(protocol, 0))
    return family


def repository_families(loads: Mapping[tuple[str, str, str], int],
                        states: Mapping[tuple[str, str], str],
                        refusals: Mapping[str, int]) -> list[Any]:
    """A model repository's own families (its router's): loads of each model version by
    result (a load that failed, whose replicas never served, counts here only), each
    version's state, and the requests the router refused itself (a name or version that
    does not serve, a missing token)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    loaded = CounterMetricFamily(
        "qkan_pack_repository_loads", "Loads of each model version by the repository (at start "
        "and by POST /v2/repository/models/<name>/load), by result: success (it serves) or "
        "failure (verification, settings, replicas' load or self-test; a version serving "
        "before keeps serving).", labels=["model", "version", "result"])
    for (model, version, result), count in sorted(loads.items()):
        loaded.add_metric([model, version, result], count)
    ready = GaugeMetricFamily(
        "qkan_pack_model_version_ready", "1 for each model version that serves, 0 for one "
        "loading, unloading or unavailable (see GET / for why).",
        labels=["model", "version", "state"])
    for (model, version), state in sorted(states.items()):
        ready.add_metric([model, version, state], 1.0 if state == "READY" else 0.0)
    refused = _counters(
        "qkan_pack_repository_refusals", "Requests the repository's router answered without a "
        "model: unauthorized (401), not_found (404: no such model or version), unavailable "
        "(503: nothing ready), client_error (400).", [], ("outcome",), [],
        {(k,): v for k, v in refusals.items()})
    return [loaded, ready, refused]


def merge(parts: Iterable[Sequence[Any]]) -> list[Any]:
    """Families of several replicas as one list: a family's samples from every part, each
    series once (a series that several parts hold, such as HAProxy's counts read by every
    replica on its node, keeps its largest value)."""
    from prometheus_client.core import Metric

    merged: dict[str, Any] = {}
    series: dict[str, dict[tuple, Any]] = {}
    for families in parts:
        for family in families:
            if family.name not in merged:
                merged[family.name] = Metric(family.name, family.documentation, family.type,
                                             family.unit)
                series[family.name] = {}
            seen = series[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in seen or sample.value > seen[key].value:
                    seen[key] = sample
    for name, family in merged.items():
        family.samples = list(series[name].values())
    return list(merged.values())


def scrape_family(answered: int, failed: int) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily("qkan_pack_scrape_replicas", "Replicas this scrape asked for "
                               "their metrics: answered, or failed (left out).",
                               labels=["state"])
    family.add_metric(["answered"], answered)
    family.add_metric(["failed"], failed)
    return family


def exposition(families: Sequence[Any]) -> tuple[bytes, str]:
    """The families in Prometheus's text format, with its content type: version 0.0.4, which
    every Prometheus reads (the names here need none of 1.0.0's escaping)."""
    from prometheus_client import CollectorRegistry, generate_latest

    class Families:
        def collect(self) -> Iterable[Any]:
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    return generate_latest(registry), CONTENT_TYPE


async def every_replica(method: str, local: list[Any]
                        ) -> tuple[list[list[Any]], int, int]:
    """Every replica's answer to ``method`` over this deployment's handle (``local``, this
    replica's own, kept in any case), how many replicas answered and how many did not.
    Outside a Ray Serve replica: ``local`` alone."""
    try:
        from ray import serve

        context = serve.get_replica_context()
        handle = serve.get_deployment_handle(context.deployment, context.app_name)
    except Exception:  # not in a replica (a test, a benchmark): this process is the server
        return [local], 1, 0
    parts, answered, failed = await replicas_of([handle], method)
    return [local, *parts], max(1, answered), failed


async def replicas_of(handles: Sequence[Any], method: str, *args: Any, answer: type = list
                      ) -> tuple[list[Any], int, int]:
    """Every replica of each deployment ``handles`` reach answering ``method(*args)`` (a
    model repository's router asks every version's), together: (their answers, each of type
    ``answer``; how many replicas answered; how many did not within ``SCRAPE_TIMEOUT_S``)."""
    import asyncio

    async def ask(handle: Any) -> list[Any]:
        try:
            return list(await handle.broadcast(method, *args).results_async(
                timeout_s=SCRAPE_TIMEOUT_S, return_exceptions=True))
        except Exception as exc:  # the router never learnt of the replicas in time
            logger.warning("metrics: the replicas did not answer: %s", exc)
            return [exc]

    answers = [a for found in await asyncio.gather(*map(ask, handles)) for a in found]
    parts = [a for a in answers if isinstance(a, answer)]
    failed = [a for a in answers if not isinstance(a, answer)]
    for problem in failed[:1]:
        logger.warning("metrics: a replica did not answer: %r", problem)
    return parts, len(parts), len(failed)
