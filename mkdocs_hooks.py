"""MkDocs hook: fences tagged for the documentation tests (``python gpu``, ``bash ray``...,
see tests/test_readme.py) render as their language.

Python-Markdown's fenced-code parser takes one word after the fence; the second word only
tells the tests where a block runs, so it is dropped for the site.
"""

from __future__ import annotations

import re
from typing import Any

RUN_TAG = re.compile(r"^(?P<fence> *```)(?P<lang>python|bash) (?:gpu|sign|ray)[ ]*$", re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return RUN_TAG.sub(r"\g<fence>\g<lang>", markdown)
