"""The ``qkan-pack`` command line: parse, call the library, map errors to one-line messages.

Exit codes: 0 success, 1 error (one line; ``QKAN_PACK_DEBUG=1`` shows the traceback),
2 usage error. Nothing here imports torch at module level so ``--help`` and ``inspect``
stay instant.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from ._extras import install_hint, missing_module
from ._session import TOKEN_ENV
from ._supported import supported_text
from ._version import __version__
from .bench import COLD_VARIANTS, SKIPPABLE
from .errors import DeviceError, InputError, QkanPackError, ShapeSpecError
from .format import (
    AUTO_PRECISION,
    CAPTURE_POLICIES,
    DEFAULT_MAX_ERROR,
    DEFAULT_VERSION,
    MAX_MAX_ERROR,
    PRECISIONS,
    SIGNATURE_NAME,
    check_dtype,
    check_seed,
    describe_axes,
    format_shape,
    manifest_schema,
    manifest_to_dict,
    pair_inputs,
    parse_batch_sizes,
    parse_config_items,
    parse_input_option,
    parse_range,
    parse_shapes,
    precision_choice_to_dict,
)

DEBUG_ENV = "QKAN_PACK_DEBUG"
#: An extra argument that looks like a shape (``--shapes 1x4 32x4``).
SHAPE_LIKE = re.compile(r"\d+(x\d+)*( \d+(x\d+)*)*\Z")
#: ``ctx.meta`` key: the option that named the device, when it is not ``--device``.
DEVICE_OPTION = "qkan_pack.device_option"
LOAD_PRECISION_HELP = ("Load at this precision (gated here against the artifact's max error) "
                       "instead of the one it records for this device.")


class _Group(click.Group):
    """Maps every library error to ``Error: <message>`` and exit 1 (the one mapping)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            extra = re.search(r"unexpected extra arguments? \((.*)\)", exc.message)
            if extra and SHAPE_LIKE.match(extra.group(1)):
                exc.message += ("; shapes are joined by commas, without spaces: "
                                "--shapes 1x4,32x4")
            raise
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        except DeviceError as exc:  # name the option the user typed
            flag = ctx.meta.get(DEVICE_OPTION, "--device")
            option = f"{flag} {exc.requested}"
            hint = f"; use {flag} {exc.suggestion}" if exc.suggestion else ""
            if exc.usage:
                raise click.BadParameter(f"{exc.requested!r}: {exc.problem}",
                                         param_hint=flag) from None
            _fail(DeviceError(requested=exc.requested, problem=exc.problem), known=True,
                  text=f"{option}: {exc.problem}{hint}")
        except ShapeSpecError as exc:  # text the user typed: a usage error wherever it is found
            raise click.UsageError(str(exc), ctx) from None
        except QkanPackError as exc:
            _fail(exc, known=True)
        except ModuleNotFoundError as exc:  # an optional library this command needs
            module = missing_module(exc) or str(exc)
            _fail(exc, known=True, text=f"this needs {module}, which is not installed: "
                                        f"{install_hint(module)}")
        except OSError as exc:  # read-only file system, permissions: the path and the reason
            _fail(_os_error(exc), known=True)
        except Exception as exc:
            _fail(exc, known=False)


def _os_error(exc: OSError) -> QkanPackError:
    where = exc.filename if exc.filename is not None else "a file"
    return QkanPackError(f"cannot access {where}: {exc.strerror or exc}")


def _fail(exc: BaseException, *, known: bool, text: str | None = None) -> None:
    if os.environ.get(DEBUG_ENV) == "1":
        raise exc
    message = text or (" ".join(str(exc).split()) if known
                       else f"unexpected {type(exc).__name__}: {exc}")
    _say(f"Error: {message}", err=True)
    if not known:
        click.echo(f"(set {DEBUG_ENV}=1 to see the traceback)", err=True)
    sys.exit(1)


