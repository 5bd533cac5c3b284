"""Side-by-side summary of py-spy profiles of one replica (``--format raw``: collapsed
stacks), one file per protocol (``benchmarks/device/serve-protocols-profile.sh``): the share
of samples and the microseconds per request under each part of the stack, so that a
protocol's extra CPU per request is found by where it is spent.

    python benchmarks/profile_stacks.py r/profile-json.raw r/profile-oip-binary.raw ...

Microseconds per request need the run's req/s: read from ``profile-<protocol>.json`` beside
each raw file (``bench-serve --json``) and the sampling rate and duration given (250 Hz, 6 s).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

#: Parts of a stack, first match from the leaf up names the part a sample is charged to.
PARTS = (("qkan_pack handler", "qkan_pack/serve/_http.py"), ("qkan_pack gRPC", "_grpc_http.py"),
         ("qkan_pack core", "qkan_pack/serve/_model.py"), ("qkan_pack other", "qkan_pack/"),
         ("torch", "torch/"), ("starlette", "starlette/"), ("uvicorn", "uvicorn/"),
         ("ray serve", "ray/serve/"), ("ray other", "ray/"), ("protobuf", "google/protobuf"),
         ("asyncio", "asyncio/"))
FRAME = re.compile(r"(.*) \((.*):(\d+)\)")


def stacks(path: Path) -> list[tuple[list[str], int]]:
    """(frames root first, sample count) per line of a collapsed-stacks file."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            out.append((stack.split(";"), int(count)))
    return out


def short(frame: str) -> str:
    match = FRAME.match(frame)
    if not match:
        return frame
    function, file, _ = match.groups()
    return f"{function} ({file.split('site-packages/')[-1].split('/tmp/site/')[-1]})"


def part_of(frames: list[str]) -> str:
    """The innermost part of the stack a sample is charged to (by file path)."""
    for frame in reversed(frames):
        for name, marker in PARTS:
            if marker in frame:
                return name
    return "other"


def requests_in(results: Path, seconds: float) -> float | None:
    """Requests answered during the sampled seconds, from the run's req/s (its one point in
    ``bench-serve --json``'s results)."""
    if not results.exists():
        return None
    points = json.loads(results.read_text())["curves"]["model"]
    return points[0]["requests_per_s"] * seconds if points else None


def summary(path: Path, rate: float, seconds: float, top: int) -> list[str]:
    """Lines for one profile: samples per part and the hottest functions (self time)."""
    samples = stacks(path)
    total = sum(n for _, n in samples)
    requests = requests_in(path.with_suffix(".json"), seconds)
    per_request = (1e6 / rate / requests) if requests else None
    lines = [f"== {path.name}: {total} samples"
             + (f", {requests / seconds:.0f} req/s, {total * per_request:.0f} us/request sampled"
                if per_request else "")]
    parts: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for frames, n in samples:
        parts[part_of(frames)] += n
        own[short(frames[-1])] += n
    for name, n in parts.most_common():
        lines.append(f"  {name:<18} {100 * n / total:5.1f}%"
                     + (f" {n * per_request:7.1f} us/request" if per_request else ""))
    lines.append("  -- self time")
    for name, n in own.most_common(top):
        lines.append(f"  {100 * n / total:5.1f}% {name}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", nargs="+", type=Path)
    parser.add_argument("--rate", type=float, default=250.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for path in args.raw:
        print("\n".join(summary(path, args.rate, args.seconds, args.top)))


if __name__ == "__main__":
    main()
