"""Where a tool may write: the one refusal of output paths that would break something.

``build``, ``warm`` and ``sign`` write whole artifacts, ``predict -o`` a file of outputs;
each refuses, before anything changes on disk, a path inside an existing artifact (a file
there that its manifest does not list makes the artifact unreadable, and a file it does list
would be replaced: ``-o art/manifest.json``), the working directory or one above it, and a
protected folder (the model's own). It lives here, below the tools, so that every tool asks
the same question; stdlib only, so that it imports with the package.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import ArtifactError
from ..format import MANIFEST_NAME

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["output_path", "refuse_unsafe_output"]


def output_path(target: str | os.PathLike[str]) -> Path:
    """The absolute output path: ``.`` and ``..`` resolved (their names would make the lock
    and staging land inside the artifact), the parent's symlinks resolved, the name kept
    (a symlink at the target itself is refused later, not followed)."""
    absolute = Path(os.path.abspath(target))
    if not absolute.name:
        raise ArtifactError(f"output path {target} is the file-system root; choose a directory")
    return absolute.parent.resolve() / absolute.name


def refuse_unsafe_output(target: Path, protect: Sequence[str | os.PathLike[str]] = ()) -> None:
    """Refuse, before anything changes on disk, an output that would break something: inside
    an existing artifact (a nested directory it does not list, a lock or staging file in it,
    one of its own files), the working directory or one above it, or a protected folder (the
    model's) or one above. ``target`` is absolute (``output_path``)."""
    for folder in target.parents:
        if (folder / MANIFEST_NAME).is_file():
            raise ArtifactError(
                f"output path {target} lies inside the artifact {folder}; writing there would "
                "break it (an artifact holds only the files its manifest lists): choose a path "
                "outside it", path=str(target))
    cwd = Path.cwd().resolve()
    if cwd == target or target in cwd.parents:
        raise ArtifactError(
            f"output path {target} is or contains the working directory {cwd}; replacing it "
            "would pull the directory from under you: choose another -o (a new folder)",
            path=str(target))
    for protected in protect:
        kept = Path(protected).resolve()
        if kept == target or target in kept.parents:
            raise ArtifactError(
                f"output path {target} is or contains the model's folder {kept}; replacing it "
                "would delete the model: choose another output", path=str(target))
