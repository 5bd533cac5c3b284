"""Precompiled graphs: inductor's code for every manifest shape, compiled once and loaded
without tracing.

Why: ``torch.compile`` at load re-traces the model with dynamo in every fresh process
(seconds), shipped inductor cache or not: the cache skips compilation, not tracing. Here
the trace happens once per shape where the form is made (``qkan-pack warm --compiled``, or a
``compiled="on"`` load): dynamo captures the whole forward (``fullgraph``, static shapes),
inductor compiles that graph on its own (``torch._inductor.standalone_compile``) and the
result is kept as bytes with a *plan* saying which graph input is which manifest input or
which tensor of the model (a parameter, a buffer, or a plain tensor attribute such as
QKAN's solver caches), and which graph output is which output leaf. A load rebuilds the
model as usual, resolves the plan against it by name, checks every tensor's shape and
dtype, and calls the compiled code directly: nothing is traced or compiled.

Each shape's graph has one of two *forms* (``ShapePlan.form``):

- ``aoti`` (made for GPU targets): the traced graph exported (``torch.export``) and compiled
  ahead of time by AOTInductor into a ``.pt2`` package (a shared library with its Triton
  kernels as cubins). torch's C++ loader (``torch._C._aoti.AOTIModelPackageLoader``, run
  single-threaded so that a CUDA graph can capture it) runs it: a load of these forms imports
  none of dynamo, inductor, sympy or networkx, which is most of what compiled mode otherwise
  adds to a cold start. Every tensor is a graph input, so no weight is baked into the
  package. ``_aoti`` makes, checks and loads the packages: linked against the shared
  libstdc++, and refused (the graph then gets inductor's form) when its wrapper library
  carries libstdc++ statically or a throw-away process loading it fails.
- ``inductor``: ``standalone_compile``'s bytes (``CompiledArtifact``), whose load imports
  inductor's compiler (its generated module imports it) and takes Triton's kernels from the
  shipped kernel set. Made on a CPU target (where forms are made and used in one process),
  where AOTInductor refuses a graph (the reason is kept in the plan), or with
  ``QKAN_PACK_AOTI=0``.

The bytes hold pickles, Python and native code that torch loads: shipped compiled code,
under the same trust as the model source and shipped kernels.

A model with a graph break, or whose graph reads a tensor the plan cannot name, has no
precompiled form (``PrecompileRefusedError``, with the reason); ``_compiled`` then falls back.

Not owned here: choosing and falling back (``_compiled``), capture (``_capture``), where the
files live in the artifact (``_kernels``), making and loading AOTInductor packages (``_aoti``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..errors import ManifestError, PrecompileRefusedError
from ..format import (
    WHEN_DEFAULT,
    Choice,
    Integer,
    JsonObject,
    ListOf,
    Nested,
    Text,
    json_field,
    loads_strict,
    read_object,
    write_object,
)
from ._aoti import compile_aoti, load_aoti
from ._source import describe
from ._tree import flatten

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

PLAN_SCHEMA = "qkan-pack-precompiled/1"
#: Inductor's autotuning choices (``*.best_config``, by path under its cache directory) ship
#: under this folder beside the graphs: restored into the load's private cache directory,
#: they spare the load re-benchmarking each kernel's configurations.
AUTOTUNE_DIR = "autotune"


#: What a graph input is: a manifest input, the model's parameter or buffer, or a plain tensor
#: attribute of one of its modules.
TENSOR_KINDS = ("input", "state", "attr")
#: How a shape's graph is kept (module docstring): an AOTInductor package, or inductor's
#: ``standalone_compile`` bytes.
FORMS = ("aoti", "inductor")
#: ``QKAN_PACK_AOTI=0`` makes the ``inductor`` form on GPU targets too (an escape hatch, and
#: the baseline of the cold-start benchmark).
AOTI_ENV = "QKAN_PACK_AOTI"


@dataclasses.dataclass(frozen=True)
class TensorRef:
    """One graph input: manifest input ``name`` (kind ``input``, name its position), or the
    model's parameter/buffer (``state``, its qualified name) or plain tensor attribute
    (``attr``: ``module.path:attribute``), with the shape and dtype it must have."""

    kind: str = json_field(Choice(TENSOR_KINDS))
    name: str = json_field(Text())
    shape: tuple[int, ...] = json_field(ListOf(Integer(0)))
    dtype: str = json_field(Text())


@dataclasses.dataclass(frozen=True)
class ShapePlan:
    """How to call one shape's compiled graph: the manifest inputs it is for (``inputs``),
    the graph's inputs (``args``), which of its outputs are the model's output leaves, in
    order, the graph's ``form`` (plans written before forms existed hold ``inductor``'s) and,
    for an ``inductor`` form made for a GPU, why AOTInductor refused the graph."""

    label: str = json_field(Text())
    file: str = json_field(Text())
    inputs: tuple[TensorRef, ...] = json_field(ListOf(Nested(TensorRef)))
    args: tuple[TensorRef, ...] = json_field(ListOf(Nested(TensorRef)))
    outputs: tuple[int, ...] = json_field(ListOf(Integer(0)))
    form: str = json_field(Choice(FORMS), default="inductor", omit=WHEN_DEFAULT)
    aoti_refused: str = json_field(Text(), default="", omit=WHEN_DEFAULT)


def _check_shape_plan(shape: ShapePlan, where: str) -> ShapePlan:
    """The graph is for the manifest's inputs, in order, and every graph input of kind
    ``input`` is one of them."""
    if [ref.name for ref in shape.inputs] != [str(i) for i in range(len(shape.inputs))] \
            or any(ref.kind != "input" for ref in shape.inputs):
        raise ManifestError("must be the manifest's inputs in order (kind input, named 0, 1, "
                            "...)", where=f"{where}.inputs")
    for index, ref in enumerate(shape.args):
        if ref.kind == "input" and not (ref.name.isdigit() and int(ref.name) < len(shape.inputs)):
            raise ManifestError(f"must name one of the {len(shape.inputs)} inputs, got "
                                f"{ref.name!r:.40}", where=f"{where}.args[{index}].name")
    return shape


@dataclasses.dataclass(frozen=True)
class Plan:
    """The forms of one model: the torch that made them, the device they were compiled for
    (inductor's code names its GPU index), the model's config they were traced with (dynamo
    bakes Python-level settings, a solver's name say, into the graph), and one ``ShapePlan``
    per manifest shape. Read and written by the format's declarative JSON, as the manifest
    is (``format.read_object``), with ``schema`` beside the fields."""

    torch: str = json_field(Text())
    device: str = json_field(Text())
    config: Mapping[str, Any] = json_field(JsonObject())
    shapes: tuple[ShapePlan, ...] = json_field(ListOf(Nested(ShapePlan, _check_shape_plan)))

    def describe_forms(self) -> str:
        """Which forms the graphs have, for the load's report: whether inductor's Python
        (and its compiler's imports) runs them, and why."""
        aoti = sum(shape.form == "aoti" for shape in self.shapes)
        if aoti == len(self.shapes):
            return "AOTInductor packages run by torch's C++ loader"
        refused = next((f" (AOTInductor refused {shape.label}: {shape.aoti_refused})"
                        for shape in self.shapes if shape.aoti_refused), "")
        mixed = f"{aoti} AOTInductor, {len(self.shapes) - aoti} " if aoti else ""
        return f"{mixed}run by inductor's Python{refused}"

    def to_json(self) -> bytes:
        return json.dumps({"schema": PLAN_SCHEMA, **write_object(self)}, indent=1,
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Plan:
        """The plan, checked whole before anything is loaded (a malformed one is refused
        here, not when a graph is called); the reader's refusal, naming the JSON path of
        what it refused, is the ``__cause__``."""
        try:
            raw = loads_strict(data)
            schema = raw.get("schema") if isinstance(raw, dict) else raw
            if schema != PLAN_SCHEMA:
                raise ManifestError(f"must be {PLAN_SCHEMA!r}, got {schema!r:.60}",
                                    where="plan.schema")
            return read_object(cls, {k: v for k, v in raw.items() if k != "schema"}, "plan")
        except ManifestError as exc:
            raise PrecompileRefusedError(f"the precompiled plan is unreadable ({exc}); re-run "
                                    "`qkan-pack warm --compiled` on this kind of host") from exc


def _input_refs(inputs: Sequence[torch.Tensor]) -> tuple[TensorRef, ...]:
    return tuple(TensorRef(kind="input", name=str(i), shape=tuple(t.shape), dtype=_dtype_text(t))
                 for i, t in enumerate(inputs))


def _dtype_text(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def model_tensors(model: torch.nn.Module) -> dict[int, tuple[str, str]]:
    """Every tensor the model holds, by identity: parameters and buffers (``state``) and
    plain tensor attributes of its modules (``attr``)."""
    found: dict[int, tuple[str, str]] = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        found.setdefault(id(tensor), ("state", name))
    for name, buffer in model.named_buffers(remove_duplicate=False):
        found.setdefault(id(buffer), ("state", name))
    for path, module in model.named_modules(remove_duplicate=False):
        for attribute, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                found.setdefault(id(value), ("attr", f"{path}:{attribute}"))
    return found


def resolve(model: torch.nn.Module, ref: TensorRef) -> torch.Tensor:
    """The model's tensor ``ref`` names, checked against the plan's shape and dtype."""
    tensor: object
    try:
        if ref.kind == "state":
            tensor = model.get_parameter(ref.name) if _is_parameter(model, ref.name) \
                else model.get_buffer(ref.name)
        elif ref.kind == "attr":
            path, _, attribute = ref.name.partition(":")
            tensor = vars(model.get_submodule(path))[attribute]
        else:
            raise PrecompileRefusedError(f"unknown tensor kind {ref.kind!r} in the plan")
    except (AttributeError, KeyError) as exc:
        raise PrecompileRefusedError(f"the model has no {ref.kind} {ref.name!r} the precompiled "
                                f"graph reads ({exc})") from None
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != ref.shape \
            or _dtype_text(tensor) != ref.dtype:
        got = (f"{tuple(tensor.shape)} {_dtype_text(tensor)}" if isinstance(tensor, torch.Tensor)
               else type(tensor).__name__)
        raise PrecompileRefusedError(f"{ref.kind} {ref.name!r} is {got} here, but the precompiled "
                                f"graph was made for {ref.shape} {ref.dtype}")
    return tensor


def _is_parameter(model: torch.nn.Module, name: str) -> bool:
    path, _, leaf = name.rpartition(".")
    return leaf in model.get_submodule(path)._parameters


def trace_graph(model: torch.nn.Module, forward: Callable[..., Any],
                inputs: Sequence[torch.Tensor]) -> tuple[torch.fx.GraphModule, list[Any], ShapePlan]:
    """Dynamo's whole-forward graph at these inputs, its example inputs and the plan (file
    left empty). Refused when the forward breaks the graph or the graph reads a tensor
    that is neither an input nor the model's."""
    import torch._dynamo

    # dynamo's caches are process-wide: cleared before and after, so that each shape traces
    # afresh (no recompile limit across shapes) and nothing of ours stays attached to the
    # model's code (a ``compiled="on"`` load clears a host's other compiled code too)
    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []
    returned: list[Any] = []

    def keep_graph(gm: torch.fx.GraphModule, example: list[Any]) -> Callable[..., Any]:
        graphs.append((gm, list(example)))

        def run(*args: Any) -> Any:
            result = gm.forward(*args)
            returned.append(result)
            return result
        return run

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            output = torch.compile(forward, backend=keep_graph, fullgraph=True,
                                   dynamic=False)(*inputs)
    except Exception as exc:  # a graph break or an op dynamo cannot trace
        raise PrecompileRefusedError(f"dynamo cannot capture the whole forward in one graph "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]})") from exc
    finally:
        torch._dynamo.reset()
    if len(graphs) != 1 or len(returned) != 1:
        raise PrecompileRefusedError(f"dynamo made {len(graphs)} graphs of the forward, not one")
    gm, example = graphs[0]
    args = _graph_inputs(model, inputs, example)
    outputs = _graph_outputs(flatten(output), returned[0])
    return gm, example, ShapePlan(label="", file="", inputs=_input_refs(inputs), args=args,
                                  outputs=outputs)


def _graph_inputs(model: torch.nn.Module, inputs: Sequence[torch.Tensor],
                  example: Sequence[Any]) -> tuple[TensorRef, ...]:
    own = model_tensors(model)
    positions = {id(t): i for i, t in enumerate(inputs)}
    refs = []
    for value in example:
        if not isinstance(value, torch.Tensor):
            raise PrecompileRefusedError(f"the graph takes a {type(value).__name__}, not a tensor")
        if id(value) in positions:
            kind, name = "input", str(positions[id(value)])
        elif id(value) in own:
            kind, name = own[id(value)]
        else:
            raise PrecompileRefusedError(
                f"the graph reads a {tuple(value.shape)} tensor that is neither an input nor a "
                "parameter, buffer or tensor attribute of the model's modules")
        refs.append(TensorRef(kind=kind, name=name, shape=tuple(value.shape),
                              dtype=_dtype_text(value)))
    return tuple(refs)


def _graph_outputs(leaves: Sequence[torch.Tensor], returned: Sequence[Any]) -> tuple[int, ...]:
    indices = []
    for leaf in leaves:
        index = next((i for i, t in enumerate(returned) if t is leaf), None)
        if index is None:
            raise PrecompileRefusedError("an output of the forward is not an output of its graph "
                                    "(an input or constant returned as is)")
        indices.append(index)
    return tuple(indices)


class CompiledGraph(NamedTuple):
    """One shape's graph as made: its form, its bytes, why AOTInductor refused it (empty if
    it did not, or was not asked) and its callable here."""

    form: str
    data: bytes
    aoti_refused: str
    call: Callable[..., Any]


def compile_graph(gm: torch.fx.GraphModule, example: list[Any], device: str) -> CompiledGraph:
    """One traced graph compiled for ``device`` and loaded: AOTInductor's form where
    ``makes_aoti``, else (or where export or AOTInductor refuse the graph, or ``_aoti``
    refuses its package, or it does not load) inductor's, with the reason."""
    refused = ""
    if makes_aoti(torch.device(device)):
        try:
            data, call = compile_aoti(gm, example, device)
            return CompiledGraph("aoti", data, "", call)
        except Exception as exc:  # export or AOTInductor refuse the graph, or _aoti its package
            refused = (exc.reason if isinstance(exc, PrecompileRefusedError)
                       else describe(exc))[:300]
    data = compile_inductor(gm, example)
    return CompiledGraph("inductor", data, refused, _callable(data))


def compile_inductor(gm: torch.fx.GraphModule, example: list[Any]) -> bytes:
    """Inductor's code for one traced graph, as the bytes ``CompiledArtifact.save`` writes
    (its ``aot`` form: the compiled module bundled, not a cache key to look up)."""
    from torch._inductor import standalone_compile

    with torch.no_grad():
        artifact = standalone_compile(gm, example, dynamic_shapes="from_example_inputs", aot=True)
    with tempfile.TemporaryDirectory(prefix="qkan-pack-precompile-") as scratch:
        path = os.path.join(scratch, "graph.bin")
        artifact.save(path=path, format="binary")
        with open(path, "rb") as handle:
            return handle.read()


def makes_aoti(device: torch.device) -> bool:
    """Whether forms made for ``device`` are AOTInductor's: on GPU targets, where forms ship
    and a cold start pays for inductor's imports, unless ``QKAN_PACK_AOTI=0``. On a CPU,
    forms are made and used in one process, where AOTInductor's longer C++ compile buys
    nothing."""
    return device.type == "cuda" and os.environ.get(AOTI_ENV) != "0"


def precompile(model: torch.nn.Module, forward: Callable[..., Any],
               samples: Sequence[tuple[str, list[torch.Tensor]]], config: Mapping[str, Any],
               target: torch.device) -> tuple[Plan, dict[str, bytes], PrecompiledForward]:
    """Trace and compile every shape of the model built with ``config`` for ``target`` (the
    load's resolved device, as ``load_precompiled`` checks it, whatever device a sample's
    inputs are on): the plan, the graph files by name (``<index>.pt2`` or ``<index>.bin``, by
    form) and the forward that calls them."""
    shapes: list[ShapePlan] = []
    files: dict[str, bytes] = {}
    graphs: list[Callable[..., Any]] = []
    device = str(target)
    for index, (label, inputs) in enumerate(samples):
        gm, example, shape = trace_graph(model, forward, inputs)
        made = compile_graph(gm, example, device)
        name = f"{index}.{'pt2' if made.form == 'aoti' else 'bin'}"
        files[name] = made.data
        shapes.append(dataclasses.replace(shape, label=label, file=name, form=made.form,
                                          aoti_refused=made.aoti_refused))
        graphs.append(made.call)
    plan = Plan(torch=torch.__version__, device=device, config=dict(config), shapes=tuple(shapes))
    return plan, files, PrecompiledForward(model, plan, graphs)


def autotune_results(cache_dir: str | os.PathLike[str]) -> dict[str, bytes]:
    """The autotuning choices inductor recorded in ``cache_dir`` (the load's private one,
    after every shape ran once), named as they ship (``AUTOTUNE_DIR/<path>``)."""
    root = Path(cache_dir)
    return {f"{AUTOTUNE_DIR}/{path.relative_to(root).as_posix()}": path.read_bytes()
            for path in sorted(root.rglob("*.best_config"))}


def restore_autotune(files: Mapping[str, bytes], cache_dir: str | os.PathLike[str]) -> int:
    """Write shipped autotuning choices into ``cache_dir``; how many. A path that would leave
    it is refused."""
    prefix, count = AUTOTUNE_DIR + "/", 0
    for name, data in files.items():
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix):].split("/")
        if any(p in ("", ".", "..") or "\\" in p for p in parts) or not parts[-1].endswith(
                ".best_config"):
            raise PrecompileRefusedError(f"shipped autotuning file {name!r} is not a plain path "
                                    "inside the cache")
        destination = Path(cache_dir, *parts)
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(data)
        count += 1
    return count


def load_precompiled(model: torch.nn.Module, plan_bytes: bytes, files: Mapping[str, bytes],
                     labels: Sequence[str], device: torch.device,
                     config: Mapping[str, Any]) -> PrecompiledForward:
    """The forward for shipped forms: one per manifest shape (``labels``, in order), made for
    ``device`` and the model built with ``config``. Shipped
    autotuning choices are restored into inductor's cache directory first
    (``TORCHINDUCTOR_CACHE_DIR``: the caller's private one)."""
    plan = _read_plan(plan_bytes)
    if plan.torch != torch.__version__:
        raise PrecompileRefusedError(f"made with torch {plan.torch}, this is {torch.__version__}")
    if json.dumps(plan.config, sort_keys=True) != json.dumps(dict(config), sort_keys=True):
        raise PrecompileRefusedError(f"traced with config {json.dumps(plan.config, sort_keys=True)}, "
                                f"this load's is {json.dumps(dict(config), sort_keys=True)} "
                                "(dynamo bakes it into the graph)")
    if plan.device != str(device):
        raise PrecompileRefusedError(f"compiled for {plan.device} (inductor's code names the GPU "
                                f"index), loading on {device}: warm with --device {device}")
    if [s.label for s in plan.shapes] != list(labels):
        raise PrecompileRefusedError(f"made for shapes {[s.label for s in plan.shapes]}, the "
                                f"manifest declares {list(labels)}")
    cache_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache_dir:
        restore_autotune(files, cache_dir)
    graphs = []
    for shape in plan.shapes:
        if shape.file not in files:
            raise PrecompileRefusedError(f"the plan names {shape.file}, which is not shipped")
        graphs.append(load_graph(shape, files[shape.file], plan.device))
    return PrecompiledForward(model, plan, graphs)


def all_aoti(plan_bytes: bytes) -> bool:
    """Whether a shipped plan gives every shape AOTInductor's form (refused, as
    ``Plan.from_json`` refuses, where it cannot be read)."""
    shapes = _read_plan(plan_bytes).shapes
    return bool(shapes) and all(shape.form == "aoti" for shape in shapes)


@functools.lru_cache(maxsize=2)
def _read_plan(plan_bytes: bytes) -> Plan:
    """``Plan.from_json``, once per shipped plan: a default GPU load asks ``all_aoti`` before
    ``load_precompiled`` reads the same bytes, and reading and checking a plan of 8 shapes
    takes milliseconds. A refusal is not kept (each call refuses again); a ``Plan`` is
    frozen, so the two share it safely."""
    return Plan.from_json(plan_bytes)


def load_graph(shape: ShapePlan, data: bytes, device: str) -> Callable[..., Any]:
    """The callable of one shape's graph in its form, made for ``device``."""
    return load_aoti(data, device) if shape.form == "aoti" else _callable(data)


def _callable(data: bytes) -> Callable[..., Any]:
    """Inductor's compiled graph from saved bytes (``CompiledArtifact.load`` reads a path)."""
    from torch._inductor import CompiledArtifact

    with tempfile.TemporaryDirectory(prefix="qkan-pack-precompiled-") as scratch:
        path = os.path.join(scratch, "graph.bin")
        with open(path, "wb") as handle:
            handle.write(data)
        try:
            return CompiledArtifact.load(path=path, format="binary")
        except Exception as exc:  # another torch's bytes, or corrupt ones
            raise PrecompileRefusedError(f"this torch cannot load the precompiled graph "
                                    f"({type(exc).__name__}: {exc})") from exc


class PrecompiledForward:
    """Calls the compiled graph of the inputs' shape with the model's own tensors, and
    returns the output leaves (the runtime flattens outputs anyway). The model's tensors
    are resolved once, here: they must stay the same objects, as for any captured graph."""

    def __init__(self, model: torch.nn.Module, plan: Plan,
                 graphs: Sequence[Callable[..., Any]]) -> None:
        self.plan = plan
        self._by_shape: dict[_Key, tuple[Callable[..., Any], list[Any], ShapePlan]] = {}
        for shape, graph in zip(plan.shapes, graphs):
            fixed: list[Any] = [None if ref.kind == "input" else resolve(model, ref)
                                for ref in shape.args]
            self._by_shape[_key(shape.inputs)] = (graph, fixed, shape)

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        key = _key(_input_refs(inputs))
        try:
            graph, fixed, shape = self._by_shape[key]
        except KeyError:
            raise PrecompileRefusedError(f"no precompiled graph for inputs {key}") from None
        args = [inputs[int(ref.name)] if value is None else value
                for ref, value in zip(shape.args, fixed)]
        with torch.no_grad():
            returned = graph(*args)
        return [returned[i] for i in shape.outputs]


#: Which graph a call takes: each input's shape and dtype.
_Key = tuple[tuple[tuple[int, ...], str], ...]


def _key(inputs: Sequence[TensorRef]) -> _Key:
    return tuple((ref.shape, ref.dtype) for ref in inputs)