def _visible(text: str) -> str:
    """``text`` with every non-printable character (escape sequences, CR, backspace, BEL,
    bidi overrides, line separators) written as a Python escape (``\\x1b``): a manifest
    string shown to a person cannot move the cursor, recolour or rewrite the screen."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _say(text: str, *, err: bool = False) -> None:
    """Echo text meant for a person, each line made visible (JSON output is echoed as is:
    ``json.dumps`` escapes control characters itself, so it stays exact and safe)."""
    click.echo("\n".join(_visible(line) for line in text.split("\n")), err=err)


def _emit(payload: Any) -> None:
    """The one JSON document a ``--json`` command prints on stdout (exact: json.dumps
    escapes control characters itself)."""
    click.echo(json.dumps(payload, indent=2))


def _usage(param: str, exc: ShapeSpecError) -> click.BadParameter:
    return click.BadParameter(str(exc), param_hint=param)


def _shapes_option(ctx: click.Context, param: click.Parameter, value: str | None) -> list | None:
    if value is None:
        return None
    try:  # --batch-sizes is eager: known here, and makes these per-row shapes
        return parse_shapes(value, per_row=ctx.params.get("batch_sizes") is not None)
    except ShapeSpecError as exc:
        raise _usage("--shapes", exc) from None


def _dtype_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_dtype(value)
    except ShapeSpecError as exc:
        raise _usage("--dtype", exc) from None


def _config_option(ctx: click.Context, param: click.Parameter, value: Sequence[str]) -> dict:
    try:
        return parse_config_items(value)
    except ShapeSpecError as exc:
        raise _usage(f"--{param.name}", exc) from None


def _batch_sizes_option(ctx: click.Context, param: click.Parameter,
                        value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return parse_batch_sizes(value)
    except ShapeSpecError as exc:
        raise _usage("--batch-sizes", exc) from None


def _pads_option(ctx: click.Context, param: click.Parameter,
                 value: Sequence[str]) -> dict[str, Any]:
    """Repeated ``NAME=VALUE``: VALUE as JSON (``0``, ``0.0``, ``true``)."""
    pads: dict[str, Any] = {}
    for item in value:
        name, sep, text = item.partition("=")
        try:
            parsed = json.loads(text) if sep else None
        except ValueError:
            parsed = None
        if not sep or not name.strip().isidentifier() or parsed is None:
            raise click.BadParameter(f"{item!r}: write NAME=VALUE with a number or true/false "
                                     "as VALUE (input_ids=0)", param_hint="--pad")
        if name.strip() in pads:
            raise click.BadParameter(f"{name.strip()!r} is given twice", param_hint="--pad")
        pads[name.strip()] = parsed
    return pads


def _labels_option(ctx: click.Context, param: click.Parameter,
                   value: Sequence[str]) -> dict[str, str]:
    """Repeated ``KEY=VALUE`` labels, kept as text (checked with the rest of the metadata)."""
    labels: dict[str, str] = {}
    for item in value:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: write KEY=VALUE", param_hint="--label")
        if key.strip() in labels:
            raise click.BadParameter(f"label {key.strip()!r} is given twice", param_hint="--label")
        labels[key.strip()] = text
    return labels


def _range_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return parse_range(value)
    except ShapeSpecError as exc:
        raise _usage("--input-range", exc) from None


def _seed_option(ctx: click.Context, param: click.Parameter, value: int) -> int:
    try:
        return check_seed(value)
    except ShapeSpecError as exc:
        raise _usage("--seed", exc) from None


def _list_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def _version_option(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--version``: the ranges are read only when asked (looking the installed releases up
    takes a tenth of a second, which every other command would otherwise pay at start)."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"qkan-pack {__version__}\nsupported releases of the libraries whose internals "
               f"it uses (installed here):\n{supported_text()}")
    ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_version_option,
              help="Show the version, the supported releases of the libraries whose internals "
                   "it uses and those installed, and exit.")
def cli() -> None:
    """Package launch-bound PyTorch models into artifacts served by pre-captured CUDA graphs.

    \b
    qkan-pack build model.py --shapes 1x128,8x128      # write artifacts/model/
    qkan-pack inspect artifacts/model                  # manifest as a table
    qkan-pack verify artifacts/model --device cuda     # integrity, load, self-test
    """


def _input_option(ctx: click.Context, param: click.Parameter, value: Sequence[str]) -> list:
    try:
        per_row = ctx.params.get("batch_sizes") is not None
        return [parse_input_option(item, per_row=per_row) for item in value]
    except ShapeSpecError as exc:
        raise _usage("--input", exc) from None


def _declared_shapes(shapes: list | None, inputs: list, dtype: str | None
                     ) -> tuple[list, str | dict[str, str]]:
    """``--shapes`` (one unnamed input) or ``--input`` options (named inputs, by keyword)."""
    if (shapes is None) == (not inputs):
        raise click.UsageError("give either --shapes (one input) or one --input per named input")
    if shapes is not None:
        return shapes, dtype or "float32"
    try:
        per_shape, dtypes = pair_inputs(inputs)
    except ShapeSpecError as exc:
        raise _usage("--input", exc) from None
    names = [name for name, _, _ in inputs]
    return per_shape, {name: dtypes.get(name, dtype or "float32") for name in names}


@cli.command()
@click.argument("model_py", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--shapes", callback=_shapes_option,
              help="Shapes of the one input (passed to forward positionally), dims joined by x, "
              "shapes by commas: 1x128,8x128.")
@click.option("--input", "inputs", multiple=True, callback=_input_option,
              metavar="NAME:SHAPES[:DTYPE]",
              help="A named input, passed to forward by keyword: input_ids:1x16,8x16:int64. "
              "Repeat per input; shapes pair up by position across inputs.")
@click.option("--batch-sizes", callback=_batch_sizes_option, metavar="N,...", is_eager=True,
              help="Declare every --shapes/--input shape as a per-row shape at each of these "
              "batch sizes: --shapes 128 --batch-sizes 1,8,32 is 1x128,8x128,32x128.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              help="Artifact directory [default: artifacts/<model file stem>].")
@click.option("--dtype", callback=_dtype_option,
              help="Input dtype (int64 for token ids) [default: float32; --input may give "
              "its own].")
@click.option("--entry", default="build_model", show_default=True,
              help="Factory in the model file: build_model(**config) -> nn.Module.")
@click.option("--config", "config", multiple=True, callback=_config_option, metavar="KEY=VALUE",
              help="Factory argument; VALUE parsed as JSON (True, False and None as "
              "Python spells them too), else a string ('\"False\"' for that text). "
              "Repeatable.")
@click.option("--weights", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="safetensors file or torch state dict (read with weights_only=True).")
@click.option("--include", multiple=True, type=click.Path(exists=True, path_type=Path),
              help="Extra local .py file or package directory the model imports. Repeatable.")
@click.option("--capture", type=click.Choice(CAPTURE_POLICIES), default="auto", show_default=True,
              help="Graph capture policy recorded for the GPU runtime.")
@click.option("--submodules", callback=_list_option, metavar="CLASS,...",
              help="Classes to capture under the submodules policy [default: the largest "
              "blocks that capture and replay correctly].")
@click.option("--input-range", callback=_range_option, metavar="LOW,HIGH",
              help="Draw reference inputs uniformly from [LOW, HIGH): floats (rounded to "
              "their dtype), and integers from [int(LOW), int(HIGH)) [default: floats "
              "standard normal; integers from the embedding they index, else [0, 2)].")
@click.option("--seed", default=0, show_default=True, callback=_seed_option,
              help="Seed of the random reference inputs, 0 to 2**63-1 (shape i draws "
              "with SEED+i).")
@click.option("--reference-inputs", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              metavar="FILE", help="Inputs that exercise the model (.npz/.npy/.safetensors, "
              "arrays named after the inputs, x for a single one): used for the declared shapes "
              "they fit, e.g. a detector's real image.")
@click.option("--allow-constant-references", is_flag=True,
              help="Build even if a reference output is empty or all outputs are constant "
              "(the load self-test then proves nothing for them).")
@click.option("--pad", "pads", multiple=True, callback=_pads_option, metavar="NAME=VALUE",
              help="Let calls be smaller than a declared shape along every dimension in which "
              "the declared shapes differ, padding input NAME (x for a single one) with VALUE: "
              "--pad input_ids=0 --pad attention_mask=0. Build proves it leaves the outputs "
              "unchanged, or refuses. Repeatable.")
@click.option("--precision", type=click.Choice([*PRECISIONS, AUTO_PRECISION]), default="fp32",
              show_default=True,
              help="Compute in reduced precision: tf32 (GPU matmuls), bf16 or fp16 (autocast); "
              "weights stay float32. Gated here on the reference (and --calibration) inputs "
              "and at every load on its device. auto: allow every one within --max-error, "
              "serve fp32 until `qkan-pack warm --precision auto` picks the fastest per GPU.")
@click.option("--max-error", type=click.FloatRange(0, MAX_MAX_ERROR, min_open=True),
              metavar="REL", help="The largest difference from the float32 outputs a reduced "
              "precision may make, as a share of each output's scale "
              f"[default: {DEFAULT_MAX_ERROR:g}].")
@click.option("--calibration", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              metavar="FILE", help="More inputs to gate --precision on (.npz/.npy/.safetensors, "
              "arrays named after the inputs, one suffix per sample: input_ids.a, "
              "attention_mask.a), at declared shapes.")
@click.option("--name", help="The model's name (URL-safe) [default: the model file's stem].")
@click.option("--model-version", default=DEFAULT_VERSION, show_default=True,
              help="The model's version (letters, digits, '.', '_', '-').")
@click.option("--description", default="", help="What the model does, in a sentence.")
@click.option("--license", "license_", default="", metavar="SPDX",
              help="The model's license (an SPDX identifier: Apache-2.0, MIT...).")
@click.option("--label", "labels", multiple=True, callback=_labels_option, metavar="KEY=VALUE",
              help="A label recorded in the manifest (team=search). Repeatable.")
@click.option("--force", is_flag=True, help="Replace an existing artifact at the output path.")
@click.option("--warm", "warm_device", is_flag=False, flag_value="cuda", default=None,
              metavar="[DEVICE]", help="Then ship compiled GPU kernels (needs a GPU here; "
              "DEVICE defaults to cuda). See `qkan-pack warm`.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document (path, digest, notes, manifest) on stdout; "
              "messages go to stderr.")
def build(model_py: Path, shapes: list | None, inputs: list, batch_sizes: tuple | None,
          output: Path | None,
          dtype: str | None, entry: str, config: dict, weights: Path | None, include: tuple,
          capture: str, submodules: tuple, input_range: Any, seed: int,
          reference_inputs: Path | None, allow_constant_references: bool, name: str | None,
          pads: dict[str, Any], precision: str, max_error: float | None,
          calibration: Path | None, model_version: str, description: str, license_: str,
          labels: dict[str, str], force: bool, warm_device: str | None, as_json: bool) -> None:
    """Build an artifact from MODEL_PY for the declared input shapes."""
    from .builder import build as build_artifact
    from .builder import check_warm_device

    declared, dtypes = _declared_shapes(shapes, inputs, dtype)
    if warm_device is not None:  # a host that cannot warm fails before the build
        click.get_current_context().meta[DEVICE_OPTION] = "--warm"
        check_warm_device(warm_device)
    with warnings.catch_warnings():  # notes are printed below, once
        warnings.simplefilter("ignore")
        result = build_artifact(model_py, declared, output=output, dtype=dtypes, entry=entry,
                                config=config, weights=weights, includes=include,
                                capture=capture, submodules=submodules,
                                input_range=input_range, seed=seed,
                                reference_inputs=reference_inputs,
                                allow_constant_references=allow_constant_references,
                                name=name, model_version=model_version,
                                description=description, license=license_, labels=labels,
                                batch_sizes=batch_sizes, pad=pads or None,
                                precision=precision, max_error=max_error,
                                calibration=calibration, force=force)
    for note in result.notes:
        _say(f"note: {note}", err=True)
    shown = ", ".join(e.label for e in result.manifest.shapes)
    _say(f"built {result.path} ({shown}; {result.manifest.model.parameters:,} parameters)",
         err=as_json)
    digest, manifest = result.digest, result.manifest
    if warm_device is not None:
        from .runtime import read_artifact

        _warm(result.path, warm_device, as_json=as_json)
        warmed = read_artifact(result.path)  # the manifest now lists the shipped kernels
        digest, manifest = warmed.digest, warmed.manifest
    else:
        _say(f"digest {result.digest}", err=as_json)
    if as_json:
        _emit({"path": str(result.path), "digest": digest, "notes": list(result.notes),
               "manifest": manifest_to_dict(manifest)})


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--device", default="cuda", show_default=True, help="cuda or cuda:N.")
@click.option("--compiled", is_flag=True,
              help="Also ship the model compiled by inductor, one graph per shape, loaded "
              "without tracing by Predictor.load(..., compiled='shipped') (a model dynamo "
              "cannot capture whole ships inductor's cache for torch.compile instead).")
@click.option("--precision", type=click.Choice([AUTO_PRECISION]),
              help="auto: first time every precision the build allowed on this device, gated "
              "here against its max error, and record the fastest for this kind of device "
              "(the kernels are then compiled at it). With --device cpu, only this.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document (path, kernel key, files, bytes, digest, precision "
              "choice) on stdout; messages go to stderr.")
def warm(directory: Path, device: str, compiled: bool, precision: str | None,
         as_json: bool) -> None:
    """Compile the GPU kernels DIRECTORY needs on this host's GPU and ship them inside it.

    A fresh GPU host then loads without compiling anything; one artifact can carry a
    kernel set per GPU architecture + toolchain (warm it once on each kind of host), and
    a precision choice per kind of GPU (--precision auto).
    """
    result = _warm(directory, device, compiled=compiled, precision=precision, as_json=as_json)
    if as_json:
        _emit({"path": str(result.path), "key": result.key, "files": result.files,
               "bytes": result.bytes, "digest": result.digest, "compiled": result.compiled,
               "precision": None if result.precision is None
               else precision_choice_to_dict(result.precision)})


def _warm(directory: Path, device: str, *, compiled: bool = False, precision: str | None = None,
          as_json: bool = False) -> Any:
    from .builder import check_warm_device
    from .builder import warm as warm_artifact

    if precision is None or device.split(":")[0] != "cpu":
        check_warm_device(device)  # before saying it compiles
    if precision is not None:
        _say(f"timing the precisions {directory} allows on {device}…", err=True)
    else:
        _say(f"compiling kernels for {directory} on {device} (a fresh process, empty cache)…",
             err=True)
    result = warm_artifact(directory, device, compiled=compiled, precision=precision)
    if result.precision is not None:
        _say(_choice_text(result.precision), err=as_json)
    if result.files or precision is None:
        _say(f"shipped {result.files} kernel files ({result.bytes / 2**20:.2f} MiB) as "
             f"{result.key} in {result.path}", err=as_json)
    if result.compiled is not None:
        _say(f"compiled mode: {result.compiled}", err=as_json)
    _say(f"digest {result.digest}", err=as_json)
    return result


def _choice_text(choice: Any) -> str:
    """A precision choice as lines: the choice, then each precision's latency per shape and
    measured error, then the refused ones."""
    lines = [f"precision {choice.precision} chosen for {choice.key}"
             + (f"; per shape {', '.join(choice.shapes)}" if choice.shapes else "")]
    for precision, times in choice.latency_us.items():
        error = choice.error.get(precision)
        lines.append(f"  {precision:<5} " + ", ".join(f"{t:.1f} us" for t in times)
                     + ("" if error is None else
                        "; error " + ", ".join(f"{e:.2g}" for e in error)))
    lines += [f"  {precision:<5} refused: {why}" for precision, why in choice.refused.items()]
    return "\n".join(lines)


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--key", "keys", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Also verify the signature with this public key or root certificate "
                   "(PEM). Repeatable: any one of them may have signed.")
def inspect(directory: Path, as_json: bool, keys: tuple[Path, ...]) -> None:
    """Show an artifact's manifest as a table (checks integrity; runs no model code)."""
    from .runtime import read_artifact

    artifact = read_artifact(directory, trusted_keys=keys)
    if as_json:
        payload = {"digest": artifact.digest, "signed_by": artifact.signed_by,
                   "manifest": manifest_to_dict(artifact.manifest),
                   "schema": manifest_schema(artifact.manifest)}
        _emit(payload)
        return
    click.echo(render_manifest(artifact.manifest, artifact.digest, str(artifact.path),
                               _signature_line(artifact)))  # every line made visible there


