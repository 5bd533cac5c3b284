"""Serve settings given as key/value pairs outside the command line, read one way wherever
they come from: ``app_builder``'s arguments (a Ray Serve config file, ``serve run``'s
``key=value``) and a model repository's per-model ``qkan-pack.toml`` (``_repository``).

Each key is read by one function (``READERS``) and lands on one field of ``ServeOptions``
(or its ``HttpLimits``) through ``apply_settings``: the key names are the command line's
(``--max-ongoing-requests`` is ``max_ongoing_requests``), the types and ranges are
``ServeOptions``' own (its constructor checks them), nothing is declared twice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..format import COMPILED_MODES, PRECISIONS
from ._app import MAX_BATCH_SIZE, MAX_GRACE_S, MAX_REPLICAS, ServeOptions


def _boolean(text: Any) -> bool:
    """true or false: a boolean, or its text (``serve run``'s ``key=value``); never 1, 0,
    yes or no, which a boolean setting's docs do not promise."""
    if isinstance(text, bool):
        return text
    if isinstance(text, str) and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise ValueError("not true or false")


def _finite(text: Any) -> float:
    if isinstance(text, bool):
        raise ValueError("not a number")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _integer(text: Any) -> int:
    """A whole number: 2 or "2", never 1.7 (which ``int`` would truncate) or true."""
    if isinstance(text, bool) or not (isinstance(text, int) or str(text).strip().isdigit()):
        raise ValueError("not a whole number")
    return int(text)


def text_value(value: Any) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ValueError("not text")
    return str(value)


def _within(low: float, high: float, number: Callable[[Any], Any] = _finite
            ) -> Callable[[Any], Any]:
    """A reader of ``number`` (a finite number, or ``_integer``) from ``low`` to ``high``."""
    def read(text: Any) -> Any:
        value = number(text)
        if not low <= value <= high:
            raise ValueError(f"outside [{low:g}, {high:g}]")
        return value
    return read


def _one_of(allowed: Sequence[str], told: str) -> Callable[[Any], str]:
    """A reader of a text setting that must be one of ``allowed`` (refused as ``give
    <told>``)."""
    def read(value: Any) -> str:
        text = text_value(value)
        if text not in allowed:
            raise ValueError(f"give {told}")
        return text
    return read


#: How the text of each deployment setting is read (a YAML or TOML value, or ``key=value``).
READERS: Mapping[str, Callable[[Any], Any]] = {
    "replicas": _within(1, MAX_REPLICAS, _integer), "gpus_per_replica": _finite,
    "cpus_per_replica": _finite, "device": text_value,
    "max_batch_size": _within(1, MAX_BATCH_SIZE, _integer), "max_batch_wait_ms": _finite,
    "exact": _boolean, "max_ongoing_requests": _integer, "max_queued_requests": _integer,
    "max_body_mb": _within(0.001, 65536.0), "body_timeout_s": _within(0.1, 86400.0),
    "grace_s": _within(0, MAX_GRACE_S),
    "precision": _one_of(("recorded", *PRECISIONS), f"recorded or one of {', '.join(PRECISIONS)}"),
    "compiled": _one_of(COMPILED_MODES, f"one of {', '.join(COMPILED_MODES)}"),
}
#: Settings that are text by nature (a TOML file must give the others as numbers or
#: booleans: ``replicas = "2"`` is a typo there, not a value).
TEXT_SETTINGS = frozenset({"device", "precision", "compiled"})
#: ``ServeOptions`` fields set by a setting of the same name.
_OPTION_FIELDS = ("replicas", "gpus_per_replica", "cpus_per_replica", "device",
                  "max_batch_size", "max_batch_wait_ms", "exact", "grace_s")


def read_setting(key: str, value: Any) -> Any:
    """``value`` read as setting ``key`` (``ValueError`` saying what is wrong with it)."""
    return READERS[key](value)


def apply_settings(options: ServeOptions, read: Mapping[str, Any]) -> ServeOptions:
    """``options`` with each read setting in ``read`` replacing its field (keys outside
    ``READERS``, and ``precision`` and ``compiled``, which are the load's, are left to the
    caller). The result
    is checked as every ``ServeOptions`` is (ranges: ``ServeError``)."""
    limits = options.limits
    if "max_ongoing_requests" in read:
        limits = dataclasses.replace(limits, max_ongoing=read["max_ongoing_requests"])
    if "max_queued_requests" in read:
        limits = dataclasses.replace(limits, max_queued=read["max_queued_requests"])
    if "max_body_mb" in read:
        limits = dataclasses.replace(limits, max_body_bytes=int(read["max_body_mb"] * 2**20))
    if "body_timeout_s" in read:
        limits = dataclasses.replace(limits, body_timeout_s=read["body_timeout_s"])
    fields = {key: read[key] for key in _OPTION_FIELDS if key in read}
    return dataclasses.replace(options, **fields, limits=limits)


def load_options(keys: Sequence[str], precision: str = "recorded",
                 compiled: str = "auto") -> dict[str, Any] | None:
    """What each replica passes ``Predictor.load`` beyond the artifact (None: nothing): the
    keys, and the precision and compiled mode where they are not the defaults."""
    options: dict[str, Any] = {"trusted_keys": list(keys)} if keys else {}
    if precision != "recorded":
        options["precision"] = precision
    if compiled != "auto":
        options["compiled"] = compiled
    return options or None
