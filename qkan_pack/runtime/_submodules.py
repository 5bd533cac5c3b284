"""Submodule capture: graph the safe blocks of a model whose whole forward cannot be graphed.

Eager forwards with pre-hooks learn each chosen submodule's input signatures per manifest
shape; each signature is captured into the predictor's shared pool; the submodule's
``forward`` is then replaced by replay + copy, while the glue around it runs eagerly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import CaptureError
from ._capture import GraphPool, ShapeGraph
from ._progress import progress_bar
from ._report import ShapeRecord
from ._tree import describe_output, flatten, unflatten


def select_submodules(model: torch.nn.Module, names: Sequence[str]
                      ) -> list[tuple[str, torch.nn.Module]]:
    """Top-most submodules whose class is in ``names`` (default: classes from ``qkan``)."""

    def wanted(module: torch.nn.Module) -> bool:
        cls = type(module)
        if names:
            return cls.__name__ in names
        return cls.__module__.split(".")[0] == "qkan"

    chosen: list[tuple[str, torch.nn.Module]] = []
    for path, module in model.named_modules():
        if not path or not wanted(module):
            continue
        if any(path.startswith(prefix + ".") for prefix, _ in chosen):
            continue
        chosen.append((path, module))
    return chosen


def capture_submodules(model: torch.nn.Module, pool: GraphPool,
                       samples: Sequence[tuple[str, list[torch.Tensor]]], indices: list[int],
                       names: Sequence[str], records: list[ShapeRecord],
                       progress: bool | None) -> list[SubmoduleGraphs]:
    """Capture the chosen submodules for the shapes in ``indices`` and install replay."""
    targets = select_submodules(model, names)
    if not targets:
        wanted = ", ".join(names) if names else "modules from the qkan package"
        raise CaptureError(f"no submodules to capture: the model has no {wanted}", hint=(
            "pass --submodules ClassName,... naming graph-safe blocks"))
    recorders = [SubmoduleGraphs(path, module) for path, module in targets]
    _record_calls(model, recorders, {i: samples[i][1] for i in indices}, pool.device)
    for index in indices:
        records[index].policy = "submodules"
    for index in progress_bar(indices, desc="capturing submodules", enabled=progress):
        started = time.perf_counter()
        record = records[index]
        record.graphs = sum(r.capture_for(index, pool, record) for r in recorders)
        record.capture_seconds = time.perf_counter() - started
    for recorder in recorders:
        recorder.install()
    return recorders


class SubmoduleGraphs:
    """Per-signature graphs for one submodule; replaces its forward with replay + copy."""

    def __init__(self, path: str, module: torch.nn.Module) -> None:
        self.path = path
        self.module = module
        self.samples: dict[int, list[tuple[Any, list[torch.Tensor]]]] = {}
        self.graphs: dict[Any, tuple[ShapeGraph, Any]] = {}
        self.recording: int | None = None

    def pre_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if self.recording is None:
            return
        if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
            raise CaptureError(
                "called with non-tensor or keyword arguments; only submodules taking tensors "
                "positionally can be captured", module=f"{self.path} ({type(module).__name__})")
        key = _signature(args)
        samples = self.samples.setdefault(self.recording, [])
        if all(existing != key for existing, _ in samples):
            samples.append((key, [a.detach().clone() for a in args]))

    def capture_for(self, index: int, pool: GraphPool, record: ShapeRecord) -> int:
        """Capture this submodule's signatures seen at shape ``index``; how many were new."""
        captured = 0
        for key, sample in self.samples.get(index, []):
            if key in self.graphs:
                continue
            structure: list[Any] = []

            def call(*args: torch.Tensor, _structure: list[Any] = structure) -> list[torch.Tensor]:
                out = self.module(*args)
                _structure[:] = [describe_output(out)]
                return flatten(out)

            try:
                shape_graph, grown = pool.capture(call, sample)
            except CaptureError as exc:
                raise CaptureError(exc.op, shape=record.label,
                                   module=f"{self.path} ({type(self.module).__name__})") from exc
            record.pool_bytes += grown
            self.graphs[key] = (shape_graph, structure[0])
            captured += 1
        return captured

    def install(self) -> None:
        graphs = self.graphs
        path = self.path

        def replay(*args: torch.Tensor, **kwargs: Any) -> Any:
            key = _signature(args)
            found = graphs.get(key) if not kwargs else None
            if found is None:
                raise CaptureError(
                    f"called with {key}, which no captured graph covers (its input shapes "
                    "depend on data, not only on the declared shapes)", module=path)
            shape_graph, structure = found
            return unflatten(structure, shape_graph.replay_copy(args))

        self.module.forward = replay  # type: ignore[method-assign]

    def uninstall(self) -> None:
        self.module.__dict__.pop("forward", None)
        self.graphs.clear()


def _signature(args: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(a.shape), a.dtype, tuple(a.stride())) for a in args)


def _record_calls(model: torch.nn.Module, recorders: list[SubmoduleGraphs],
                  samples: dict[int, list[torch.Tensor]], device: torch.device) -> None:
    """Run eager forwards with hooks to learn each submodule's input signatures per shape."""
    handles = [r.module.register_forward_pre_hook(r.pre_hook, with_kwargs=True) for r in recorders]
    try:
        for index, sample in samples.items():
            for recorder in recorders:
                recorder.recording = index
            with torch.no_grad():
                model(*[t.to(device) for t in sample])
    finally:
        for handle in handles:
            handle.remove()
        for recorder in recorders:
            recorder.recording = None
