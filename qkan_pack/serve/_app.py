"""Serve an artifact on Ray Serve: one ``Predictor`` per replica, rows batched into captured shapes.

    from ray import serve
    from qkan_pack.serve import build_app

    handle = serve.run(build_app("artifacts/qkan_mlp"))   # returns once every replica is ready
    handle.predict.remote(np.zeros((1, 2), np.float32)).result()

Each replica loads one ``Predictor`` in its constructor (``cuda`` where the replica was given a
GPU, else ``cpu``) and captures every graph there, so Ray Serve reports it ready only after
capture: no request pays for it. ``check_health`` fails once a replay hit a device error, and
Ray replaces the replica.

Requests, for an artifact of shapes ``1x2,64x2`` (its *row* is ``[2]``):

- a **single-row** request is one row, unbatched (``[2]``) or as a batch of one (``1x2``).
  Concurrent rows are gathered by ``@serve.batch`` (up to ``max_batch_size``, waiting at most
  ``max_batch_wait_ms``), stacked, zero-padded to the smallest captured batch that holds them
  (5 rows replay ``64x2``), replayed once and split back; each reply keeps its request's form.
- a **multi-row** request passes through unbatched when its shape is a manifest shape (``64x2``).
- anything else (``3x2``, ``[5]``) is rejected (``InputError``; HTTP 422) naming the accepted
  shapes. Rows exist only for shapes whose inputs and outputs all lead with the batch dimension
  (the ``Predictor(pad_batch=True)`` rule); other shapes must be sent exactly.

HTTP (under the route prefix):

- ``GET /`` the artifact: inputs, shapes, dtypes, capture policy, digest, batching, replica.
- ``GET /stats`` this replica's counters (replays per captured shape, rows per replay);
  ``GET /stats?reset=1`` zeroes them.
- ``POST /`` ``{"inputs": T | {"name": T, ...}, "encoding": "list" | "base64"}`` where ``T`` is
  nested lists of numbers or ``{"b64": ..., "dtype": "float32", "shape": [1, 2]}`` (little
  endian). Reply ``{"outputs": ...}``: the model's output structure, each tensor as nested
  lists (non-finite floats as ``NaN``/``Infinity``) or, with ``"encoding": "base64"``, as the
  same ``b64`` object. Errors reply ``{"error": ...}``: 400 malformed body, 413 body over
  ``max_body_bytes``, 422 wrong dtype/shape/names (with ``"accepted"``), 404/405 bad route.

Ray is imported only where a deployment is built or run: ``import qkan_pack`` stays cheap.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InputError, MalformedRequestError
from ..format import Manifest, Shape, Signature, format_shape, padding_table
from ._wire import (
    Given,
    encode_outputs,
    fit,
    given_from_python,
    is_tensor,
    parse_request,
    torch_module,
)

if TYPE_CHECKING:
    import torch
    from ray.serve import Application
    from starlette.requests import Request
    from starlette.responses import Response

    from ..runtime import Predictor

DEFAULT_MAX_BODY_BYTES = 8 * 2**20
APP_NAME = "qkan-pack"

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------
# Rows and routes (torch-free)
# ---------------------------------------------------------------------------

Tail = tuple[Shape, ...]


def row_plan(manifest: Manifest) -> dict[Tail, list[tuple[int, str]]]:
    """Row shape (non-batch dims per input) -> [(captured batch, shape label)] ascending
    (the predictor's padding rule: ``spec.padding_table``)."""
    return {tail: [(batch, manifest.shapes[index].label) for batch, index in rows]
            for tail, rows in padding_table(manifest).items()}


@dataclass(frozen=True)
class Route:
    """How one request is served: as a row (``tail`` set) or passed through unbatched."""

    tail: Tail | None
    squeezed: bool = False


def route(shapes: Tail, plan: Mapping[Tail, Any], exact: Mapping[Tail, str]) -> Route | None:
    """A single row (unbatched or a batch of one) is batched; a manifest shape passes
    through; anything else has no route (None)."""
    if shapes in plan:
        return Route(shapes, squeezed=True)
    if shapes and all(len(s) >= 1 and s[0] == 1 for s in shapes):
        tail = tuple(tuple(s[1:]) for s in shapes)
        if tail in plan:
            return Route(tail)
    if shapes in exact:
        return Route(None)
    return None


def captured_batch(sizes: Sequence[tuple[int, str]], rows: int) -> tuple[int, str]:
    """The smallest captured batch holding ``rows`` (the one ``pad_batch`` replays)."""
    for batch, label in sizes:
        if rows <= batch:
            return batch, label
    raise InputError(f"{rows} rows exceed the largest captured batch {sizes[-1][0]}")


def describe_artifact(manifest: Manifest, digest: str,
                      plan: Mapping[Tail, list[tuple[int, str]]]) -> dict[str, Any]:
    """The artifact as ``GET /`` shows it (no file list, no weights)."""
    return {
        "digest": digest,
        "format": f"{manifest.format_name} v{manifest.format_version}",
        "model": {"source": manifest.model.source, "entry": manifest.model.entry,
                  "config": dict(manifest.model.config), "parameters": manifest.model.parameters},
        "inputs": [{"name": d.name, "dtype": d.dtype} for d in manifest.inputs],
        "shapes": [{"inputs": {n: list(s) for n, s in e.inputs}, "outputs": e.outputs.label}
                   for e in manifest.shapes],
        "accepted": [signature_text(s) for s in manifest.signatures()],
        "rows": [{"row": {n: list(t) for (n, _), t in zip(manifest.shapes[0].inputs, tail)},
                  "captured_batches": [b for b, _ in sizes]} for tail, sizes in plan.items()],
        "capture_policy": manifest.capture.policy,
        "created": manifest.created,
    }


def signature_text(signature: Signature) -> str:
    """One accepted signature for a JSON reply: ``x 1x2 float32`` (comma-joined per input)."""
    return ", ".join(f"{n} {format_shape(s)} {d}" for n, (s, d) in signature.items())


# ---------------------------------------------------------------------------
# The deployment
# ---------------------------------------------------------------------------


@dataclass
class _Row:
    tensors: list[torch.Tensor]
    tail: Tail


class ArtifactServer:
    """Ray Serve replica body: one ``Predictor``, batched rows, the HTTP API, handle methods.

    Wrap with ``build_app`` (which sets the deployment options); the class stays importable
    without Ray so that replicas pickle it by reference.
    """

    def __init__(self, path: str, *, digest: str | None = None, device: str = "auto",
                 max_batch_size: int | None = None, max_batch_wait_ms: float = 2.0,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 predictor_options: Mapping[str, Any] | None = None) -> None:
        from ray import serve

        from ..runtime import Predictor

        self.predictor: Predictor = Predictor.load(path, device, expected_digest=digest,
                                                   pad_batch=True, progress=False,
                                                   **dict(predictor_options or {}))
        manifest = self.predictor.manifest
        self._names = manifest.input_names
        self._dtypes = tuple(d.dtype for d in manifest.inputs)
        self._plan = row_plan(manifest)
        self._exact = {tuple(s for _, s in e.inputs): e.label for e in manifest.shapes}
        self._row_labels = [label for sizes in self._plan.values() for _, label in sizes]
        self._accepted = manifest.signatures()
        largest = max((b for sizes in self._plan.values() for b, _ in sizes), default=1)
        self.max_batch_size = max_batch_size or largest
        self.max_body_bytes = max_body_bytes
        self._batched = serve.batch(max_batch_size=self.max_batch_size,
                                    batch_wait_timeout_s=max_batch_wait_ms / 1000)(self._run_rows)
        self._description = describe_artifact(manifest, self.predictor.digest, self._plan)
        self._description["serving"] = {
            "max_batch_size": self.max_batch_size, "max_batch_wait_ms": max_batch_wait_ms,
            "max_body_bytes": max_body_bytes,
        }
        self._replica = {"id": _replica_id(), "pid": os.getpid(),
                         "device": str(self.predictor.device),
                         "load_to_ready_seconds": round(self.predictor.report.load_to_ready_seconds, 3),
                         "captured": [r.label for r in self.predictor.report.shapes],
                         "ready_at": time.time()}
        self._fault: str | None = None
        self._stats_lock = threading.Lock()
        self._stats = _new_stats()

    # -- Python handle -----------------------------------------------------------------

    async def predict(self, *inputs: Any, **named: Any) -> Any:
        """Outputs for one request (batched when it is a single row); numpy in, numpy out."""
        given = self._given(inputs, named)
        as_numpy = not any(is_tensor(g.array) for g in given.values())
        outputs = await self._infer(given)
        if as_numpy:
            return map_leaves(lambda t: t.numpy(), outputs)
        return outputs

    def describe(self) -> dict[str, Any]:
        """The artifact and this replica, as ``GET /`` returns them."""
        return {**self._description, "replica": dict(self._replica)}

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """This replica's counters (``reset`` zeroes them after reading)."""
        with self._stats_lock:
            snapshot = _stats_view(self._stats, self._row_labels)
            if reset:
                self._stats = _new_stats()
        return {"replica": self._replica["id"], "device": self._replica["device"], **snapshot}

    def check_health(self) -> None:
        """Ray Serve's health probe: unhealthy after a device error in a replay (Ray then
        replaces the replica); on CUDA it also syncs the device, which surfaces a dead context."""
        if self._fault is not None:
            raise RuntimeError(f"replica is unhealthy after a device error: {self._fault}")
        if self.predictor.device.type == "cuda":
            torch_module().cuda.synchronize(self.predictor.device)

    # -- HTTP --------------------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.removeprefix(request.scope.get("root_path", "")).rstrip("/")
        if path == "" and request.method == "POST":
            return await self._http_predict(request)
        if path == "" and request.method in ("GET", "HEAD"):
            return _json(200, self.describe())
        if path == "/stats" and request.method == "GET":
            return _json(200, self.stats(reset=request.query_params.get("reset") in ("1", "true")))
        if path in ("", "/stats"):
            return _json(405, {"error": f"{request.method} is not allowed on {path or '/'}"})
        return _json(404, {"error": f"no route {path!r}; use GET /, POST /, GET /stats"})

    async def _http_predict(self, request: Request) -> Response:
        body = await _read_limited(request, self.max_body_bytes)
        if body is None:
            return _json(413, {"error": f"request body exceeds {self.max_body_bytes} bytes; send "
                               "fewer rows per request or base64 buffers"})
        try:
            given, encoding = parse_request(body, self._names)
            outputs = encode_outputs(await self._infer(given), encoding)
        except MalformedRequestError as exc:
            return _json(400, {"error": str(exc)})
        except InputError as exc:
            return _json(422, {"error": str(exc), "accepted": self._description["accepted"]})
        except Exception as exc:
            logger.exception("request failed")
            return _json(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})
        return _json(200, {"outputs": outputs})

    # -- shared path -------------------------------------------------------------------

    def _given(self, inputs: tuple, named: Mapping[str, Any]) -> dict[str, Given]:
        if len(inputs) > len(self._names):
            raise InputError(f"expected {len(self._names)} input(s) {list(self._names)}, "
                             f"got {len(inputs)}", accepted=self._accepted)
        given = {n: given_from_python(v, f"input {n!r}") for n, v in zip(self._names, inputs)}
        clash = sorted(set(given) & set(named))
        if clash:
            raise InputError(f"input(s) {clash} given both by position and by name")
        given.update({n: given_from_python(v, f"input {n!r}") for n, v in named.items()})
        return given

    async def _infer(self, given: Mapping[str, Given]) -> Any:
        try:
            tensors = self._fit(given)
            shapes = tuple(tuple(t.shape) for t in tensors)
            way = route(shapes, self._plan, self._exact)
            if way is None:
                shown = ", ".join(format_shape(s) or "scalar" for s in shapes)
                rows = "; ".join(_row_forms(tail, self._names) for tail in self._plan)
                hint = f", and single rows ({rows}), which are batched" if rows else ""
                raise InputError(f"input shape {shown} is not accepted{hint}",
                                 accepted=self._accepted)
        except InputError:
            self._count("rejected")
            raise
        if way.tail is None:
            self._count("direct", self._exact[shapes])
            return await asyncio.to_thread(self._replay, tensors)
        if way.squeezed:
            tensors = [t.unsqueeze(0) for t in tensors]
        self._count("rows")
        out = await self._batched(_Row(tensors, way.tail))
        if isinstance(out, BaseException):
            raise out
        return map_leaves(lambda t: t[0], out) if way.squeezed else out

    def _fit(self, given: Mapping[str, Given]) -> list[torch.Tensor]:
        unknown = sorted(set(given) - set(self._names))
        missing = [n for n in self._names if n not in given]
        if unknown or missing:
            raise InputError(f"inputs must be exactly {list(self._names)}; "
                             f"unknown {unknown}, missing {missing}", accepted=self._accepted)
        return [fit(given[n], n, d, self._accepted) for n, d in zip(self._names, self._dtypes)]

    async def _run_rows(self, rows: list[_Row]) -> list[Any]:
        """``@serve.batch`` body: per row shape, stack into the captured batches, replay, split."""
        results: list[Any] = [None] * len(rows)
        groups: dict[Tail, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(row.tail, []).append(i)
        for tail, members in groups.items():
            sizes = self._plan[tail]
            step = sizes[-1][0]
            for start in range(0, len(members), step):
                chunk = members[start:start + step]
                stacked = [torch_module().cat(parts) for parts in zip(*(rows[i].tensors for i in chunk))]
                try:
                    out = await asyncio.to_thread(self._replay, stacked)
                except Exception as exc:
                    for i in chunk:
                        results[i] = exc
                    continue
                _, label = captured_batch(sizes, len(chunk))
                self._count_replay(label, len(chunk))
                for j, i in enumerate(chunk):
                    results[i] = map_leaves(lambda t, j=j: t[j:j + 1].clone(), out)
        return results

    def _replay(self, tensors: Sequence[torch.Tensor]) -> Any:
        try:
            return self.predictor(*tensors)
        except InputError:
            raise
        except Exception as exc:
            if self.predictor.device.type == "cuda":
                self._fault = f"{type(exc).__name__}: {exc}"
            raise

    def _count(self, key: str, shape: str | None = None) -> None:
        with self._stats_lock:
            self._stats["requests"][key] += 1
            if shape is not None:
                self._stats["direct_shapes"][shape] += 1

    def _count_replay(self, label: str, rows: int) -> None:
        with self._stats_lock:
            self._stats["replays"][label] += 1
            self._stats["rows_per_replay"][rows] += 1


def _new_stats() -> dict[str, Counter]:
    return {"requests": Counter(), "replays": Counter(), "rows_per_replay": Counter(),
            "direct_shapes": Counter(), "since": time.time()}  # type: ignore[dict-item]


def _stats_view(stats: Mapping[str, Any], labels: Sequence[str]) -> dict[str, Any]:
    rows = stats["rows_per_replay"]
    return {
        "requests": {k: stats["requests"].get(k, 0) for k in ("rows", "direct", "rejected")},
        "replays": {label: stats["replays"].get(label, 0) for label in labels},
        "rows_per_replay": {str(k): v for k, v in sorted(rows.items())},
        "rows_replayed": sum(k * v for k, v in rows.items()),
        "direct_shapes": dict(stats["direct_shapes"]),
        "seconds": round(time.time() - stats["since"], 3),
    }


def _row_forms(tail: Tail, names: Sequence[str]) -> str:
    """How a single row may be sent: ``[2] or 1x2`` (per input when there are several)."""
    def forms(t: Shape) -> str:
        return f"[{', '.join(map(str, t))}] or {format_shape((1, *t))}"

    if len(tail) == 1:
        return forms(tail[0])
    return ", ".join(f"{n} {forms(t)}" for n, t in zip(names, tail))


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """The runtime's output walker (imported on first use: this module loads without torch)."""
    from ..runtime import map_leaves as walk

    return walk(fn, tree)


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return f"pid-{os.getpid()}"


async def _read_limited(request: Request, limit: int) -> bytes | None:
    """The body, or None once it exceeds ``limit`` bytes (Content-Length or streamed)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _json(status: int, payload: Any) -> Response:
    from starlette.responses import Response

    return Response(json.dumps(payload), status_code=status, media_type="application/json")


# ---------------------------------------------------------------------------
# Building and running
# ---------------------------------------------------------------------------


def build_app(path: str | os.PathLike[str], *, replicas: int = 1, gpus_per_replica: float = 0.0,
              cpus_per_replica: float = 1.0, max_batch_size: int | None = None,
              max_batch_wait_ms: float = 2.0, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              max_ongoing_requests: int | None = None, device: str = "auto",
              predictor_options: Mapping[str, Any] | None = None,
              name: str = "QkanPack") -> Application:
    """A Ray Serve application serving the artifact at ``path`` (verified here first).

    Replicas load the artifact from the same path (share it on every node) and refuse it
    unless its digest is the one verified here. ``gpus_per_replica=1`` gives each replica a
    GPU of its own; fractions pack several replicas onto one GPU.
    """
    from ray import serve

    from ..runtime import read_artifact

    artifact = read_artifact(path)
    if (replicas < 1 or gpus_per_replica < 0 or max_batch_wait_ms < 0 or max_body_bytes < 1
            or (max_batch_size is not None and max_batch_size < 1)):
        raise ValueError("replicas, max_batch_size and max_body_bytes must be >= 1; "
                         "gpus_per_replica and max_batch_wait_ms >= 0")
    largest = max((b for s in row_plan(artifact.manifest).values() for b, _ in s), default=1)
    batch = max_batch_size or largest
    deployment = serve.deployment(
        ArtifactServer, name=name, num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        max_ongoing_requests=max_ongoing_requests or max(64, 2 * batch),
        health_check_period_s=10, health_check_timeout_s=30,
    )
    return deployment.bind(str(artifact.path), digest=artifact.digest, device=device,
                           max_batch_size=batch, max_batch_wait_ms=max_batch_wait_ms,
                           max_body_bytes=max_body_bytes, predictor_options=predictor_options)


def serve_forever(path: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 8000,
                  address: str | None = None, gpus_per_replica: float | None = None,
                  on_ready: Callable[[str, Mapping[str, Any]], None] | None = None,
                  **options: Any) -> None:
    """Start (or join, with ``address``) Ray, deploy, call ``on_ready(url, description)``,
    then block until Ctrl-C; stop the app (and a Ray started here) on the way out.

    ``gpus_per_replica=None`` takes one GPU per replica when the cluster has GPUs, else none.
    """
    import ray
    from ray import serve

    from ..runtime import read_artifact

    read_artifact(path)  # fail on a bad artifact before starting Ray
    local = address is None and "RAY_ADDRESS" not in os.environ
    ray.init(address=address, include_dashboard=False if local else None,
             logging_level=logging.WARNING)
    try:
        if gpus_per_replica is None:
            gpus_per_replica = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
        serve.start(http_options={"host": host, "port": port})
        app = build_app(path, gpus_per_replica=gpus_per_replica, **options)
        handle = serve.run(app, name=APP_NAME, route_prefix="/",
                           logging_config={"enable_access_log": False})
        if on_ready is not None:
            on_ready(f"http://{host}:{port}/", handle.describe.remote().result())
        while True:
            time.sleep(3600)
    finally:
        if local:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
        ray.shutdown()
