"""``qkan-pack warm``: compile an artifact's GPU kernels here and ship them inside it (and
``build --warm``, which warms what it built)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..format import AUTO_PRECISION, precision_choice_to_dict
from ..format import candidate_name as _named
from ._app import cli
from ._options import device_option, json_flag
from ._output import emit, say


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@device_option("cuda or cuda:N.", default="cuda")
@click.option("--compiled", is_flag=True,
              help="Also ship the model compiled by inductor, one graph per shape, loaded "
              "without tracing by Predictor.load(..., compiled='shipped') (a model dynamo "
              "cannot capture whole ships inductor's cache for torch.compile instead).")
@click.option("--precision", type=click.Choice([AUTO_PRECISION]),
              help="auto: first time every precision the build allowed on this device, gated "
              "here against its max error, and record the fastest for this kind of device "
              "(the kernels are then compiled at it). With --device cpu, only this.")
@json_flag("Print one JSON document (path, kernel key, files, bytes, digest, precision "
           "choice) on stdout; messages go to stderr.")
def warm(directory: Path, device: str, compiled: bool, precision: str | None,
         as_json: bool) -> None:
    """Compile the GPU kernels DIRECTORY needs on this host's GPU and ship them inside it.

    A fresh GPU host then loads without compiling anything; one artifact can carry a
    kernel set per GPU architecture + toolchain (warm it once on each kind of host), and
    a precision choice per kind of GPU (--precision auto).
    """
    result = warm_and_report(directory, device, compiled=compiled, precision=precision,
                             as_json=as_json)
    if as_json:
        emit({"path": str(result.path), "key": result.key, "files": result.files,
              "bytes": result.bytes, "digest": result.digest, "compiled": result.compiled,
              "added": list(result.added),
              "precision": None if result.precision is None
              else precision_choice_to_dict(result.precision)})


def warm_and_report(directory: Path, device: str, *, compiled: bool = False,
                    precision: str | None = None, as_json: bool = False) -> Any:
    """``builder.warm``, saying what it does before (it takes minutes) and what it shipped
    after (on stderr with ``--json``)."""
    from ..builder import check_warm_device
    from ..builder import warm as warm_artifact

    if precision is None or device.split(":")[0] != "cpu":
        check_warm_device(device)  # before saying it compiles
    if precision is not None:
        say(f"timing the precisions {directory} allows on {device}…", err=True)
    else:
        say(f"compiling kernels for {directory} on {device} (a fresh process, empty cache)…",
            err=True)
    result = warm_artifact(directory, device, compiled=compiled, precision=precision)
    if result.precision is not None:
        say(_choice_text(result.precision), err=as_json)
    if result.files or precision is None:
        say(f"shipped {result.files} kernel files ({result.bytes / 2**20:.2f} MiB) as "
            f"{result.key} in {result.path}", err=as_json)
    if result.compiled is not None:
        say(f"compiled mode: {result.compiled}", err=as_json)
    if result.added:
        say(f"added {len(result.added)} kernel(s) a fresh load still compiled: "
            f"{', '.join(result.added)}", err=as_json)
    say(f"digest {result.digest}", err=as_json)
    return result


def _choice_text(choice: Any) -> str:
    """A precision choice as lines: the choice, then each precision's (and layout's)
    latency per shape and measured error, then the refused ones."""
    lines = [f"precision {_named(choice.precision, choice.layout)} chosen for {choice.key}"
             + (f"; per shape {', '.join(choice.named_shapes())}" if choice.per_shape else "")]
    figures = choice.figures()
    width = max([5, *(len(_named(*candidate)) for candidate in figures)])
    for candidate, (times, error) in figures.items():
        lines.append(f"  {_named(*candidate):<{width}} " + ", ".join(f"{t:.1f} us" for t in times)
                     + ("" if error is None else
                        "; error " + ", ".join(f"{e:.2g}" for e in error)))
    lines += [f"  {_named(*candidate):<{width}} refused: {why}"
              for candidate, why in choice.refusals().items()]
    return "\n".join(lines)

