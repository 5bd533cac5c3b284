"""``qkan-pack bench``: eager PyTorch, the predictor and the alternatives side by side, or
(``--cold``) fresh processes from launch to their first result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..bench import COLD_VARIANTS, SKIPPABLE
from ..format import PRECISIONS
from ._app import cli
from ._options import device_option, overrides_option
from ._output import emit, say
from ._params import comma_list, parsed

_COLD_OPTIONS = {"runs": "--runs", "cold_variants": "--variants", "keep_caches": "--keep-caches",
                 "profile": "--profile", "bytecode_cache": "--bytecode-cache"}
_SIDE_BY_SIDE_OPTIONS = {"iters": "--iters", "repeats": "--repeats", "warmup": "--warmup",
                         "skip": "--skip", "precisions": "--precision"}


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@device_option("cuda, cuda:N or cpu; auto picks cuda when available.")
@click.option("--iters", default=300, show_default=True, type=click.IntRange(min=1),
              help="Timed calls per variant per repeat.")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(min=1),
              help="Repeat the whole measurement; the spread between repeats shows the noise.")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(min=0),
              help="Untimed calls per variant before timing.")
@click.option("--skip", multiple=True, type=click.Choice(SKIPPABLE),
              help="Leave a variant out (e.g. torch_compile, whose warm-up takes long). Repeatable.")
@overrides_option()
@click.option("--precision", "precisions", callback=parsed(comma_list, missing=()),
              metavar="NAME,...",
              help=f"Also the whole model's graph at each of these precisions "
              f"({', '.join(PRECISIONS)}), side by side: latency, GPU time per call, pool "
              "memory and error against the float32 references (eager on a CPU); for a "
              "model with a 2-D convolution, in the contiguous and channels-last layouts.")
@click.option("--json", "json_path", is_flag=False, flag_value="-", default=None,
              type=click.Path(dir_okay=False, allow_dash=True, path_type=Path), metavar="[FILE]",
              help="Write the full results as JSON to FILE; alone, print them on stdout (the "
              "table then goes to stderr).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of latency per shape per variant here (needs matplotlib).")
@click.option("--cold", is_flag=True,
              help="Instead: process start -> first result in fresh processes (imports, CUDA "
              "init, load stages, first call), caches emptied, repeated --runs times.")
@click.option("--runs", default=5, show_default=True, type=click.IntRange(min=1),
              help="--cold: fresh processes per variant (median and spread are reported).")
@click.option("--variants", "cold_variants", default="predictor", show_default=True,
              callback=parsed(comma_list), metavar="NAME,...",
              help=f"--cold: which loads to time ({', '.join(COLD_VARIANTS)}).")
@click.option("--keep-caches", is_flag=True,
              help="--cold: keep this environment's Triton/inductor/CUDA caches (default: "
              "each process starts with empty ones, as a new host).")
@click.option("--profile", is_flag=True,
              help="--cold: profile one extra run per variant (cProfile of load + first call; "
              "top entries in the table and JSON).")
@click.option("--bytecode-cache", type=click.Path(file_okay=False, path_type=Path),
              help="--cold: compile every importable module into this folder first and start "
              "the processes with PYTHONPYCACHEPREFIX there (a host installed with bytecode, "
              "measured where the packages have no .pyc).")
def bench(directory: Path, device: str, iters: int, repeats: int, warmup: int, skip: tuple,
          overrides: dict, precisions: tuple, json_path: Path | None, plot_path: Path | None,
          cold: bool,
          runs: int, cold_variants: tuple, keep_caches: bool, profile: bool,
          bytecode_cache: Path | None) -> None:
    """Time eager PyTorch, the predictor and the alternatives on DIRECTORY, side by side
    (or, with --cold, fresh processes from launch to their first result)."""
    _refuse_options_of_the_other_mode(cold)
    if cold:
        from ..bench import ColdSettings

        _bench_cold(directory, device, ColdSettings(
            runs=runs, variants=cold_variants, fresh_caches=not keep_caches, profile=profile,
            config_overrides=overrides, bytecode_cache=bytecode_cache), json_path, plot_path)
        return
    from ..bench import BenchSettings, render_table, run_bench, write_json, write_plot

    settings = BenchSettings(iters=iters, repeats=repeats, warmup=warmup, skip=tuple(skip),
                             config_overrides=overrides, precisions=tuple(precisions))
    report = run_bench(directory, device, settings=settings)
    to_stdout = json_path == Path("-")
    click.echo(render_table(report), err=to_stdout)
    if to_stdout:
        emit(report.as_dict())
    elif json_path is not None:
        say(f"wrote {write_json(report, json_path)}")
    if plot_path is not None:
        say(f"wrote {write_plot(report, plot_path)}", err=to_stdout)


def _refuse_options_of_the_other_mode(cold: bool) -> None:
    """An option the chosen mode would ignore is a usage error, not silently dropped."""
    ctx = click.get_current_context()
    other = _SIDE_BY_SIDE_OPTIONS if cold else _COLD_OPTIONS
    given = [flag for name, flag in other.items()
             if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT]
    if given:
        raise click.UsageError(f"{', '.join(given)} only apply "
                               f"{'without' if cold else 'with'} --cold")


def _bench_cold(directory: Path, device: str, settings: Any, json_path: Path | None,
                plot_path: Path | None) -> None:
    """``--cold``: time fresh processes with ``settings`` (``bench.ColdSettings``)."""
    from ..bench import render_cold, run_cold, write_cold_json, write_cold_plot

    report = run_cold(directory, device, settings=settings)
    to_stdout = json_path == Path("-")
    click.echo(render_cold(report), err=to_stdout)
    if to_stdout:
        emit(report)
    elif json_path is not None:
        click.echo(f"wrote {write_cold_json(report, json_path)}")
    if plot_path is not None:
        click.echo(f"wrote {write_cold_plot(report, plot_path)}", err=to_stdout)
