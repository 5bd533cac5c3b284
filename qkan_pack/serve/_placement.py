"""What a Ray cluster can place, checked before anything is deployed: the CPUs a replica
gets where no setting says (``cpu_share``), one artifact's replicas fitted to the cluster
(``fit_resources``), and a model version loaded while serving held to what the cluster has
left (``check_left``). Each refusal is a ``PlacementError`` naming the replicas and the
setting to lower; nothing here deploys. A model repository's share at start is
``_repository.share``, by the same rules.

Why a floor on the share: an even share rounded down to nothing asks nothing of the
cluster, so any number of replicas "fits" — and Ray's controller then tries to start them
all (a million replicas on two CPUs grew it past the host's memory). ``MIN_CPU_SHARE`` keeps
every replica's ask real, and the ordinary check refuses what does not fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import PlacementError

if TYPE_CHECKING:
    from ._app import ServeOptions

#: The least CPU a replica is given by an even share (a hundredth: the share's resolution).
MIN_CPU_SHARE = 0.01
#: Slack for float sums (0.1 + 0.2 CPUs fit in 0.3).
EPSILON = 1e-9


def cpu_share(have: float, replicas: int) -> float:
    """An even share of ``have`` CPUs among ``replicas``: at most 1 CPU, rounded down to
    hundredths, never below ``MIN_CPU_SHARE`` (1 CPU each when there is nothing to share)."""
    if replicas <= 0:
        return 1.0
    return max(MIN_CPU_SHARE, min(1.0, int(100 * have / replicas) / 100))


def fit_resources(options: ServeOptions, cpus: float | None, gpus: float | None,
                  resources: Mapping[str, float]) -> ServeOptions:
    """Fill the defaults from the cluster (CPUs: ``cpu_share``; GPUs: up to one per replica
    where the cluster has any) and refuse what it cannot place (``PlacementError``)."""
    have_cpu, have_gpu = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    shared = cpus is None
    if cpus is None:
        cpus = cpu_share(have_cpu, options.replicas)
    if gpus is None:
        gpus = min(1.0, have_gpu / options.replicas) if have_gpu else 0.0
    for kind, each, have in (("CPU", cpus, have_cpu), ("GPU", gpus, have_gpu)):
        if options.replicas * each > have + EPSILON:
            least = (f"{MIN_CPU_SHARE:g} CPU is the least a replica is given: "
                     if shared and kind == "CPU" else "")
            raise PlacementError(kind=kind, replicas={"": options.replicas},
                                 need=options.replicas * each, have=have, each=each,
                                 hint=f"{least}lower --replicas or --{kind.lower()}s-per-replica")
    return replace(options, cpus_per_replica=cpus, gpus_per_replica=gpus)


def check_left(label: str, options: ServeOptions, left: Mapping[str, float],
               hint: str) -> None:
    """Refuse (``PlacementError``, ``left=True``) to deploy ``options.replicas`` replicas of
    ``label`` where what the cluster has ``left`` (``ray.available_resources()``) cannot
    hold them all: Ray would start what fits and wait for ever for the rest."""
    for kind, each in (("CPU", options.cpus_per_replica), ("GPU", options.gpus_per_replica)):
        need, have = options.replicas * each, float(left.get(kind, 0))
        if need > have + EPSILON:
            raise PlacementError(kind=kind, replicas={label: options.replicas}, need=need,
                                 have=have, each=each, left=True, hint=hint)