def _signature_line(artifact: Any) -> str:
    if artifact.signed_by is not None:
        return f"verified, signed by {artifact.signed_by}"
    if (artifact.path / SIGNATURE_NAME).exists():
        return f"{SIGNATURE_NAME} present, not verified (pass --key to verify it)"
    return "none (qkan-pack sign)"


def render_manifest(manifest: Any, digest: str, path: str, signature: str = "") -> str:
    """The manifest as a human-readable table; every line made ``_visible`` (each manifest
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
    lines += ["", f"  {'#':>2}  {'inputs':<{width}}{'f32 noise':>9}{error_head}  outputs"]
    for index, (inputs, entry, error) in enumerate(zip(shown, manifest.shapes, errors)):
        noise = "-" if entry.noise is None else f"{entry.noise:.2g}"
        shown_error = f"  {error or '-':<{error_width - 2}}" if error_width else ""
        lines.append(f"  {index:>2}  {inputs:<{width}}{noise:>9}{shown_error}  "
                     f"{entry.outputs.label}")
    lines += ["", f"  {'file':<44}{'bytes':>12}  sha256"]
    for name, entry in sorted(manifest.files.items()):
        lines.append(f"  {name:<44}{entry.size:>12,}  {entry.sha256[:16]}…")
    if manifest.kernels:
        lines += ["", "  shipped kernels:"]
        lines += [f"    {k.key}  ({k.directory})" for k in manifest.kernels]
    return "\n".join(_visible(line) for line in lines)


def _precision_lines(policy: Any) -> list[str]:
    """The manifest's precision, its bound, and the choice per kind of device."""
    if policy is None:
        return []
    allowed = ", ".join(policy.allowed)
    auto = policy.default == "fp32" and len(policy.allowed) > 1
    head = policy.default
    if auto:
        head = ("fp32 where no choice below names the device" if policy.choices
                else "fp32 until `qkan-pack warm --precision auto` chooses per device")
    lines = [f"precision  {head}; max error {policy.max_error:g} of each output's scale; "
             f"allowed {allowed}"]
    for choice in policy.choices:
        timed = ", ".join(
            f"{p} {choice.mean_latency_us(p):.1f} us" + (f" err {max(choice.error[p]):.2g}"
                                                         if choice.error.get(p) else "")
            for p in choice.latency_us)
        per_shape = f"; per shape {', '.join(choice.shapes)}" if choice.shapes else ""
        lines.append(f"             {choice.key}: {choice.precision}{per_shape} ({timed})")
        lines += [f"               {p} refused: {why}" for p, why in choice.refused.items()]
    return lines


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


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--device", default="auto", show_default=True,
              help="auto (cuda when available, else cpu), cpu, cuda or cuda:N.")
