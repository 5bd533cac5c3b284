"""Where a model repository's versions are deployed and how the ingress finds them: one Ray
Serve application per model version (and per generation of it: a reload deploys the new one
beside the serving one), named and routed by the rules here, which the repository's router
(``_router``) deploys by and HAProxy's config rewrite (``_haproxy``) reads back. Stdlib
only: the HAProxy wrapper imports it on every reload.

A version's application listens at a route prefix no client path begins with
(``/qkan-pack/models/<name>/versions/<version>/g<generation>``): the ingress sends a client's
request there with its path appended whole (``/models/mlp`` becomes
``<prefix>/models/mlp``), and the replica, which strips its prefix (Ray Serve's root path),
sees the path the client sent.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: The application of the repository's router: everything the versions' applications do
#: not take (``GET /``, ``/v2/repository/...``, ``/metrics``, unknown names...).
ROUTER_APP = "qkan-pack"
#: Where the versions' applications listen (``route_prefix``).
MODEL_ROUTES = "/qkan-pack/models"
_PREFIX = re.compile(r"/qkan-pack/models/([A-Za-z0-9][A-Za-z0-9._-]{0,127})/versions/"
                     r"([1-9][0-9]{0,17})/g([1-9][0-9]{0,17})\Z")
#: The file in the serve's work directory that tells HAProxy's config rewrite each version's
#: admission bounds, by route prefix (written by whoever deploys the version).
ADMISSION_FILE = "repository-admission.json"
#: HAProxy's pattern files of the router's choices (``publish_routes``): the generation each
#: model's requests without a version go to, one application name a line; and the one
#: ``POST /`` goes to (none unless the repository serves one model).
DEFAULTS_FILE = "repository-defaults.acl"
ROOT_FILE = "repository-root.acl"


@dataclass(frozen=True, order=True)
class Generation:
    """One deployment of a model version: ``generation`` counts its deployments."""

    model: str
    version: int
    generation: int

    @property
    def app(self) -> str:
        """The Ray Serve application's name (``serve status`` shows it)."""
        return f"{self.model}.v{self.version}.g{self.generation}"

    @property
    def prefix(self) -> str:
        return f"{MODEL_ROUTES}/{self.model}/versions/{self.version}/g{self.generation}"

    @property
    def label(self) -> str:
        return f"{self.model}/{self.version}"


def generation_of(prefix: str) -> Generation | None:
    """The generation an application's route prefix belongs to (None: not a version's)."""
    found = _PREFIX.match(prefix)
    return None if found is None else Generation(found[1], int(found[2]), int(found[3]))


def write_admission(workdir: str | os.PathLike[str], bounds: Mapping[str, tuple[int, int, int]]
                    ) -> None:
    """Record each version's (at work, waiting, Retry-After) bounds by route prefix, whole
    or not at all (a reload reading it half-written would take the bounds away)."""
    path = Path(workdir) / ADMISSION_FILE
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({k: list(v) for k, v in sorted(bounds.items())}))
    os.replace(temporary, path)


def publish_routes(workdir: str | os.PathLike[str],
                   choice: tuple[Iterable[str], str | None] | None) -> list[str]:
    """Write the router's ``choice`` (the default generation of each model, and the one of
    ``POST /``) into HAProxy's pattern files, each whole; return the admin socket commands
    that tell a running HAProxy the same (its config reads the files only when it loads).
    ``choice`` None: create the files empty where they are missing, and nothing else."""
    files: dict[Path, list[str]] = {Path(workdir) / DEFAULTS_FILE: [], Path(workdir) / ROOT_FILE: []}
    if choice is None:
        for path in files:
            if not path.exists():
                path.write_text("")
        return []
    defaults, root = choice
    files = {Path(workdir) / DEFAULTS_FILE: sorted(defaults),
             Path(workdir) / ROOT_FILE: [root] if root else []}
    commands = []
    for path, apps in files.items():
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text("".join(f"{app}\n" for app in apps))
        os.replace(temporary, path)
        # between the clear and the adds a request finds no default: the router takes it
        commands += [f"clear acl {path.resolve()}",
                     *(f"add acl {path.resolve()} {app}" for app in apps)]
    return commands


def read_admission(workdir: str | os.PathLike[str]) -> dict[str, tuple[int, int, int]]:
    """What ``write_admission`` recorded ({} where nothing was, or it cannot be read)."""
    try:
        data = json.loads((Path(workdir) / ADMISSION_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in data.items()
            if isinstance(v, list) and len(v) == 3}
