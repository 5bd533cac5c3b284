"""``qkan-pack inspect``: an artifact's manifest as a table or JSON (integrity checked; no
model code runs, no torch imported)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..format import SIGNATURE_NAME, manifest_schema, manifest_to_dict
from ._app import cli
from ._manifest_table import render_manifest
from ._options import json_flag, trusted_keys_option
from ._output import emit


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@json_flag("Print the manifest as JSON.")
@trusted_keys_option("Also verify the signature with this public key or root certificate "
                     "(PEM). Repeatable: any one of them may have signed.")
def inspect(directory: Path, as_json: bool, keys: tuple[Path, ...]) -> None:
    """Show an artifact's manifest as a table (checks integrity; runs no model code)."""
    from ..runtime import read_artifact

    artifact = read_artifact(directory, trusted_keys=keys)
    if as_json:
        payload = {"digest": artifact.digest, "signed_by": artifact.signed_by,
                   "manifest": manifest_to_dict(artifact.manifest),
                   "schema": manifest_schema(artifact.manifest)}
        emit(payload)
        return
    click.echo(render_manifest(artifact.manifest, artifact.digest, str(artifact.path),
                               _signature_line(artifact)))  # every line made visible there


def _signature_line(artifact: Any) -> str:
    if artifact.signed_by is not None:
        return f"verified, signed by {artifact.signed_by}"
    if (artifact.path / SIGNATURE_NAME).exists():
        return f"{SIGNATURE_NAME} present, not verified (pass --key to verify it)"
    return "none (qkan-pack sign)"
