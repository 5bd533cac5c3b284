"""Submodule capture: graph the safe blocks of a model whose whole forward cannot be graphed.

Eager forwards with hooks record each candidate submodule's calls per manifest shape (its
tensor arguments, its constant arguments, its eager outputs). Each distinct call signature
is captured into the predictor's shared pool and checked: its replay must equal its eager
output. The submodule's ``forward`` is then replaced by replay + copy, while the glue
around it runs eagerly.

Which submodules: the classes named by ``--submodules`` (top-most instances; a failure is an
error); otherwise, for any model, the largest graph-safe blocks: starting from the model's
children, a module is taken when every call it makes captures and replays correctly, else
its own children are tried in its place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import CaptureError, ModelSourceError
from ._capture import GraphPool, ShapeGraph
from ._options import REPLAY_TOLERANCE
from ._progress import progress_bar
from ._report import ShapeRecord
from ._selftest import compare
from ._tree import describe_output, flatten, unflatten

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

Samples = Sequence[tuple[str, list[torch.Tensor]]]
_CONSTANTS = (type(None), bool, int, float, str)


def select_submodules(model: torch.nn.Module, names: Sequence[str]
                      ) -> list[tuple[str, torch.nn.Module]]:
    """Top-most submodules whose class name is in ``names``."""
    chosen: list[tuple[str, torch.nn.Module]] = []
    for path, module in model.named_modules():
        if not path or type(module).__name__ not in names:
            continue
        if any(path.startswith(prefix + ".") for prefix, _ in chosen):
            continue
        chosen.append((path, module))
    return chosen


def capture_submodules(model: torch.nn.Module, forward: Callable[..., Any], pool: GraphPool,
                       samples: Samples, indices: list[int], names: Sequence[str],
                       records: list[ShapeRecord], progress: bool | None) -> list[SubmoduleGraphs]:
    """Capture submodules for the shapes in ``indices``, install replay, return them."""
    for index in indices:
        records[index].policy = "submodules"
    if names:
        targets = select_submodules(model, names)
        if not targets:
            raise CaptureError(f"no submodules to capture: the model has no {', '.join(names)}",
                               hint="pass --submodules ClassName,... naming graph-safe blocks")
        chosen = _capture_named(targets, forward, pool, samples, indices, records, progress)
    else:
        chosen = _capture_largest_safe(model, forward, pool, samples, indices, records)
    for recorder in chosen:
        recorder.install()
    return chosen


def _capture_named(targets: list[tuple[str, torch.nn.Module]], forward: Callable[..., Any],
                   pool: GraphPool, samples: Samples, indices: list[int],
                   records: list[ShapeRecord], progress: bool | None) -> list[SubmoduleGraphs]:
    recorders = [SubmoduleGraphs(path, module) for path, module in targets]
    _record_calls(forward, recorders, samples, indices, pool.device)
    for recorder in recorders:
        if recorder.refusal:
            raise CaptureError(recorder.refusal, module=recorder.label)
    for index in progress_bar(indices, desc="capturing submodules", enabled=progress):
        started = time.perf_counter()
        for recorder in recorders:
            recorder.capture_for(index, pool, records[index])
        records[index].capture_seconds += time.perf_counter() - started
    return recorders


def _capture_largest_safe(model: torch.nn.Module, forward: Callable[..., Any], pool: GraphPool,
                          samples: Samples, indices: list[int],
                          records: list[ShapeRecord]) -> list[SubmoduleGraphs]:
    """Breadth-first from the model's children: keep a module whose every call captures and
    replays correctly; try the children of one that does not."""
    chosen: list[SubmoduleGraphs] = []
    frontier = list(model.named_children())
    while frontier:
        recorders = [SubmoduleGraphs(path, module) for path, module in frontier]
        _record_calls(forward, recorders, samples, indices, pool.device)
        frontier = []
        for recorder in recorders:
            if not recorder.calls or _stateless_leaf(recorder.module):
                continue  # never called, or a parameter-free op: eager costs it no more
            if recorder.try_capture(indices, pool, records):
                chosen.append(recorder)
            else:
                frontier += [(f"{recorder.path}.{name}", child)
                             for name, child in recorder.module.named_children()]
    if not chosen:
        raise CaptureError("no part of the model could be captured: every block syncs with the "
                           "host or depends on data", hint="serve it on the CPU, or name "
                           "graph-safe blocks with --submodules ClassName,...")
    return chosen


def _stateless_leaf(module: torch.nn.Module) -> bool:
    """An activation-like leaf (no children, parameters or buffers): one kernel, nothing a
    graph of its own would save."""
    return (next(module.children(), None) is None and next(module.parameters(), None) is None
            and next(module.buffers(), None) is None)


@dataclass
class _Call:
    """One recorded call: its tensors (static input order), how to rebuild the arguments,
    and the eager outputs it produced."""

    tensors: list[torch.Tensor]
    rebuild: Callable[[Sequence[torch.Tensor]], tuple[tuple[Any, ...], dict[str, Any]]]
    outputs: list[torch.Tensor]


@dataclass
class SubmoduleGraphs:
    """Per-signature graphs for one submodule; replaces its forward with replay + copy."""

    path: str
    module: torch.nn.Module
    calls: dict[int, dict[Any, _Call]] = field(default_factory=dict)  # shape -> signature -> call
    graphs: dict[Any, tuple[ShapeGraph, Any]] = field(default_factory=dict)
    refusal: str = ""
    recording: int | None = None

    @property
    def label(self) -> str:
        return f"{self.path} ({type(self.module).__name__})"

    def hook(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
             output: Any) -> None:
        if self.recording is None or self.refusal:
            return
        key, tensors, rebuild = _split_arguments(args, kwargs)
        if key is None:
            self.refusal = ("called with arguments that are neither tensors nor constants; only "
                            "tensors and None/bool/int/float/str arguments can be captured")
            return
        shape_calls = self.calls.setdefault(self.recording, {})
        if key not in shape_calls:
            try:
                leaves = flatten(output)
            except ModelSourceError:  # an ImageList, a custom object: not ours to replay
                self.refusal = (f"returns a {type(output).__name__}, not tensors in tuples, "
                                "lists or dicts: left eager")
                return
            outputs = [t.detach().clone() for t in leaves]
            shape_calls[key] = _Call([t.detach().clone() for t in tensors], rebuild, outputs)

    def try_capture(self, indices: list[int], pool: GraphPool, records: list[ShapeRecord]) -> bool:
        """Capture every recorded call; False (and nothing kept) when one fails or replays
        differently from eager. The records' graph counts are taken back with the graphs;
        their pool bytes stay (the shared pool keeps what it grew)."""
        if self.refusal:
            return False
        counted = [(records[index], records[index].graphs) for index in indices]
        try:
            for index in indices:
                self.capture_for(index, pool, records[index])
        except CaptureError:
            self.graphs.clear()
            for record, graphs in counted:
                record.graphs = graphs
            return False
        return True

    def capture_for(self, index: int, pool: GraphPool, record: ShapeRecord) -> None:
        """Capture and check this submodule's calls seen at shape ``index``."""
        for key, call in self.calls.get(index, {}).items():
            if key in self.graphs:
                continue
            structure: list[Any] = []

            def run(*tensors: torch.Tensor, _call: _Call = call,
                    _structure: list[Any] = structure) -> list[torch.Tensor]:
                args, kwargs = _call.rebuild(tensors)
                out = self.module(*args, **kwargs)
                _structure[:] = [describe_output(out)]
                return flatten(out)

            try:
                graph, grown = pool.capture(run, call.tensors)
            except CaptureError as exc:
                raise CaptureError(exc.op, shape=record.label, module=self.label) from exc
            agreement = compare(graph.replay_copy(call.tensors), call.outputs, REPLAY_TOLERANCE)
            if not agreement.ok:
                raise CaptureError(f"replay differs from eager by {agreement.max_abs:.3g}",
                                   shape=record.label, module=self.label)
            record.pool_bytes += grown
            record.graphs += 1
            self.graphs[key] = (graph, structure[0])

    def install(self) -> None:
        graphs, label = self.graphs, self.label

        def replay(*args: Any, **kwargs: Any) -> Any:
            key, tensors, _ = _split_arguments(args, kwargs)
            found = graphs.get(key)
            if found is None:
                raise CaptureError("called with arguments no captured graph covers (its input "
                                   "shapes or constants depend on data, not only on the declared "
                                   "shapes)", module=label)
            graph, structure = found
            return unflatten(structure, graph.replay_copy(tensors))

        self.module.forward = replay

    def uninstall(self) -> None:
        self.module.__dict__.pop("forward", None)
        self.graphs.clear()


