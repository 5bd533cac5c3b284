"""How a request is served, decided from the manifest alone (no torch, no Ray): which shapes
are single *rows* that batch together, which pass through as captured, and what ``GET /``
shows.

A row may replay in an entry of one row, or in a larger entry whose rows build proved
independent (``ShapeEntry.batches_rows``: its row proof), filled up with copies of a row of
its own replay; only such an entry holds rows of several requests. An entry whose rows
depend on each other (or were never proved independent: artifacts from before the proof)
takes only requests of its own exact shape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import InputError
from ..format import (
    Manifest,
    Shape,
    ShapeEntry,
    Signature,
    accepted_ranges,
    entry_batch,
    format_shape,
    manifest_schema,
    metadata_to_dict,
    padding_table,
    shape_fix,
)

Tail = tuple[Shape, ...]


def row_plan(manifest: Manifest) -> dict[Tail, list[tuple[int, str]]]:
    """Row shape (non-batch dims per input) -> [(captured batch, shape label)] ascending, of
    the entries a row may replay in: one row, or rows proved independent. A row shape no
    such entry takes is absent (its rows are refused, or replay padded: ``_ragged``)."""
    plan = {}
    for tail, rows in padding_table(manifest).items():
        usable = [(batch, manifest.shapes[index].label) for batch, index in rows
                  if batch == 1 or manifest.shapes[index].batches_rows]
        if usable:
            plan[tail] = usable
    return plan


def mixes_requests(manifest: Manifest) -> bool:
    """Whether rows of different requests may share a replay: some entry of two rows or
    more was proved row-independent at build."""
    return any(entry.batches_rows for entry in manifest.shapes)


def dependent_rows(manifest: Manifest) -> dict[Tail, list[str]]:
    """Row shape -> the entries of that row shape whose rows were not proved independent,
    each as ``label (why)``: what ``GET /`` and a refused row name."""
    found: dict[Tail, list[str]] = {}
    for entry in manifest.shapes:
        if (entry_batch(entry) or 0) >= 2 and not entry.batches_rows:
            tail = tuple(tuple(shape[1:]) for _, shape in entry.inputs)
            found.setdefault(tail, []).append(f"{entry.label} ({_why_dependent(entry)})")
    return found


def _why_dependent(entry: ShapeEntry) -> str:
    if entry.rows is None:
        return "not proved: built before qkan-pack proved rows independent; rebuild it"
    return entry.rows.detail or "rows depend on each other"


def largest_batch(plan: Mapping[Tail, Sequence[tuple[int, str]]]) -> int:
    """The largest captured batch any row can join (1 when no shape takes rows)."""
    return max((b for sizes in plan.values() for b, _ in sizes), default=1)


class Route(NamedTuple):
    """How one request is served: as a row (``tail`` set) or passed through unbatched."""

    tail: Tail | None
    squeezed: bool = False


def route(shapes: Tail, plan: Mapping[Tail, Any], exact: Mapping[Tail, str]) -> Route | None:
    """A single row (unbatched or a batch of one) is batched; a manifest shape passes
    through; anything else has no route (None). A declared shape that takes no rows (its
    outputs do not follow a batch) always passes through as declared: routed as a row, it
    would replay in another shape and come back sliced."""
    rows = {label for sizes in plan.values() for _, label in sizes}
    if shapes in exact and exact[shapes] not in rows:
        return Route(None)
    if shapes in plan:
        return Route(shapes, squeezed=True)
    if shapes and all(len(s) >= 1 and s[0] == 1 for s in shapes):
        tail = tuple(tuple(s[1:]) for s in shapes)
        if tail in plan:
            return Route(tail)
    if shapes in exact:
        return Route(None)
    return None


def route_table(plan: Mapping[Tail, Any], exact: Mapping[Tail, str]) -> dict[Tail, Route]:
    """``route`` for every shape that has one, decided once: the shapes a request can take
    are few and known from the manifest, and a dict lookup is what a request then pays.
    A shape missing here has no route."""
    candidates = [*plan, *(tuple((1, *t) for t in tail) for tail in plan), *exact]
    table = {shapes: route(shapes, plan, exact) for shapes in candidates}
    return {shapes: way for shapes, way in table.items() if way is not None}


def captured_batch(sizes: Sequence[tuple[int, str]], rows: int) -> tuple[int, str]:
    """The smallest captured batch holding ``rows`` (the one they replay in)."""
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
        "shapes": [{"inputs": {n: list(s) for n, s in e.inputs}, "outputs": e.outputs.label,
                    **({} if e.rows is None else {"rows_independent": e.rows.independent,
                                                  **({"rows_detail": e.rows.detail}
                                                     if e.rows.detail else {})})}
                   for e in manifest.shapes],
        "accepted": [signature_text(s) for s in manifest.signatures()],
        "rows": [{"row": {n: list(t) for (n, _), t in zip(manifest.shapes[0].inputs, tail)},
                  "captured_batches": [b for b, _ in sizes]} for tail, sizes in plan.items()],
        "capture_policy": manifest.capture.policy,
        "metadata": metadata_to_dict(manifest.metadata),
        "schema": manifest_schema(manifest),
        **({"padded": {"values": dict(manifest.padding.values),
                       "ranges": accepted_ranges([[s for _, s in e.inputs] for e in manifest.shapes],
                                                 manifest.input_names,
                                                 [d.dtype for d in manifest.inputs],
                                                 manifest.padding)}}
           if manifest.padding is not None else {}),
        **({"created": manifest.created} if manifest.created else {}),  # format 1 only
    }


def signature_text(signature: Signature) -> str:
    """One accepted signature for a JSON reply: ``x 1x2 float32`` (comma-joined per input)."""
    return ", ".join(f"{n} {format_shape(s)} {d}" for n, (s, d) in signature.items())


def row_forms(tail: Tail, names: Sequence[str]) -> str:
    """How a single row may be sent: ``[2] or 1x2`` (per input when there are several)."""
    def forms(t: Shape) -> str:
        return f"[{', '.join(map(str, t))}] or {format_shape((1, *t))}"

    if len(tail) == 1:
        return forms(tail[0])
    return ", ".join(f"{n} {forms(t)}" for n, t in zip(names, tail))


def unrouted(shapes: Tail, plan: Mapping[Tail, Any], manifest: Manifest,
             dependent: Mapping[Tail, Sequence[str]] | None = None) -> InputError:
    """The 422 for a shape that is neither a row nor a captured shape, ending with the fix
    (``format.shape_fix``); ``dependent`` (``dependent_rows``) says why a single row cannot
    fill a larger entry."""
    shown = ", ".join(format_shape(s) or "scalar" for s in shapes)
    rows = "; ".join(row_forms(tail, manifest.input_names) for tail in plan)
    hint = f", and single rows ({rows}), which are batched" if rows else ""
    tail = tuple(tuple(s[1:]) for s in shapes) if all(s and s[0] == 1 for s in shapes) else ()
    blocked = (dependent or {}).get(shapes) or (dependent or {}).get(tail)
    if blocked:
        hint += (f"; a single row does not fill {', '.join(blocked)}: its rows are not proved "
                 "independent, so it takes only whole batches of its own shape")
    return InputError(f"input shape {shown} is not accepted{hint}",
                      accepted=manifest.signatures(), **shape_fix(manifest, shapes))
