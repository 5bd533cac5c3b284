"""A model repository of ``--models`` artifacts of one model file, for ``qkan-pack
bench-serve REPO`` (its aggregate against one model alone): ``REPO/m1/1`` ... ``REPO/mN/1``,
each built under its own name and version 1, as a repository requires. Artifacts already
there are kept.

    python benchmarks/build_repository.py examples/qkan_mlp.py 1x2,8x2,32x2 /tmp/repo --models 10
    qkan-pack bench-serve /tmp/repo --clients 32,128,512 --rounds 3 --serve-args '--device cuda'
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qkan_pack import build


def build_repository(model: str, shapes: str, root: Path, count: int) -> list[Path]:
    """``count`` artifacts of ``model`` as ``root/m<i>/1`` (reused when there)."""
    built = []
    for i in range(1, count + 1):
        target = root / f"m{i}" / "1"
        if not (target / "manifest.json").exists():
            build(model, shapes, output=target, name=f"m{i}", model_version="1")
        built.append(target)
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the model file every artifact is built from")
    parser.add_argument("shapes", help="build's shapes (1x2,8x2,32x2)")
    parser.add_argument("repository", type=Path, help="where the repository is laid out")
    parser.add_argument("--models", type=int, default=10)
    args = parser.parse_args()
    for path in build_repository(args.model, args.shapes, args.repository, args.models):
        print(path)


if __name__ == "__main__":
    main()
