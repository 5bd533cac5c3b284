"""What a command prints: text for a person made visible, and the one JSON document.

Every manifest string is untrusted: shown to a person, a control sequence in a config value,
a file name or an output key could otherwise move the cursor, recolour or rewrite what the
screen says. JSON is printed as is: ``json.dumps`` escapes control characters itself, so it
stays exact and safe.
"""

from __future__ import annotations

import json
from typing import Any

import click


def visible(text: str) -> str:
    """``text`` with every non-printable character (escape sequences, CR, backspace, BEL,
    bidi overrides, line separators) written as a Python escape (``\\x1b``)."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def say(text: str, *, err: bool = False) -> None:
    """Echo text meant for a person, each line made ``visible``."""
    click.echo("\n".join(visible(line) for line in text.split("\n")), err=err)


def emit(payload: Any) -> None:
    """The one JSON document a ``--json`` command prints on stdout (exact: json.dumps
    escapes control characters itself)."""
    click.echo(json.dumps(payload, indent=2))
