"""The one mapping from an exception to what the command line says and how it exits.

Exit codes: 0 success, 1 error (one line, ``Error: <message>``; ``QKAN_PACK_DEBUG=1`` shows
the traceback instead), 2 usage error (shown with the failing command's own usage), 130
Ctrl-C. With ``--json``, every failure is also the command's one JSON document on stdout:
``{"ok": false, "error": {"type", "message", <the error's fields>}}``.

``Command`` tells the mapping which command runs and whether it answers in JSON; ``Group``
(the ``qkan-pack`` group's class) maps what escapes a command.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from .._extras import install_hint, missing_module
from ..errors import DeviceError, QkanPackError, ShapeSpecError
from ._output import emit, say

DEBUG_ENV = "QKAN_PACK_DEBUG"
#: An extra argument that looks like a shape (``--shapes 1x4 32x4``).
SHAPE_LIKE = re.compile(r"\d+(x\d+)*( \d+(x\d+)*)*\Z")
#: ``ctx.meta`` key: the option that named the device, when it is not ``--device``.
DEVICE_OPTION = "qkan_pack.device_option"
#: ``ctx.meta`` keys (shared by every context of one run): the running command's own
#: context, and whether it prints its JSON document on stdout.
COMMAND_CONTEXT = "qkan_pack.command_context"
JSON_STDOUT = "qkan_pack.json_stdout"


class Command(click.Command):
    """A command that tells the group's error mapping its own context (a usage error shows
    this command's usage) and whether it answers in JSON on stdout (a failure then prints
    its JSON document too): from the parsed options, or, when parsing itself fails, from
    the arguments as typed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[COMMAND_CONTEXT] = ctx
        ctx.meta[JSON_STDOUT] = _json_typed(self, args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        ctx.meta[JSON_STDOUT] = _json_chosen(self, ctx.params)
        return super().invoke(ctx)


def _json_option(command: click.Command) -> click.Option | None:
    return next((p for p in command.params
                 if isinstance(p, click.Option) and "--json" in p.opts), None)


def _json_chosen(command: click.Command, params: Mapping[str, Any]) -> bool:
    """Whether the parsed options print JSON on stdout: a ``--json`` flag, or bench's
    ``--json`` without a file (bench-serve's ``--json FILE`` writes a file)."""
    option = _json_option(command)
    value = params.get(option.name) if option is not None and option.name else None
    return value is True or (option is not None and option.flag_value == "-"
                             and value == Path("-"))


def _json_typed(command: click.Command, args: Sequence[str]) -> bool:
    """Whether the arguments ask for JSON on stdout: ``--json`` as a flag (build, inspect,
    verify, warm), or without a file after it (bench)."""
    option = _json_option(command)
    if option is None or "--json" not in args:
        return False
    if option.is_flag:
        return True
    after = list(args)[list(args).index("--json") + 1:]
    return option.flag_value == "-" and (not after or after[0].startswith("-"))


class Group(click.Group):
    """Maps every library error to ``Error: <message>`` and exit 1 (the one mapping); with
    ``--json``, every failure is also the command's one JSON document on stdout."""

    command_class = Command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            extra = re.search(r"unexpected extra arguments? \((.*)\)", exc.message)
            if extra and SHAPE_LIKE.match(extra.group(1)):
                # click types the message Final; amending it before it is shown is ours to do
                exc.message += ("; shapes are joined by commas, without spaces: "  # type: ignore[misc]
                                "--shapes 1x4,32x4")
            _usage_failure(ctx, exc)
            raise
        except click.exceptions.Exit:
            raise
        except (click.ClickException, click.Abort) as exc:
            _json_failure(ctx, exc, exc.format_message() if isinstance(exc, click.ClickException)
                          else "aborted")
            raise
        except KeyboardInterrupt as exc:
            _json_failure(ctx, exc, "interrupted")
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        except DeviceError as exc:  # name the option the user typed
            flag = ctx.meta.get(DEVICE_OPTION, "--device")
            option = f"{flag} {exc.requested}"
            hint = f"; use {flag} {exc.suggestion}" if exc.suggestion else ""
            if exc.usage:
                raise _usage_failure(ctx, click.BadParameter(
                    f"{exc.requested!r}: {exc.problem}", param_hint=flag), exc) from None
            _fail(exc, known=True, text=f"{option}: {exc.problem}{hint}")
        except ShapeSpecError as exc:  # text the user typed: a usage error wherever it is found
            raise _usage_failure(ctx, click.UsageError(str(exc)), exc) from None
        except QkanPackError as exc:
            _fail(exc, known=True)
        except ModuleNotFoundError as exc:  # an optional library this command needs
            module = missing_module(exc) or str(exc)
            _fail(exc, known=True, text=f"this needs {module}, which is not installed: "
                                        f"{install_hint(module)}")
        except OSError as exc:  # read-only file system, permissions: the path and the reason
            where = exc.filename if exc.filename is not None else "a file"
            _fail(exc, known=True, text=f"cannot access {where}: {exc.strerror or exc}")
        except Exception as exc:
            _fail(exc, known=False)


def _usage_failure(ctx: click.Context, usage: click.UsageError,
                   cause: BaseException | None = None) -> click.UsageError:
    """``usage``, shown with the usage of the command that failed (not the group's), and
    with ``--json`` also as the JSON document (typed as ``cause``, the library's error,
    when there is one)."""
    if usage.ctx is None or usage.ctx is ctx:
        usage.ctx = ctx.meta.get(COMMAND_CONTEXT, ctx)
        usage.cmd = usage.ctx.command  # type: ignore[misc]  # click types it Final
    _json_failure(ctx, cause or usage, usage.format_message())
    return usage


def _json_failure(ctx: click.Context | None, exc: BaseException, message: str) -> None:
    """With ``--json``, a failure as the command's one JSON document on stdout:
    ``{"ok": false, "error": {"type", "message", <the error's fields>}}`` (the message as
    stderr says it; the exit status is the failure's)."""
    if ctx is None or not ctx.meta.get(JSON_STDOUT):
        return
    fields = {key: _plain(value) for key, value in vars(exc).items()
              if isinstance(exc, QkanPackError) and not key.startswith("_")
              and key not in ("type", "message")}
    emit({"ok": False, "error": {"type": type(exc).__name__, "message": message, **fields}})


def _plain(value: Any) -> Any:
    """An error field as strict JSON: containers as lists and objects, non-finite floats as
    null, anything else as text."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


def _fail(exc: BaseException, *, known: bool, text: str | None = None) -> None:
    """Exit 1 with one ``Error:`` line (made visible), or re-raise under ``QKAN_PACK_DEBUG=1``."""
    if os.environ.get(DEBUG_ENV) == "1":
        raise exc
    message = text or (" ".join(str(exc).split()) if known
                       else f"unexpected {type(exc).__name__}: {exc}")
    _json_failure(click.get_current_context(silent=True), exc, message)
    say(f"Error: {message}", err=True)
    if not known:
        click.echo(f"(set {DEBUG_ENV}=1 to see the traceback)", err=True)
    sys.exit(1)