@click.option("--expected-digest", help="Refuse unless the artifact digest is this sha256:…")
@click.option("--override", "overrides", multiple=True, callback=_config_option,
              metavar="KEY=VALUE", help="Override a factory argument at load. Repeatable.")
@click.option("--key", "keys", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Refuse unless the artifact is signed by this public key or under this root "
                   "certificate (PEM); checked before any artifact code runs. Repeatable.")
@click.option("--precision", type=click.Choice(["recorded", *PRECISIONS]), default="recorded",
              show_default=True, help=LOAD_PRECISION_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document (digest, device, signer, the load report) on "
              "stdout; messages go to stderr.")
def verify(directory: Path, device: str, expected_digest: str | None, overrides: dict,
           keys: tuple[Path, ...], precision: str, as_json: bool) -> None:
    """Check integrity (and the signature, with --key), load on DEVICE and run the
    self-test; exit 0 only when sound."""
    from .runtime import Predictor

    with warnings.catch_warnings():
        # warnings quote manifest strings (producer versions): shown visible, like all else
        warnings.showwarning = lambda message, *_: _say(f"warning: {message}", err=True)
        predictor = Predictor.load(directory, device=device, expected_digest=expected_digest,
                                   config_overrides=overrides, trusted_keys=keys,
                                   precision=precision)
    with predictor:
        _say(str(predictor.report), err=as_json)
        if predictor.signed_by is not None:
            _say(f"signature verified: signed by {predictor.signed_by}", err=as_json)
        _say(f"OK: {directory} is sound on {predictor.device}", err=as_json)
        if as_json:
            _emit({"ok": True, "path": str(directory), "digest": predictor.report.digest,
                   "device": str(predictor.device), "signed_by": predictor.signed_by,
                   "report": predictor.report.as_dict()})


