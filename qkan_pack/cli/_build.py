"""``qkan-pack build``: a model file and declared shapes → an artifact (``builder.build``)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import click

from ..errors import ShapeSpecError
from ..format import (
    AUTO_PRECISION,
    CAPTURE_POLICIES,
    DEFAULT_MAX_ERROR,
    DEFAULT_VERSION,
    MAX_MAX_ERROR,
    PRECISIONS,
    check_dtype,
    check_seed,
    manifest_to_dict,
    pair_inputs,
    parse_batch_sizes,
    parse_config_items,
    parse_input_option,
    parse_range,
    parse_shapes,
)
from ._app import cli
from ._errors import DEVICE_OPTION
from ._options import json_flag
from ._output import emit, say
from ._params import comma_list, each, label_pairs, pad_values, parsed
from ._warm import warm_and_report


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
        raise click.BadParameter(str(exc), param_hint="--input") from None
    names = [name for name, _, _ in inputs]
    return per_shape, {name: dtypes.get(name, dtype or "float32") for name in names}


@cli.command()
@click.argument("model_py", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--shapes", callback=parsed(parse_shapes, per_row=True),
              help="Shapes of the one input (passed to forward positionally), dims joined by x, "
              "shapes by commas: 1x128,8x128.")
@click.option("--input", "inputs", multiple=True,
              callback=parsed(each(parse_input_option), per_row=True),
              metavar="NAME:SHAPES[:DTYPE]",
              help="A named input, passed to forward by keyword: input_ids:1x16,8x16:int64. "
              "Repeat per input; shapes pair up by position across inputs.")
@click.option("--batch-sizes", callback=parsed(parse_batch_sizes), metavar="N,...", is_eager=True,
              help="Declare every --shapes/--input shape as a per-row shape at each of these "
              "batch sizes: --shapes 128 --batch-sizes 1,8,32 is 1x128,8x128,32x128.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              help="Artifact directory [default: artifacts/<model file stem>].")
@click.option("--dtype", callback=parsed(check_dtype),
              help="Input dtype (int64 for token ids) [default: float32; --input may give "
              "its own].")
@click.option("--entry", default="build_model", show_default=True,
              help="Factory in the model file: build_model(**config) -> nn.Module.")
@click.option("--config", "config", multiple=True, callback=parsed(parse_config_items),
              metavar="KEY=VALUE",
              help="Factory argument; VALUE parsed as JSON (True, False and None as "
              "Python spells them too), else a string ('\"False\"' for that text). "
              "Repeatable.")
@click.option("--weights", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="safetensors file or torch state dict (read with weights_only=True).")
@click.option("--include", "includes", multiple=True, type=click.Path(exists=True, path_type=Path),
              help="Extra local .py file or package directory the model imports. Repeatable.")
@click.option("--capture", type=click.Choice(CAPTURE_POLICIES), default="auto", show_default=True,
              help="Graph capture policy recorded for the GPU runtime.")
@click.option("--submodules", callback=parsed(comma_list, missing=()), metavar="CLASS,...",
              help="Classes to capture under the submodules policy [default: the largest "
              "blocks that capture and replay correctly].")
@click.option("--input-range", callback=parsed(parse_range), metavar="LOW,HIGH",
              help="Draw reference inputs uniformly from [LOW, HIGH): floats (rounded to "
              "their dtype), and integers from [int(LOW), int(HIGH)) [default: floats "
              "standard normal; integers from the embedding they index, else [0, 2)].")
@click.option("--seed", default=0, show_default=True, callback=parsed(check_seed),
              help="Seed of the random reference inputs, 0 to 2**63-1 (shape i draws "
              "with SEED+i).")
@click.option("--reference-inputs", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              metavar="FILE", help="Inputs that exercise the model (.npz/.npy/.safetensors, "
              "arrays named after the inputs, x for a single one): used for the declared shapes "
              "they fit, e.g. a detector's real image.")
@click.option("--allow-constant-references", is_flag=True,
              help="Build even if a reference output is empty or all outputs are constant "
              "(the load self-test then proves nothing for them).")
@click.option("--pad", "pad", multiple=True, callback=parsed(pad_values), metavar="NAME=VALUE",
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
@click.option("--license", "license", default="", metavar="SPDX",
              help="The model's license (an SPDX identifier: Apache-2.0, MIT...).")
@click.option("--label", "labels", multiple=True, callback=parsed(label_pairs),
              metavar="KEY=VALUE",
              help="A label recorded in the manifest (team=search). Repeatable.")
@click.option("--force", is_flag=True, help="Replace an existing artifact at the output path.")
@click.option("--warm", "warm_device", is_flag=False, flag_value="cuda", default=None,
              metavar="[DEVICE]", help="Then ship compiled GPU kernels (needs a GPU here; "
              "DEVICE defaults to cuda). See `qkan-pack warm`.")
@json_flag("Print one JSON document (path, digest, notes, manifest) on stdout; "
           "messages go to stderr.")
def build(model_py: Path, shapes: list | None, inputs: list, dtype: str | None,
          warm_device: str | None, as_json: bool, **options: Any) -> None:
    """Build an artifact from MODEL_PY for the declared input shapes."""
    # every other option is the BuildOptions field of its name (--pad: pad, --license: license)
    from ..builder import BuildOptions, check_warm_device
    from ..builder import build as build_artifact

    declared, dtypes = _declared_shapes(shapes, inputs, dtype)
    if warm_device is not None:  # a host that cannot warm fails before the build
        click.get_current_context().meta[DEVICE_OPTION] = "--warm"
        check_warm_device(warm_device)
    build_options = BuildOptions(dtype=dtypes, **options)
    with warnings.catch_warnings():  # notes are printed below, once
        warnings.simplefilter("ignore")
        result = build_artifact(model_py, declared, options=build_options)
    for note in result.notes:
        say(f"note: {note}", err=True)
    shown = ", ".join(e.label for e in result.manifest.shapes)
    say(f"built {result.path} ({shown}; {result.manifest.model.parameters:,} parameters)",
        err=as_json)
    digest, manifest = result.digest, result.manifest
    if warm_device is not None:
        from ..runtime import read_artifact

        warm_and_report(result.path, warm_device, as_json=as_json)
        warmed = read_artifact(result.path)  # the manifest now lists the shipped kernels
        digest, manifest = warmed.digest, warmed.manifest
    else:
        say(f"digest {result.digest}", err=as_json)
    if as_json:
        emit({"path": str(result.path), "digest": digest, "notes": list(result.notes),
              "manifest": manifest_to_dict(manifest)})
