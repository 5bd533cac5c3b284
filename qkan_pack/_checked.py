"""The frame of the option dataclasses (``runtime.LoadOptions``, ``builder.BuildOptions``):
each is frozen and checks every field once, in ``__post_init__``, before anything is read or
run; a call's keywords become one through ``from_keywords``, where an unknown keyword is a
``TypeError`` naming the known ones. A leaf: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, fields
from typing import Any, ClassVar, TypeVar

_Options = TypeVar("_Options", bound="CheckedOptions")


class CheckedOptions:
    """Base of a frozen options dataclass; ``CALL`` names the call that takes its fields as
    keywords (``"build()"``), as its ``TypeError`` says it."""

    CALL: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def _keep(self, checked: Mapping[str, Any]) -> None:
        """Set the checked values (``__post_init__``'s) on the frozen instance."""
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_keywords(cls: type[_Options], keywords: Mapping[str, Any]) -> _Options:
        """Options from ``CALL(**keywords)``; an unknown keyword names the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise TypeError(f"{cls.CALL} got unknown option(s) {unknown}; "
                            f"options: {sorted(known)}")
        return cls(**keywords)