def _predict_inputs_option(ctx: click.Context, param: click.Parameter,
                           value: Sequence[str]) -> tuple[tuple[str | None, Path], ...]:
    """``NAME=FILE`` or ``FILE``: a name is an identifier before the first ``=``."""
    given = []
    for item in value:
        name, sep, path = item.partition("=")
        if sep and name.isidentifier():
            given.append((name, Path(path)))
        else:
            given.append((None, Path(item)))
    for _, path in given:
        if not path.is_file():
            raise click.BadParameter(f"{path} is not a file", param_hint="--input")
    return tuple(given)


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--input", "inputs", multiple=True, required=True, callback=_predict_inputs_option,
              metavar="[NAME=]FILE",
              help="Input values: .npy, .npz, .safetensors or .json. NAME=FILE gives one input; "
              "a file without NAME gives every input it holds by name (or the only one). "
              "Repeatable.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the outputs (.npy, .npz, .safetensors or .json) instead of printing "
              "a summary table.")
@click.option("--device", default="auto", show_default=True,
              help="auto (cuda when available, else cpu), cpu, cuda or cuda:N.")
@click.option("--expected-digest", help="Refuse unless the artifact digest is this sha256:…")
@click.option("--key", "keys", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Refuse unless the artifact is signed by this public key or under this root "
                   "certificate (PEM). Repeatable.")
@click.option("--precision", type=click.Choice(["recorded", *PRECISIONS]), default="recorded",
              show_default=True, help=LOAD_PRECISION_HELP)
def predict(directory: Path, inputs: tuple, output: Path | None, device: str,
            expected_digest: str | None, keys: tuple[Path, ...], precision: str) -> None:
    """Run DIRECTORY's model on inputs read from files: a summary table, or --output FILE.

    Loads as Predictor.load does (verify, self-test, capture on a GPU) and checks the
    inputs as every call is checked: declared shapes and dtypes (smaller along the padded
    dimensions of an artifact built with --pad).
    """
    from .predict import OUTPUT_SUFFIXES, named_outputs, read_inputs, summarize, write_outputs
    from .runtime import Predictor

    if output is not None and output.suffix not in OUTPUT_SUFFIXES:  # before the load
        raise click.BadParameter(f"{output}: write {', '.join(OUTPUT_SUFFIXES)}",
                                 param_hint="--output")

    with Predictor.load(directory, device=device, expected_digest=expected_digest,
                        trusted_keys=keys, precision=precision, progress=False) as predictor:
        manifest = predictor.manifest
        dtypes = {d.name: d.dtype for d in manifest.inputs}
        arrays = read_inputs(inputs, manifest.input_names, dtypes)
        try:
            outputs = named_outputs(predictor(**arrays))
        except InputError as exc:  # name the files the inputs came from
            files = ", ".join(str(path) for _, path in inputs)
            raise InputError(f"inputs from {files}: {exc.problem}", accepted=exc.accepted,
                             padded=exc.padded, ranges=exc.ranges) from None
    if output is not None:
        _say(f"wrote {write_outputs(outputs, output)}")
    else:
        _say(summarize(outputs, manifest.metadata.class_labels))


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--key", "private_key", required=True,
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="EC private key (PEM, P-256/384/521) to sign with.")
@click.option("--certificate", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Signing certificate of --key (PEM): sign under a certificate chain instead "
                   "of a bare key.")
@click.option("--chain", multiple=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Intermediate/root certificates carried in the signature (with "
                   "--certificate). Repeatable.")
@click.option("--password-env", metavar="VAR",
              help="Read the private key's password from this environment variable.")
def sign(directory: Path, private_key: Path, certificate: Path | None, chain: tuple[Path, ...],
         password_env: str | None) -> None:
    """Sign every file of DIRECTORY (writes model.sig inside it; the digest is unchanged).

    Loads then check it with `qkan-pack verify --key PUBLIC.pem` or
    Predictor.load(..., trusted_keys=[...]). Needs pip install 'qkan-pack[sign]'.
    """
    from .builder import sign as sign_artifact

    if certificate is None and chain:
        raise click.UsageError("--chain goes with --certificate")
    password = None
    if password_env is not None:
        if password_env not in os.environ:
            raise click.UsageError(f"--password-env: {password_env} is not set")
        password = os.environ[password_env]
    result = sign_artifact(directory, private_key, certificate=certificate, chain=chain,
                           password=password)
    _say(f"signed {result.path} with {result.signer} ({SIGNATURE_NAME})")
    _say(f"digest {result.digest}")


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--device", default="auto", show_default=True,
              help="cuda, cuda:N or cpu; auto picks cuda when available.")
@click.option("--iters", default=300, show_default=True, type=click.IntRange(min=1),
              help="Timed calls per variant per repeat.")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(min=1),
              help="Repeat the whole measurement; the spread between repeats shows the noise.")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(min=0),
              help="Untimed calls per variant before timing.")
@click.option("--skip", multiple=True, type=click.Choice(SKIPPABLE),
              help="Leave a variant out (e.g. torch_compile, whose warm-up takes long). Repeatable.")
@click.option("--override", "overrides", multiple=True, callback=_config_option,
              metavar="KEY=VALUE", help="Override a factory argument at load. Repeatable.")
