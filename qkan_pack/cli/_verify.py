"""``qkan-pack verify``: integrity (and signature), load and self-test; exit 0 only when the
artifact is sound on the device."""

from __future__ import annotations

import warnings
from pathlib import Path

import click

from ._app import cli
from ._options import (
    LOAD_DEVICE_HELP,
    device_option,
    expected_digest_option,
    json_flag,
    load_compiled_option,
    load_layout_option,
    load_precision_option,
    overrides_option,
    trusted_keys_option,
)
from ._output import emit, say


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@device_option(LOAD_DEVICE_HELP)
@expected_digest_option()
@overrides_option()
@trusted_keys_option("Refuse unless the artifact is signed by this public key or under this "
                     "root certificate (PEM); checked before any artifact code runs. "
                     "Repeatable.")
@load_precision_option()
@load_layout_option()
@load_compiled_option()
@json_flag("Print one JSON document (digest, device, signer, the load report) on "
           "stdout; messages go to stderr.")
def verify(directory: Path, device: str, expected_digest: str | None, overrides: dict,
           keys: tuple[Path, ...], precision: str, layout: str, compiled: str,
           as_json: bool) -> None:
    """Check integrity (and the signature, with --key), load on DEVICE and run the
    self-test; exit 0 only when sound."""
    from ..runtime import Predictor

    with warnings.catch_warnings():
        # warnings quote manifest strings (producer versions): shown visible, like all else
        warnings.showwarning = lambda message, *_: say(f"warning: {message}", err=True)
        predictor = Predictor.load(directory, device=device, expected_digest=expected_digest,
                                   config_overrides=overrides, trusted_keys=keys,
                                   precision=precision, layout=layout, compiled=compiled)
    with predictor:
        say(str(predictor.report), err=as_json)
        if predictor.signed_by is not None:
            say(f"signature verified: signed by {predictor.signed_by}", err=as_json)
        say(f"OK: {directory} is sound on {predictor.device}", err=as_json)
        if as_json:
            emit({"ok": True, "path": str(directory), "digest": predictor.report.digest,
                  "device": str(predictor.device), "signed_by": predictor.signed_by,
                  "report": predictor.report.as_dict()})
