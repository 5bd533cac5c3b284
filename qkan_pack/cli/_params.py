"""The one way an option's text becomes a value: ``parsed(parse)``, a click callback.

``parse`` is a library parser (``format.parse_shapes``, ``check_dtype``...) or one of the
small command-line parsers here; each raises ``ShapeSpecError`` for text it cannot take, and
the callback turns that into click's usage error naming the option (exit 2, the command's
usage shown). A callback rather than ``click.ParamType`` subclasses: repeated options
(``--config``, ``--pad``) are checked as a whole (a key given twice), and ``--help`` keeps
showing the plain metavars.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import click

from ..errors import ShapeSpecError

Callback = Callable[[click.Context, click.Parameter, Any], Any]


def option_name(param: click.Parameter) -> str:
    """The option as the user knows it: its longest spelling (``--output``, not ``-o``)."""
    return max(param.opts, key=len)


def parsed(parse: Callable[..., Any], *, per_row: bool = False, missing: Any = None
           ) -> Callback:
    """A click callback that reads the option's value with ``parse``.

    ``per_row``: ``parse`` also takes ``per_row=`` (``--batch-sizes`` given: the shapes are
    per-row shapes; ``--batch-sizes`` is eager, so it is known by then). ``missing``: the
    value when the option is not given.
    """
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return missing
        try:
            if per_row:
                return parse(value, per_row=ctx.params.get("batch_sizes") is not None)
            return parse(value)
        except ShapeSpecError as exc:
            raise click.BadParameter(str(exc), param_hint=option_name(param)) from None

    return callback


def each(parse: Callable[..., Any]) -> Callable[..., list[Any]]:
    """``parse`` applied to every value of a repeated option."""
    def parse_each(values: Sequence[str], **options: Any) -> list[Any]:
        return [parse(value, **options) for value in values]

    return parse_each


def comma_list(text: str) -> tuple[str, ...]:
    """``a, b,,c`` → ``("a", "b", "c")``."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def pad_values(items: Sequence[str]) -> dict[str, Any]:
    """Repeated ``NAME=VALUE``: VALUE as JSON (``0``, ``0.0``, ``true``)."""
    return _key_values(items, valid_key=str.isidentifier, read=_json_value, twice="{key!r}",
                       expected="write NAME=VALUE with a number or true/false as VALUE "
                                "({example}=0)")


def label_pairs(items: Sequence[str]) -> dict[str, str]:
    """Repeated ``KEY=VALUE`` labels, kept as text (checked with the rest of the metadata)."""
    return _key_values(items, valid_key=bool, read=str, twice="label {key!r}",
                       expected="write KEY=VALUE")


def _json_value(text: str) -> Any:
    """``text`` as JSON; ``None`` (refused) where it is not JSON or is ``null``."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _key_values(items: Sequence[str], *, valid_key: Callable[[str], bool],
                read: Callable[[str], Any], expected: str, twice: str) -> dict[str, Any]:
    """Repeated ``KEY=VALUE`` items as a mapping; an item without ``=``, with a key
    ``valid_key`` refuses or a value ``read`` gives None for is refused with ``expected``
    (``{example}`` formatted in: the item's own key where it is a valid one, else NAME), a
    key given twice with ``twice`` (``{key!r}`` formatted in)."""
    pairs: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        value = read(text) if sep else None
        if value is None or not valid_key(key):
            example = key if sep and valid_key(key) else "NAME"
            raise ShapeSpecError(f"{item!r}: {expected.format(example=example)}")
        if key in pairs:
            raise ShapeSpecError(f"{twice.format(key=key)} is given twice")
        pairs[key] = value
    return pairs

