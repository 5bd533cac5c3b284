"""``qkan-pack predict``: run an artifact's model on inputs read from files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from ..errors import InputError, ShapeSpecError
from ._app import cli
from ._options import (
    LOAD_DEVICE_HELP,
    device_option,
    expected_digest_option,
    load_compiled_option,
    load_layout_option,
    load_precision_option,
    trusted_keys_option,
)
from ._output import say, visible
from ._params import parsed


def input_files(items: Sequence[str]) -> tuple[tuple[str | None, Path], ...]:
    """``NAME=FILE`` or ``FILE`` (a name is an identifier before the first ``=``), each an
    existing file."""
    given: list[tuple[str | None, Path]] = []
    for item in items:
        name, sep, path = item.partition("=")
        given.append((name, Path(path)) if sep and name.isidentifier() else (None, Path(item)))
    for _, file in given:
        if not file.is_file():
            raise ShapeSpecError(f"{file} is not a file")
    return tuple(given)


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--input", "inputs", multiple=True, required=True, callback=parsed(input_files),
              metavar="[NAME=]FILE",
              help="Input values: .npy, .npz, .safetensors or .json. NAME=FILE gives one input; "
              "a file without NAME gives every input it holds by name (or the only one). "
              "Repeatable.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the outputs (.npy, .npz, .safetensors or .json) instead of printing "
              "a summary table.")
@device_option(LOAD_DEVICE_HELP)
@expected_digest_option()
@trusted_keys_option("Refuse unless the artifact is signed by this public key or under this "
                     "root certificate (PEM). Repeatable.")
@load_precision_option()
@load_layout_option()
@load_compiled_option()
def predict(directory: Path, inputs: tuple, output: Path | None, device: str,
            expected_digest: str | None, keys: tuple[Path, ...], precision: str,
            layout: str, compiled: str) -> None:
    """Run DIRECTORY's model on inputs read from files: a summary table, or --output FILE.

    Loads as Predictor.load does (verify, self-test, capture on a GPU) and checks the
    inputs as every call is checked: declared shapes and dtypes (smaller along the padded
    dimensions of an artifact built with --pad).
    """
    from ..predict import (
        OUTPUT_SUFFIXES,
        check_output,
        named_outputs,
        read_inputs,
        summarize,
        write_outputs,
    )
    from ..runtime import Predictor

    if output is not None:  # before the load: a path or outputs the file cannot take
        if output.suffix not in OUTPUT_SUFFIXES:
            raise click.BadParameter(f"{output}: write {', '.join(OUTPUT_SUFFIXES)}",
                                     param_hint="--output")
        check_output(output, directory, [path for _, path in inputs])

    with Predictor.load(directory, device=device, expected_digest=expected_digest,
                        trusted_keys=keys, precision=precision, layout=layout,
                        compiled=compiled, progress=False) as predictor:
        manifest = predictor.manifest
        dtypes = {d.name: d.dtype for d in manifest.inputs}
        arrays = read_inputs(inputs, manifest.input_names, dtypes)
        try:
            outputs = named_outputs(predictor(**arrays))
        except InputError as exc:  # name the files the inputs came from
            files = ", ".join(str(path) for _, path in inputs)
            raise exc.with_problem(f"inputs from {files}: {exc.problem}") from None
    if output is not None:
        written, notes = write_outputs(outputs, output)
        for note in notes:
            say(f"note: {visible(note)}", err=True)  # an output name may hold a newline
        say(f"wrote {written}")
    else:
        say(summarize(outputs, manifest.metadata.class_labels, shown=visible))
