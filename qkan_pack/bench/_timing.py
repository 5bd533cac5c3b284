"""Timing primitives: host-to-result latency (the runtime's, shared with ``warm``), pipelined
throughput, the GPU floor."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ..runtime import latencies

__all__ = ["kernel_time_per_call", "latencies", "split", "throughput"]


def throughput(call: Callable[[], Any], count: int, sync: Callable[[], None]) -> list[float]:
    """Pipelined: ``count`` calls and one synchronize at the end (calls per second)."""
    sync()
    started = time.perf_counter()
    for _ in range(count):
        call()
    sync()
    return [count / max(time.perf_counter() - started, 1e-12)]


def split(total: int, blocks: int) -> list[int]:
    blocks = max(1, min(blocks, total))
    base, extra = divmod(total, blocks)
    return [base + (1 if i < extra else 0) for i in range(blocks)]


def kernel_time_per_call(graph: torch.cuda.CUDAGraph, device: torch.device, replays: int
                         ) -> tuple[float, str]:
    """GPU time per replay of ``graph`` (microseconds) and how it was measured.

    CUDA events bracket ``replays`` back-to-back replays. The replays are queued behind a
    sleep kernel long enough for the host to enqueue them all, so the GPU runs them without
    waiting on the host: what the events see is GPU time, not launch overhead.
    """
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        unheld = _event_time(graph, stream, replays, hold_cycles=0)
        enqueue_s = time.perf_counter() - started
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return unheld * 1e3 / replays, (f"CUDA events around {replays} back-to-back replays "
                                            "(no sleep kernel here: may include host gaps)")
        cycles_per_ms = _sleep_rate(stream)
        hold_ms = max(2.0, 3e3 * enqueue_s)
        held = _event_time(graph, stream, replays, hold_cycles=int(hold_ms * cycles_per_ms))
    per_call = min(held, unheld) * 1e3 / replays
    return per_call, (f"CUDA events around {replays} back-to-back replays queued behind a "
                      f"{hold_ms:.1f} ms sleep kernel")


def _event_time(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, replays: int,
                hold_cycles: int) -> float:
    """Milliseconds between events around ``replays`` replays."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    if hold_cycles:
        torch.cuda._sleep(hold_cycles)
    start.record(stream)
    for _ in range(replays):
        graph.replay()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def _sleep_rate(stream: torch.cuda.Stream) -> float:
    """Cycles of ``torch.cuda._sleep`` per millisecond on this GPU."""
    cycles = 2_000_000
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles // 10)
    start.record(stream)
    torch.cuda._sleep(cycles)
    end.record(stream)
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