@click.option("--precision", "precisions", callback=_list_option, metavar="NAME,...",
              help=f"Also the whole model's graph at each of these precisions "
              f"({', '.join(PRECISIONS)}), side by side: latency, GPU time per call, pool "
              "memory and error against the float32 references (eager on a CPU).")
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
              callback=_list_option, metavar="NAME,...",
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
        _bench_cold(directory, device, overrides, json_path, plot_path,
                    runs=runs, variants=cold_variants, keep_caches=keep_caches, profile=profile,
                    bytecode_cache=bytecode_cache)
        return
    from .bench import BenchSettings, render_table, run_bench, write_json, write_plot

    settings = BenchSettings(iters=iters, repeats=repeats, warmup=warmup, skip=tuple(skip),
                             config_overrides=overrides, precisions=tuple(precisions))
    report = run_bench(directory, device, settings=settings)
    to_stdout = json_path == Path("-")
    click.echo(render_table(report), err=to_stdout)
    if to_stdout:
        _emit(report.as_dict())
    elif json_path is not None:
        _say(f"wrote {write_json(report, json_path)}")
    if plot_path is not None:
        _say(f"wrote {write_plot(report, plot_path)}", err=to_stdout)


_COLD_OPTIONS = {"runs": "--runs", "cold_variants": "--variants", "keep_caches": "--keep-caches",
                 "profile": "--profile", "bytecode_cache": "--bytecode-cache"}
_SIDE_BY_SIDE_OPTIONS = {"iters": "--iters", "repeats": "--repeats", "warmup": "--warmup",
                         "skip": "--skip", "precisions": "--precision"}


def _refuse_options_of_the_other_mode(cold: bool) -> None:
    """An option the chosen mode would ignore is a usage error, not silently dropped."""
    ctx = click.get_current_context()
    other = _SIDE_BY_SIDE_OPTIONS if cold else _COLD_OPTIONS
    given = [flag for name, flag in other.items()
             if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT]
    if given:
        raise click.UsageError(f"{', '.join(given)} only apply "
                               f"{'without' if cold else 'with'} --cold")


def _bench_cold(directory: Path, device: str, overrides: dict, json_path: Path | None,
                plot_path: Path | None, *, runs: int, variants: tuple, keep_caches: bool,
                profile: bool, bytecode_cache: Path | None) -> None:
    from .bench import ColdSettings, render_cold, run_cold, write_cold_json, write_cold_plot

    settings = ColdSettings(runs=runs, variants=variants, fresh_caches=not keep_caches,
                            profile=profile, config_overrides=overrides,
                            bytecode_cache=bytecode_cache)
    report = run_cold(directory, device, settings=settings)
    to_stdout = json_path == Path("-")
    click.echo(render_cold(report), err=to_stdout)
    if to_stdout:
        _emit(report)
    elif json_path is not None:
        click.echo(f"wrote {write_cold_json(report, json_path)}")
    if plot_path is not None:
        click.echo(f"wrote {write_cold_plot(report, plot_path)}", err=to_stdout)


def _lengths_option(ctx: click.Context, param: click.Parameter,
                    value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        low, high = (int(v) for v in value.split(","))
    except ValueError:
        low = high = 0
    if not 1 <= low <= high:
        raise click.BadParameter("write LOW,HIGH with 1 <= LOW <= HIGH, e.g. 8,128",
                                 param_hint="--lengths")
    return low, high


def _clients_option(ctx: click.Context, param: click.Parameter, value: str) -> tuple:
    try:
        counts = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise click.BadParameter("write client counts as 1,8,32", param_hint="--clients")
    return counts


def _protocols_option(ctx: click.Context, param: click.Parameter, value: str) -> tuple:
    protocols = tuple(v.strip() for v in value.split(",") if v.strip())
    if not protocols:
        raise click.BadParameter("write protocols as json,oip-binary", param_hint="--protocol")
    return protocols


@cli.command("bench-serve")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--clients", default="1,8,32,128,512", show_default=True, callback=_clients_option,
              help="Concurrent clients per point, comma-separated.")
@click.option("--seconds", default=10.0, show_default=True, type=click.FloatRange(min=0.5),
              help="Timed seconds per point.")
@click.option("--warmup", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Untimed seconds of load before each point.")
@click.option("--processes", type=click.IntRange(min=1),
              help="Client processes (threads inside share the clients) [default: half the cores].")
@click.option("--serve-args", default="", metavar="'ARGS'",
              help="Options for `qkan-pack serve`, quoted: '--replicas 4 --gpus-per-replica 0.25'.")
@click.option("--protocol", "protocols", default="json", show_default=True, metavar="P,...",
              callback=_protocols_option,
              help="Protocols measured side by side against one server, comma-separated: json "
                   "(POST /), oip-json and oip-binary (the Open Inference Protocol's HTTP infer, "
                   "JSON or binary tensors), oip-grpc (its gRPC ModelInfer; needs "
                   "tritonclient[grpc]).")
@click.option("--rows-per-request", default=1, show_default=True, type=click.IntRange(min=1),
              metavar="N", help="Rows in each request (a captured batch size of the artifact).")
@click.option("--no-noop", is_flag=True, help="Skip the no-op deployment baseline (JSON route).")
@click.option("--kill-at", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Also SIGKILL one replica this long into a run at --kill-clients clients.")
@click.option("--kill-clients", default=32, show_default=True, type=click.IntRange(min=1),
              help="Clients during the replica kill.")
@click.option("--kills", default=1, show_default=True, type=click.IntRange(min=1),
              help="With --kill-at: a kill loop, one replica SIGKILLed this many times, every "
                   "--kill-every seconds once all replicas serve again; the run lasts until one "
                   "interval after the last.")
@click.option("--kill-every", default=15.0, show_default=True, type=click.FloatRange(min=1),
              metavar="SECONDS", help="Seconds between the kills of --kills.")
@click.option("--large-body-mb", type=click.FloatRange(min=0.001),
              help="Also measure single-row latency while two clients send bodies of this "
                   "many MB of numbers (rows; a 422 unless that row count is captured).")
@click.option("--lengths", callback=_lengths_option, metavar="LOW,HIGH",
              help="Requests of random lengths, uniform in [LOW, HIGH], along the artifact's "
              "padded length axis (an artifact built with --pad).")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535),
              help="Port the server under test listens on (loopback).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the results as JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the curve as a PNG here (needs matplotlib).")
