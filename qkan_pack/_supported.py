"""The releases of each library whose private internals qkan-pack reaches into, stated once.

Each seam (``runtime/_triton_compat``, ``runtime/_signing_compat``, ``serve/_ray_compat``,
``serve/_uvicorn_compat``) checks the installed release against its range here, and says so in
one message (``ReleaseRange.outside``) when it refuses one; ``qkan-pack --version`` lists them;
a test holds the requirements ``pyproject.toml`` declares to them, so that pip never installs a
release a seam refuses. A leaf: it imports none of those libraries (nor torch), so reading it costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

#: What the package exports from this module (nothing: qkan-pack's own bookkeeping).
__all__: list[str] = []

#: A release as numbers, most significant first: ``(3, 7)`` or ``(1, 1, 1)``.
Release = tuple[int, ...]


@dataclass(frozen=True)
class ReleaseRange:
    """The releases ``[low, high)`` of ``library`` a seam was read from; a release is compared
    on as many numbers as ``low`` has (``(3, 2)``: major and minor; ``(1, 1, 1)``: exact)."""

    library: str
    #: Its distribution's name on the package index.
    distribution: str
    low: Release
    high: Release
    #: What depends on it, and what happens outside it (for ``--version``).
    used_for: str

    def admits(self, version: str) -> bool:
        """Whether ``version`` (``X.Y.Z...``, local or pre-release tags after) is in the range;
        an unreadable one is not."""
        parts = version.split("+")[0].split(".")[:len(self.low)]
        try:
            release = tuple(int(part) for part in parts)
        except ValueError:
            return False
        return len(release) == len(self.low) and self.low <= release < self.high

    @property
    def pip_specifier(self) -> str:
        """The range as a pip requirement's specifier (``>=3.2,<3.8``)."""
        if self.single:
            return f"=={_dotted(self.low)}" + (".*" if len(self.low) == 2 else "")
        return f">={_dotted(self.low)},<{_dotted(self.high)}"

    @property
    def single(self) -> bool:
        """Whether the range is one release line (``2.60.x``) or one release (``1.1.1``)."""
        return self.high == (*self.low[:-1], self.low[-1] + 1)

    def __str__(self) -> str:
        """``3.2–3.7``, ``2.60.x``, ``1.1.1``, or ``0.30–0.x`` (up to the next major)."""
        if self.single:
            return _dotted(self.low) + (".x" if len(self.low) == 2 else "")
        if self.low[:-1] == self.high[:-1]:
            return f"{_dotted(self.low)}–{_dotted((*self.high[:-1], self.high[-1] - 1))}"
        if len(self.low) == 2 and self.high == (self.low[0] + 1, 0):
            return f"{_dotted(self.low)}–{self.low[0]}.x"
        return f"{_dotted(self.low)} up to (not including) {_dotted(self.high)}"

    def outside(self, version: str, consequence: str) -> str:
        """The one version-gate message every seam gives for a release outside the range:
        the release, the range, then what happens instead (or what to do)."""
        return f"{self.library} {version} is outside the supported range {self}; {consequence}"

    def installed(self) -> str:
        """This environment's release, from its metadata (nothing is imported), and whether
        the range admits it: ``3.7.1``, ``3.8.0: outside``, ``not installed``."""
        from importlib import metadata

        try:
            version = metadata.version(self.distribution)
        except metadata.PackageNotFoundError:
            return "not installed"
        return version if self.admits(version) else f"{version}: outside"


def _dotted(release: Release) -> str:
    return ".".join(map(str, release))


TRITON = ReleaseRange("Triton", "triton", (3, 2), (3, 8),
                      "shipped GPU kernels; outside it a load compiles them as usual")
RAY = ReleaseRange("Ray", "ray", (2, 60), (2, 61),
                   "qkan-pack serve; outside it serve refuses to start")
UVICORN = ReleaseRange("uvicorn", "uvicorn", (0, 30), (1, 0),
                       "serve's replies in one socket write; outside it uvicorn writes them")
MODEL_SIGNING = ReleaseRange("model-signing", "model-signing", (1, 1, 1), (1, 1, 2),
                             "signature checks; outside it they are refused")
#: Every range, in the order ``--version`` lists them.
ALL = (TRITON, RAY, UVICORN, MODEL_SIGNING)


def supported_text() -> str:
    """The ranges as ``--version`` shows them, one line each, with what is installed here."""
    rows = [(f"{r.library} {r}", f"({r.installed()})", r.used_for) for r in ALL]
    widths = [max(len(row[column]) for row in rows) + 2 for column in range(2)]
    return "\n".join(f"  {name:<{widths[0]}}{here:<{widths[1]}}{used}" for name, here, used in rows)
