"""The ``qkan-pack`` group, on which every command module registers its command, and
``main``, the console script's entry point."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from .._version import __version__
from ._errors import Group


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="qkan-pack")
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
