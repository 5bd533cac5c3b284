"""``qkan-pack sign``: sign every file of an artifact (``builder.sign``)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..format import SIGNATURE_NAME
from ._app import cli
from ._output import say


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
    from ..builder import sign as sign_artifact

    if certificate is None and chain:
        raise click.UsageError("--chain goes with --certificate")
    password = None
    if password_env is not None:
        if password_env not in os.environ:
            raise click.UsageError(f"--password-env: {password_env} is not set")
        password = os.environ[password_env]
    result = sign_artifact(directory, private_key, certificate=certificate, chain=chain,
                           password=password)
    say(f"signed {result.path} with {result.signer} ({SIGNATURE_NAME})")
    say(f"digest {result.digest}")
