"""``inspect``'s table: the manifest as a person reads it.

Every manifest string is untrusted: each line is made ``visible``, so a control sequence in
a config value, a file name or an output key cannot forge what the table says,
"(integrity verified)" included.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..format import candidate_name, describe_axes, format_shape, geometric_mean
from ._output import visible


def render_manifest(manifest: Any, digest: str, path: str, signature: str = "") -> str:
    """The manifest as a human-readable table; every line made ``visible`` (each manifest
    string is untrusted: a control sequence in a config value, a file name or an output key
    could otherwise forge what the table says, "(integrity verified)" included)."""
    model, producer = manifest.model, manifest.producer
    config = json.dumps(dict(model.config), sort_keys=True) if model.config else "{}"
    meta = manifest.metadata
    lines = [
        f"artifact   {path}",
        f"digest     {digest}   (integrity verified)",
        *([f"name       {meta.name} version {meta.version}"
           + (f", license {meta.license}" if meta.license else "")] if meta.name else []),
        *([f"about      {meta.description}"] if meta.description else []),
        *([f"labels     {', '.join(f'{k}={v}' for k, v in meta.labels.items())}"]
          if meta.labels else []),
        *([f"classes    {_class_labels_text(meta.class_labels)}"] if meta.class_labels else []),
        *([f"signature  {signature}"] if signature else []),
        f"format     {manifest.format_name} v{manifest.format_version}"
        + (f", created {manifest.created}" if manifest.created else "")
        + f"; inputs passed {'by keyword' if manifest.call == 'keyword' else 'positionally'}",
        f"model      {model.source} :: {model.entry}(**{config})",
        f"parameters {model.parameters:,}" + (f"   tied: {list(map(list, model.tied))}"
                                              if model.tied else ""),
        f"capture    {manifest.capture.policy}"
        + (f" ({', '.join(manifest.capture.submodules)})" if manifest.capture.submodules else ""),
        *_precision_lines(manifest.precision),
        "producer   " + ", ".join(f"{k} {v}" for k, v in producer.items() if v),
        "inputs     " + ", ".join(_input_text(d) for d in manifest.inputs),
    ]
    if model.packages:
        lines.append("packages   " + ", ".join(f"{k} {v}" for k, v in model.packages.items()))
    if manifest.padding is not None:
        values = ", ".join(f"{k}={json.dumps(v)}" for k, v in manifest.padding.values.items())
        entries = [[shape for _, shape in e.inputs] for e in manifest.shapes]
        lines.append(f"padded     {values}; calls may be smaller along:")
        lines += [f"             {axis}" for axis in
                  describe_axes(manifest.padding, entries, manifest.input_names)]
    shown = [", ".join(f"{n} {format_shape(s)}" for n, s in e.inputs) for e in manifest.shapes]
    width = max(len("inputs"), *map(len, shown)) + 2
    errors = [_precision_errors_text(entry.precision_error) for entry in manifest.shapes]
    error_width = max(len("precision err"), *map(len, errors)) + 2 if any(errors) else 0
    error_head = f"  {'precision err':<{error_width - 2}}" if error_width else ""
    lines += ["", f"  {'#':>2}  {'inputs':<{width}}{'f32 noise':>9}{error_head}  "
                  f"{'rows':<12}outputs"]
    for index, (inputs, entry, error) in enumerate(zip(shown, manifest.shapes, errors)):
        noise = "-" if entry.noise is None else f"{entry.noise:.2g}"
        shown_error = f"  {error or '-':<{error_width - 2}}" if error_width else ""
        lines.append(f"  {index:>2}  {inputs:<{width}}{noise:>9}{shown_error}  "
                     f"{_rows_text(entry.rows):<12}{entry.outputs.label}")
    lines += [f"  rows of #{index}: {entry.rows.detail}" for index, entry
              in enumerate(manifest.shapes) if entry.rows is not None and entry.rows.detail]
    lines += ["", f"  {'file':<44}{'bytes':>12}  sha256"]
    for name, entry in sorted(manifest.files.items()):
        lines.append(f"  {name:<44}{entry.size:>12,}  {entry.sha256[:16]}…")
    if manifest.kernels:
        lines += ["", "  shipped kernels:"]
        lines += [f"    {k.key}  ({k.directory})" for k in manifest.kernels]
    return "\n".join(visible(line) for line in lines)


def _precision_lines(policy: Any) -> list[str]:
    """The manifest's precision, its bound, the layouts listed, and the choice per kind of
    device (with the layout it captures in where channels-last)."""
    if policy is None:
        return []
    allowed = ", ".join(policy.allowed)
    auto = policy.default == "fp32" and len(policy.allowed) > 1
    head = policy.default
    if auto:
        head = ("fp32 where no choice below names the device" if policy.choices
                else "fp32 until `qkan-pack warm --precision auto` chooses per device")
    lines = [f"precision  {head}; max error {policy.max_error:g} of each output's scale; "
             f"allowed {allowed}" + (f"; layouts {', '.join(policy.layouts)}"
                                     if len(policy.layouts) > 1 else "")]
    for choice in policy.choices:
        timed = ", ".join(
            f"{candidate_name(*candidate)} {geometric_mean(times):.1f} us"
            + (f" err {max(error):.2g}" if error else "")
            for candidate, (times, error) in choice.figures().items())
        per_shape = (f"; per shape {', '.join(choice.named_shapes())}" if choice.per_shape
                     else "")
        lines.append(f"             {choice.key}: "
                     f"{candidate_name(choice.precision, choice.layout)}{per_shape} ({timed})")
        lines += [f"               {candidate_name(*candidate)} refused: {why}"
                  for candidate, why in choice.refusals().items()]
    return lines


def _rows_text(rows: Any) -> str:
    """A shape's row verdict: ``independent`` (serve batches requests into it),
    ``dependent``, or ``-`` (no rows to batch, or built before rows were proved)."""
    if rows is None:
        return "-"
    return "independent" if rows.independent else "dependent"


def _precision_errors_text(errors: Any) -> str:
    """A shape's build-measured errors per reduced precision: ``bf16 0.004, tf32 -``."""
    return ", ".join(f"{p} {'-' if e is None else f'{e:.2g}'}" for p, e in errors.items())


def _class_labels_text(labels: Sequence[str]) -> str:
    shown = ", ".join(f"{i}: {label}" for i, label in enumerate(labels[:8]))
    return shown + (f", … ({len(labels)} in all)" if len(labels) > 8 else "")


def _input_text(decl: Any) -> str:
    text = f"{decl.name}: {decl.dtype}"
    if decl.low is not None:
        text += f" in [{decl.low:g}, {decl.high:g}) ({decl.range_source})"
    return text
