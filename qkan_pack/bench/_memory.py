"""Graph memory: every shape in one shared pool (what the predictor does) against one
private pool per shape, captured with the runtime's own primitives."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from ..runtime import (
    capture_graph,
    capture_session,
    capture_streams,
    flat_forward,
    release_graph_memory,
    warm_up,
)


def measure_pools(model: Callable[..., Any], inputs: Sequence[Sequence[torch.Tensor]],
                  labels: Sequence[str], device: torch.device) -> dict[str, Any]:
    """Graph memory of every shape in one shared pool (largest first) vs one pool per shape.

    Every shape is warmed up first, then the cache emptied; each figure is the growth of
    ``memory_reserved`` across the captures alone. Graphs are freed afterwards.
    """
    order = sorted(range(len(inputs)), key=lambda i: -sum(t.numel() for t in inputs[i]))
    streams = capture_streams(device)
    forward = partial(flat_forward, model)
    with torch.cuda.device(device):
        statics = [[t.detach().clone() for t in sample] for sample in inputs]
        for static in statics:
            warm_up(forward, static, streams, device)
        shared = _capture_each(forward, statics, order, labels, streams, device, shared_pool=True)
        private = _capture_each(forward, statics, order, labels, streams, device,
                                shared_pool=False)
    largest = labels[order[0]]
    return {
        "shared_pool_bytes": sum(shared.values()),
        "shared_pool_growth_by_shape": shared,
        "private_pools_bytes": sum(private.values()),
        "private_pool_by_shape": private,
        "largest_shape": largest,
        "largest_alone_bytes": private[largest],
        "shared_over_largest_alone": sum(shared.values()) / private[largest] if private[largest]
        else None,
    }


def _capture_each(forward: Any, statics: list[list[torch.Tensor]], order: list[int],
                  labels: Sequence[str], streams: Any, device: torch.device,
                  shared_pool: bool) -> dict[str, int]:
    """Bytes ``memory_reserved`` grew per capture, all into one pool or each into its own.

    As the predictor captures: inside a capture session, so the cuBLAS workspace is
    allocated in the pool (one session for the shared pool, one per private pool)."""
    grown: dict[str, int] = {}
    graphs = []
    pool = torch.cuda.graph_pool_handle() if shared_pool else None
    with capture_session() if shared_pool else contextlib.nullcontext():
        release_graph_memory(device)  # the warm-ups' workspaces, freed just now
        for index in order:
            if not shared_pool:
                release_graph_memory(device)
            before = torch.cuda.memory_reserved(device)
            with contextlib.nullcontext() if shared_pool else capture_session():
                graphs.append(capture_graph(forward, statics[index], streams, pool))
            grown[labels[index]] = torch.cuda.memory_reserved(device) - before
    graphs.clear()
    release_graph_memory(device)
    return grown
