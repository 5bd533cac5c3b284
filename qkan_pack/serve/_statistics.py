"""Triton's statistics extension (``GET /v2/models[/<name>[/versions/<v>]]/stats``, gRPC
``ModelStatistics``) from a replica's counters (``_stats``), summed over the replicas of a
version as ``GET /metrics`` gathers them: what Triton's ``perf_analyzer`` and tritonclient's
``get_inference_statistics`` read.

How the counters map onto Triton's fields:

- ``inference_count``: the requests' rows replays computed (Triton counts a batch of N as N
  inferences); ``execution_count``: replays;
- ``inference_stats.success``: successful inference requests and their time in the replica
  (from its handler's start to the reply: parse, queue, replay, reply), over every
  protocol; ``fail``: those answered with an error (4xx but 401, 503, 5xx), untimed (``ns``
  0); ``queue``: each request's wait in the batcher; ``compute_infer``: replays and their
  time, as in ``batch_stats`` per captured batch size;
- ``compute_input`` and ``compute_output`` are not timed apart from the request (count and
  ``ns`` 0), and there is no response cache (``cache_hit``, ``cache_miss`` 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._stats import Buckets, Entry, Snapshot

#: The duration fields of Triton's ``inference_stats``, in its order.
INFERENCE_FIELDS = ("success", "fail", "queue", "compute_input", "compute_infer",
                    "compute_output", "cache_hit", "cache_miss")
#: Those of each ``batch_stats`` entry.
BATCH_FIELDS = ("compute_input", "compute_infer", "compute_output")
#: Outcomes that are no inference at all: a request refused for its token never reached the
#: model (``_stats.OUTCOMES``).
NOT_INFERENCES = ("success", "unauthorized")


def _duration(count: int = 0, seconds: float = 0.0) -> dict[str, int]:
    return {"count": int(count), "ns": round(seconds * 1e9)}


def _timed(buckets: Sequence[Buckets]) -> dict[str, int]:
    return _duration(sum(sum(b.counts) for b in buckets), sum(b.total for b in buckets))


def replica_statistics(snapshot: Snapshot, entries: Mapping[str, Entry], name: str,
                       version: str) -> dict[str, Any]:
    """One replica's ``model_stats`` entry (Triton's JSON), from its counters."""
    inference = {key: _duration() for key in INFERENCE_FIELDS} | {
        "success": _timed(list(snapshot.latency.values())),
        "fail": _duration(sum(n for (_, outcome), n in snapshot.answered.items()
                              if outcome not in NOT_INFERENCES)),
        "queue": _timed([snapshot.queue]),
        "compute_infer": _timed(list(snapshot.replay_seconds.values()))}
    batches: dict[int, dict[str, dict[str, int]]] = {}
    for label, buckets in snapshot.replay_seconds.items():
        size = entries[label].rows if label in entries else 1
        batch = batches.setdefault(size, {key: _duration() for key in BATCH_FIELDS})
        batch["compute_infer"] = _total([batch["compute_infer"], _timed([buckets])])
    return {
        "name": name, "version": version,
        "last_inference": int(snapshot.last_success * 1000),
        "inference_count": sum(rows * n for rows, n in snapshot.rows_per_replay.items()),
        "execution_count": sum(snapshot.replays.values()),
        "inference_stats": inference,
        "batch_stats": [{"batch_size": size, **batches[size]} for size in sorted(batches)]}


def merged_statistics(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The replicas' entries of one version as one: counts and durations summed, the latest
    ``last_inference``."""
    first = parts[0]
    batches: dict[int, dict[str, Any]] = {}
    for part in parts:
        for batch in part["batch_stats"]:
            into = batches.setdefault(batch["batch_size"], {key: _duration() for key in BATCH_FIELDS})
            for key in BATCH_FIELDS:
                into[key] = _total([into[key], batch[key]])
    return {
        "name": first["name"], "version": first["version"],
        "last_inference": max(p["last_inference"] for p in parts),
        "inference_count": sum(p["inference_count"] for p in parts),
        "execution_count": sum(p["execution_count"] for p in parts),
        "inference_stats": {key: _total([p["inference_stats"][key] for p in parts])
                            for key in INFERENCE_FIELDS},
        "batch_stats": [{"batch_size": size, **batches[size]} for size in sorted(batches)]}


def _total(durations: Sequence[Mapping[str, int]]) -> dict[str, int]:
    return {"count": sum(d["count"] for d in durations), "ns": sum(d["ns"] for d in durations)}


def statistics_message(pb: Any, stats: Sequence[Mapping[str, Any]]) -> Any:
    """gRPC's ``ModelStatisticsResponse`` holding ``stats`` (Triton's JSON entries)."""
    def durations(values: Mapping[str, Mapping[str, int]], keys: Sequence[str]) -> dict[str, Any]:
        return {key: pb.StatisticDuration(**values[key]) for key in keys}

    return pb.ModelStatisticsResponse(model_stats=[pb.ModelStatistics(
        name=s["name"], version=s["version"], last_inference=s["last_inference"],
        inference_count=s["inference_count"], execution_count=s["execution_count"],
        inference_stats=pb.InferStatistics(**durations(s["inference_stats"], INFERENCE_FIELDS)),
        batch_stats=[pb.InferBatchStatistics(batch_size=b["batch_size"],
                                             **durations(b, BATCH_FIELDS))
                     for b in s["batch_stats"]]) for s in stats])