def bench_serve(directory: Path, clients: tuple, seconds: float, warmup: float,
                processes: int | None, serve_args: str, protocols: tuple, rows_per_request: int,
                no_noop: bool, kill_at: float | None,
                kill_clients: int, kills: int, kill_every: float, large_body_mb: float | None,
                lengths: tuple[int, int] | None, port: int,
                json_path: Path | None, plot_path: Path | None) -> None:
    """Load-test `qkan-pack serve DIRECTORY` (started here as a process) over loopback:
    req/s, rows/s, p50, p99 and rows per replay for each client count and protocol, beside a
    no-op deployment."""
    from .bench import (
        ServeLoadSettings,
        render_serve_load,
        run_serve_load,
        write_serve_json,
        write_serve_plot,
    )

    if kills > 1 and kill_at is None:
        raise click.UsageError("--kills goes with --kill-at")
    extra = {"processes": processes} if processes else {}
    args = _split_args(serve_args)
    settings = ServeLoadSettings(clients=clients, seconds=seconds, warmup=warmup,
                                 serve_args=args, noop=not no_noop,
                                 kill_at_s=kill_at, kill_clients=kill_clients, kills=kills,
                                 kill_every_s=kill_every,
                                 large_body_mb=large_body_mb, lengths=lengths, port=port,
                                 protocols=protocols, rows_per_request=rows_per_request, **extra)
    report = run_serve_load(directory, settings, token=_read_token(_token_file_in(args)))
    click.echo(render_serve_load(report))
    if json_path is not None:
        click.echo(f"wrote {write_serve_json(report, json_path)}")
    if plot_path is not None:
        click.echo(f"wrote {write_serve_plot(report, plot_path)}")




def _split_args(text: str) -> tuple[str, ...]:
    """--serve-args as the shell would split it; unbalanced quotes are a usage error."""
    import shlex

    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: {exc}", param_hint="--serve-args") from None


def _token_file_in(serve_args: Sequence[str]) -> Path | None:
    """The ``--auth-token-file`` among ``serve``'s arguments (bench-serve's clients send the
    token the server it starts will require); the last one, as click takes."""
    found = None
    for i, arg in enumerate(serve_args):
        if arg == "--auth-token-file" and i + 1 < len(serve_args):
            found = Path(serve_args[i + 1])
        elif arg.startswith("--auth-token-file="):
            found = Path(arg.partition("=")[2])
    return found


def _read_token(path: Path | None, *, take: bool = False) -> str | None:
    """The bearer token from --auth-token-file (its first line; the rules are
    ``serve.read_token_file``'s), else QKAN_PACK_SERVE_TOKEN. ``take`` (the serve itself):
    the variable is taken out of this process's environment, so that no process the serve
    starts (Ray's, replicas running model code) inherits it; under the supervisor it came
    through a pipe instead (``_session``). A token or file serve cannot use is a usage error."""
    from ._session import handed_over_token
    from .errors import ServeTokenError
    from .serve import check_token, read_token_file

    given = os.environ.pop(TOKEN_ENV, None) if take else os.environ.get(TOKEN_ENV)
    if take and given is None:
        given = handed_over_token()
    try:
        if path is not None:
            return read_token_file(path)
        return check_token(given.strip(), TOKEN_ENV) if given and given.strip() else None
    except ServeTokenError as exc:
        raise click.BadParameter(str(exc), param_hint="--auth-token-file" if path else TOKEN_ENV
                                 ) from None


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="HTTP bind address; loopback keeps the server private to this host "
              "(0.0.0.0 exposes it: use a token).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535),
              help="HTTP port. A taken port is an error: one server per port.")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(min=1),
              help="Replicas, each loading its own predictor.")
@click.option("--gpus-per-replica", type=click.FloatRange(min=0),
              help="GPUs each replica reserves; fractions share a GPU (0.25: four per GPU) "
              "[default: up to 1 when the cluster has GPUs, else 0].")
@click.option("--cpus-per-replica", type=click.FloatRange(min=0),
              help="CPUs each replica reserves [default: what fits the cluster, at most 1].")
@click.option("--ingress", type=click.Choice(["auto", "haproxy", "python"]), default="auto",
              show_default=True, help="HTTP front: Ray Serve's HAProxy ingress (fast; auto "
              "uses it when its binary is installed) or its Python proxy.")
@click.option("--max-batch-size", type=click.IntRange(min=1),
              help="Rows gathered per replay [default: the largest captured batch].")
@click.option("--max-batch-wait-ms", type=click.FloatRange(min=0),
              help="Every batch waits this long for more rows after its first (a fixed "
              "wait, as Ray's @serve.batch). [default: adaptive: a batch runs once rows stop "
              "arriving, at most 10 ms after its first; a lone row does not wait]")
@click.option("--exact", is_flag=True,
              help="Replay each row alone: bit-identical answers whatever else is in flight "
              "(batching changes the last bits, about 1e-7 relative).")
@click.option("--max-ongoing-requests", type=click.IntRange(min=1),
              help="Requests a replica works on at once [default: its batch size, at least 8].")
@click.option("--max-queued-requests", type=click.IntRange(min=0),
              help="Requests held waiting per replica (in HAProxy, the default ingress); beyond, "
              "a JSON 503 with Retry-After at once [default: half of --max-ongoing-requests].")
@click.option("--max-body-mb", default=8.0, show_default=True,
              type=click.FloatRange(min=0.001, max=65536.0),  # NaN is refused below
              help="Larger request bodies get HTTP 413 before they are read whole.")
@click.option("--body-timeout-s", default=30.0, show_default=True,
              type=click.FloatRange(min=0.1, max=86400.0),
              help="A request body not received within this time gets HTTP 408 (through HAProxy, "
              "the headers and the first 16 KiB of body within this or 10 s, whichever is shorter).")