def _split_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]
                     ) -> tuple[Any, list[torch.Tensor], Any]:
    """(signature key, tensors in a fixed order, rebuild(tensors) -> (args, kwargs)); the key is
    None when an argument is neither a tensor nor a hashable constant."""
    names = sorted(kwargs)
    values = [*args, *(kwargs[k] for k in names)]
    slots = [*(("arg", i) for i in range(len(args))), *(("kw", k) for k in names)]
    key: list[tuple[Any, ...]] = []
    tensors: list[torch.Tensor] = []
    for (where, name), value in zip(slots, values):
        if isinstance(value, torch.Tensor):
            key.append((where, name, tuple(value.shape), value.dtype, tuple(value.stride()),
                        value.device))
            tensors.append(value)
        elif isinstance(value, _CONSTANTS):
            key.append((where, name, "const", value))
        else:
            return None, [], None

    def rebuild(new: Sequence[torch.Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        fresh = iter(new)
        rebuilt = [next(fresh) if isinstance(v, torch.Tensor) else v for v in values]
        return tuple(rebuilt[:len(args)]), dict(zip(names, rebuilt[len(args):]))

    return tuple(key), tensors, rebuild


def _record_calls(forward: Callable[..., Any], recorders: list[SubmoduleGraphs],
                  samples: Samples, indices: list[int], device: torch.device) -> None:
    """Run eager forwards with hooks to learn each submodule's calls per shape."""
    handles = [r.module.register_forward_hook(r.hook, with_kwargs=True) for r in recorders]
    try:
        for index in indices:
            for recorder in recorders:
                recorder.recording = index
            with torch.no_grad():
                forward(*[t.to(device) for t in samples[index][1]])
    finally:
        for handle in handles:
            handle.remove()
        for recorder in recorders:
            recorder.recording = None
