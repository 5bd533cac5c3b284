"""The ``qkan-pack`` group, on which every command module registers its command, and
``main``, the console script's entry point."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from .._supported import supported_text
from .._version import __version__
from ._errors import Group


def _version_option(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--version``: the ranges are read only when asked (looking the installed releases up
    takes a tenth of a second, which every other command would otherwise pay at start)."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"qkan-pack {__version__}\nsupported releases of the libraries whose internals "
               f"it uses (installed here):\n{supported_text()}")
    ctx.exit()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
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


def main(argv: Sequence[str] | None = None) -> None:
    args = list(argv) if argv is not None else sys.argv[1:]
    if args[:1] == ["serve"] and not {"-h", "--help"} & set(args):
        # the server runs as a child in a session of its own: a SIGTERM to this command's
        # process group then stops it in order (_session.py says why); the child is started
        # the way this process was (interpreter flags, console script or -m)
        from .._session import run_in_own_session

        command = [sys.executable, *sys.orig_argv[1:]] if argv is None else None
        status = run_in_own_session(args, command)
        if status is not None:
            sys.exit(status)
    cli.main(args=args, prog_name="qkan-pack")