@click.option("--auth-token-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help=f"Require 'Authorization: Bearer <token>' on every route but the liveness "
              f"route GET /-/healthz (status only) [default: ${TOKEN_ENV}, else no token]. "
              "The token is the file's first line: at least 16 printable ASCII characters; "
              "the file must not be writable by its group or others (chmod 600).")
@click.option("--key", "keys", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Refuse unless the artifact is signed by this public key or under this root "
                   "certificate (PEM): checked before Ray starts, and by each replica before "
                   "any artifact code runs. Repeatable.")
@click.option("--grace-s", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="On Ctrl-C or SIGTERM, how long in-flight requests may finish.")
@click.option("--device", default="auto", show_default=True,
              help="Replica device: auto (cuda where Ray gave the replica a GPU), cpu or cuda.")
@click.option("--address", help="Ray cluster to join (e.g. auto), from its head node, where "
              "Serve's ingress runs (docs: cluster.md) [default: RAY_ADDRESS, else a local Ray "
              "started and stopped by this command].")
@click.option("--precision", type=click.Choice(["recorded", *PRECISIONS]), default="recorded",
              show_default=True,
              help="Replicas load at this precision (each gated on its device against the "
                   "artifact's max error) instead of the one it records for their device.")
@click.option("--name", "model_name", metavar="NAME",
              help="The model's name in the Open Inference Protocol's URLs "
                   "(/v2/models/NAME) [default: the artifact's name].")
@click.option("--grpc-port", type=click.IntRange(1, 65535),
              help="Also serve the Open Inference Protocol over gRPC "
                   "(inference.GRPCInferenceService) on this port; needs tritonclient[grpc].")
@click.option("--verbose", is_flag=True, help="Show Ray's own log lines.")
@click.option("--noop", is_flag=True, hidden=True,
              help="Serve a fixed reply without the model (the load test's baseline).")
def serve(directory: Path, host: str, port: int, replicas: int, gpus_per_replica: float | None,
          cpus_per_replica: float | None, ingress: str, max_batch_size: int | None,
          max_batch_wait_ms: float | None, exact: bool, max_ongoing_requests: int | None,
          max_queued_requests: int | None, max_body_mb: float, body_timeout_s: float,
          auth_token_file: Path | None, keys: tuple[Path, ...], grace_s: float, device: str,
          address: str | None, precision: str, model_name: str | None, grpc_port: int | None,
          verbose: bool, noop: bool) -> None:
    """Serve DIRECTORY over HTTP on Ray Serve until Ctrl-C or SIGTERM (pip install
    'qkan-pack[serve]').

    Single rows from concurrent requests are batched into the captured shapes. GET /
    describes the artifact, POST / {"inputs": [[...]]} predicts, GET /stats counts replays,
    POST /stats/reset zeroes the counters; /v2/... is the Open Inference Protocol (KServe v2,
    Triton's API: tritonclient and KServe's clients work), over gRPC too with --grpc-port.
    Every reply is JSON, but GET /-/healthz (liveness, no token needed): its status only,
    200 or 503, with an empty body.
    """
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise click.ClickException("Ray Serve is not installed: pip install 'qkan-pack[serve]'")
    from .serve import HttpLimits, Listen, ServeOptions, replica_device_text, serve_forever

    if address is None and device.startswith("cuda"):  # replicas run here: check it first
        from .runtime import resolve_device

        resolve_device(device)  # the error verify gives in a second, before Ray starts
    token = _read_token(auth_token_file, take=True)
    for hint, value in (("--max-body-mb", max_body_mb), ("--body-timeout-s", body_timeout_s)):
        if math.isnan(value):  # click's FloatRange lets NaN through
            raise click.BadParameter("not a number", param_hint=hint)
    limits = HttpLimits(max_body_bytes=int(max_body_mb * 2**20), body_timeout_s=body_timeout_s,
                        max_ongoing=max_ongoing_requests, max_queued=max_queued_requests)
    options = ServeOptions(replicas=replicas, max_batch_size=max_batch_size,
                           max_batch_wait_ms=max_batch_wait_ms, exact=exact, device=device,
                           grace_s=grace_s, limits=limits, model_name=model_name)
    listen = Listen(host=host, port=port, address=address, ingress=ingress, verbose=verbose,
                    grpc_port=grpc_port)

    def ready(url: str, description: dict) -> None:
        what = "a no-op reply" if noop else f"{directory} ({description['digest']})"
        _say(f"serving {what} at {url} with {replicas} replica(s) on "
             f"{replica_device_text(description['replica']['device'], replicas)}"
             + ("; bearer token required" if token else ""))
        if not noop:
            _say(f"accepted: {'; '.join(description['accepted'])}")
            oip = description["oip"]
            grpc = f"; gRPC on port {grpc_port}" if grpc_port else ""
            _say(f"Open Inference Protocol: {url}v2/models/{oip['model']} (version "
                 f"{oip['version']}){grpc}")
        click.echo("Ctrl-C or SIGTERM stops (drains for "
                   f"{grace_s:g} s)", err=True)

    serve_forever(directory, options, listen, token=token, trusted_keys=keys, precision=precision,
                  cpus_per_replica=cpus_per_replica,
                  gpus_per_replica=gpus_per_replica, noop=noop, on_ready=ready,
                  notice=lambda line: click.echo(line, err=True))
    click.echo("stopped", err=True)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(argv) if argv is not None else sys.argv[1:]
    if args[:1] == ["serve"] and not {"-h", "--help"} & set(args):
        # the server runs as a child in a session of its own: a SIGTERM to this command's
        # process group then stops it in order (_session.py says why); the child is started
        # the way this process was (interpreter flags, console script or -m)
        from ._session import run_in_own_session

        command = [sys.executable, *sys.orig_argv[1:]] if argv is None else None
        status = run_in_own_session(args, command)
        if status is not None:
            sys.exit(status)
    cli.main(args=args, prog_name="qkan-pack")
