"""The serve's bearer token, as ``serve`` and ``bench-serve`` read it: ``--auth-token-file``,
else ``QKAN_PACK_SERVE_TOKEN``."""

from __future__ import annotations

import os
from pathlib import Path

import click

from .._session import TOKEN_ENV


def read_token(path: Path | None, *, take: bool = False) -> str | None:
    """The bearer token from --auth-token-file (its first line; the rules are
    ``serve.read_token_file``'s), else QKAN_PACK_SERVE_TOKEN. ``take`` (the serve itself):
    the variable is taken out of this process's environment, so that no process the serve
    starts (Ray's, replicas running model code) inherits it; under the supervisor it came
    through a pipe instead (``_session``). A token or file serve cannot use is a usage error."""
    from .._session import handed_over_token
    from ..errors import ServeTokenError
    from ..serve import check_token, read_token_file

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
