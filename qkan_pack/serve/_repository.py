"""A model repository as Triton Inference Server lays one out, read and checked before anything
of it serves: ``REPO/<name>/<version>/``, each version an artifact, and per model an optional
``REPO/<name>/qkan-pack.toml`` of deployment settings (``MODEL_CONFIG``)::

    models/
      classifier/
        qkan-pack.toml        replicas = 2, max_batch_size = 32, ...
        1/  manifest.json ...
        2/  manifest.json ...
      detector/
        1/  manifest.json ...

The directory names are authoritative: a model is served as ``<name>`` and a version as
``<version>`` (a positive integer), and an artifact whose manifest names another model or
version (``build --name``, ``--model-version``) is refused, so that what a client asks for by name
is what was built under that name. A directory with ``manifest.json`` at its root is one
artifact (``serve DIR``); anything else given to ``serve`` is read as a repository
(``is_artifact``).

Every version is verified as ``serve DIR`` verifies its artifact (every file's digest, the
signature with ``--key``) before it is deployed, and each replica is pinned to the digest
verified here (``VersionPlan.digest``). A version directory may be a symlink (Triton's users
keep versions elsewhere): its real directory, resolved at each scan, is what is verified and
loaded; a symlink to nothing is a problem named as such. A model's settings are the command line's with its
config file's on top (``_settings``: the same keys and readers as ``app_builder``'s); an
unknown key is refused. Problems are gathered, not raised one by one: one error names every
one of them (``RepositoryError.problems``).

No Ray here: the launcher and the repository's router (``_router``) deploy what is planned.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FileReadError, PlacementError, QkanPackError, RepositoryError
from ..format import MANIFEST_NAME, MODEL_NAME
from ._settings import READERS, TEXT_SETTINGS, apply_settings, load_options, read_setting

if TYPE_CHECKING:
    from ..format import Manifest
    from ._app import ServeOptions

#: A model's settings file, beside its version directories.
MODEL_CONFIG = "qkan-pack.toml"
#: Triton's model configuration file, which a migrated repository may still hold.
TRITON_CONFIG = "config.pbtxt"
MAX_CONFIG_BYTES = 64 * 1024
#: A version directory's name: a positive integer, no sign or leading zero (``1``, ``12``).
VERSION_DIR = re.compile(r"[1-9][0-9]{0,17}\Z")
LAYOUT_HINT = ("lay a repository out as REPO/<name>/<version>/, each version an artifact "
               "(a directory with manifest.json), versions numbered 1, 2, ...")


def is_artifact(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is one artifact (``manifest.json`` at its root, even a broken link:
    the artifact reader then says what is wrong with it) rather than a repository."""
    manifest = Path(path) / MANIFEST_NAME
    return manifest.exists() or manifest.is_symlink()


@dataclass(frozen=True)
class VersionDir:
    model: str
    version: int
    path: Path

    @property
    def label(self) -> str:
        return f"{self.model}/{self.version}"


@dataclass(frozen=True)
class ModelDir:
    """A model's directory: its versions (ascending) and its config file, if any."""

    name: str
    path: Path
    versions: tuple[VersionDir, ...]
    config: Path | None = None
    #: Triton's ``config.pbtxt`` where the directory holds one: not read (``unread_config``).
    triton_config: Path | None = None

    def unread_config(self) -> str | None:
        """What to tell a user whose model directory holds Triton's configuration, which
        serve does not read (its version policy, batching and instances would otherwise
        be silently ignored), or None."""
        if self.triton_config is None:
            return None
        return (f"WARNING: {self.name}/{TRITON_CONFIG} is Triton's model configuration, which "
                f"qkan-pack does not read: every version directory of {self.name} serves, and "
                f"its settings (max_batch_size, replicas, ...) go in {self.name}/{MODEL_CONFIG} "
                "(docs/serving.md#a-models-settings-qkan-packtoml)")


def _visible(directory: Path) -> list[Path]:
    """The entries of ``directory`` a repository is made of (hidden ones, such as ``.git``
    or an editor's files, are not), sorted by name."""
    return sorted((p for p in directory.iterdir() if not p.name.startswith(".")),
                  key=lambda p: p.name)


def model_names(root: str | os.PathLike[str]) -> list[str]:
    """The model directories in ``root`` (whether or not they are laid out right)."""
    return [p.name for p in _visible(Path(root)) if p.is_dir()]


def version_numbers(path: Path) -> list[int]:
    """The versions the directories in model directory ``path`` are named for, whether or
    not each holds an artifact ([] where ``path`` cannot be read)."""
    try:
        return sorted(int(p.name) for p in _visible(path) if VERSION_DIR.match(p.name)
                      and p.is_dir())
    except OSError:
        return []


def scan_model(root: str | os.PathLike[str], name: str) -> ModelDir:
    """``root/name`` as a model: its version directories and config file; RepositoryError
    naming every problem (a name that is no model name, a version directory that is no
    positive integer or no artifact, no version at all)."""
    problems: list[str] = []
    model = _scan_model(Path(root) / name, problems)
    if problems or model is None:
        raise RepositoryError(path=str(root), problems=problems or [f"{name}: no such model"],
                              hint=LAYOUT_HINT)
    return model


def _scan_model(path: Path, problems: list[str]) -> ModelDir | None:
    name = path.name
    if not MODEL_NAME.match(name):
        shown = name if len(name) <= 40 else f"{name[:40]}..."
        problems.append(f"{shown!r}: not a model name (letters, digits, '.', '_' and '-', "
                        "starting with a letter or digit, at most 128 characters: it is part "
                        "of the protocol's URLs)"
                        + (f"; it has {len(name)} characters" if len(name) > 128 else ""))
        return None
    if not path.is_dir():
        problems.append(_dangling(name, path) or f"{name}: not a directory")
        return None
    if is_artifact(path):
        problems.append(f"{name}: this is an artifact, not a model's directory; move it into "
                        f"{name}/1/ (a version directory)")
        return None
    versions, config, triton_config = [], None, None
    for entry in _visible(path):
        label = f"{name}/{entry.name}"
        if entry.name == MODEL_CONFIG:
            config = entry
        elif entry.name == TRITON_CONFIG:
            triton_config = entry
        elif not entry.is_dir():  # a label file, a README: Triton's model directories hold
            if VERSION_DIR.match(entry.name):  # such files too; not named as a version
                problems.append(_dangling(label, entry) or f"{label}: a file, not a version "
                                "directory (a directory holding an artifact)")
        elif not VERSION_DIR.match(entry.name):
            problems.append(f"{label}: a version directory is named by a positive integer "
                            "(1, 2, ...)")
        elif not is_artifact(entry):
            problems.append(f"{label}: not an artifact (no {MANIFEST_NAME}): build into it "
                            "with qkan-pack build -o")
        else:  # a symlinked version (as Triton's users make them): its real directory
            versions.append(VersionDir(name, int(entry.name),
                                       entry.resolve() if entry.is_symlink() else entry))
    if not versions and not any(p.startswith(f"{name}/") for p in problems):
        problems.append(f"{name}: no version directory ({name}/1/, {name}/2/, ...)")
    return ModelDir(name, path, tuple(sorted(versions, key=lambda v: v.version)), config,
                    triton_config)


def _dangling(label: str, path: Path) -> str | None:
    """The problem of ``path`` if it is a symlink to nothing (None otherwise)."""
    if not path.is_symlink() or path.exists():
        return None
    return f"{label}: a symlink to {os.readlink(path)}, which does not exist"


def scan_repository(root: str | os.PathLike[str]) -> list[ModelDir]:
    """Every model of the repository at ``root``; RepositoryError naming every problem."""
    root = Path(root)
    if not root.is_dir():
        raise RepositoryError(path=str(root), problems=[
            "not a directory" if root.exists() else "no such directory"],
            hint="give an artifact's directory or a model repository")
    problems: list[str] = []
    problems += [problem for p in _visible(root) if (problem := _dangling(p.name, p))]
    models = [m for p in _visible(root) if p.is_dir()
              if (m := _scan_model(p, problems)) is not None]
    if not models and not problems:
        problems.append(f"holds no model and is no artifact (no {MANIFEST_NAME})")
    if problems:
        raise RepositoryError(path=str(root), problems=problems, hint=LAYOUT_HINT)
    return models


# -- a model's settings ---------------------------------------------------------------


def _toml() -> Any:
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    import tomli  # type: ignore[import-not-found]  # the serve extra declares it below 3.11

    return tomli


def read_model_config(model: ModelDir) -> dict[str, Any]:
    """The settings of ``model``'s config file, each read as ``_settings`` reads it ({} with
    no file); RepositoryError naming the file and every key it refuses."""
    if model.config is None:
        return {}
    where = f"{model.name}/{MODEL_CONFIG}"
    try:
        text = _read_config(model.config)
        table = _toml().loads(text)
    except (FileReadError, UnicodeDecodeError, ValueError) as exc:  # TOMLDecodeError: ValueError
        raise RepositoryError(path=str(model.path.parent), problems=[f"{where}: {exc}"]) from None
    problems, read = [], {}
    for key, value in table.items():
        problem = _setting_problem(key, value)
        if problem is None:
            read[key] = read_setting(key, value)
        else:
            problems.append(f"{where}: {key} = {value!r}: {problem}")
    if problems:
        raise RepositoryError(path=str(model.path.parent), problems=problems,
                              hint=f"a model's settings are {', '.join(READERS)}")
    return read


def _read_config(path: Path) -> str:
    from ..runtime import read_regular_file  # here: importing this module loads no torch

    return read_regular_file(path, limit=MAX_CONFIG_BYTES).decode("utf-8")


def _setting_problem(key: str, value: Any) -> str | None:
    if key not in READERS:
        return "unknown setting"
    if isinstance(value, (dict, list)):
        return "a setting is one value, not a table or array"
    if isinstance(value, str) and key not in TEXT_SETTINGS:
        return "give a number or true/false, not text"
    try:
        read_setting(key, value)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


# -- versions, verified and planned ----------------------------------------------------


def name_problem(manifest: Manifest, version: VersionDir) -> str | None:
    """Why an artifact cannot serve as ``version`` (its manifest names another model or
    version), or None. A manifest without a name or version is named by the directory."""
    metadata = manifest.metadata
    if metadata.name and metadata.name != version.model:
        return (f"{version.label}: its manifest names model {metadata.name!r}, the directory "
                f"{version.model!r}: build it with --name {version.model}, or move it to "
                f"{metadata.name}/{version.version}/")
    if metadata.version and metadata.version != str(version.version):
        return (f"{version.label}: its manifest names version {metadata.version!r}, the "
                f"directory {version.version}: build it with --model-version {version.version}, or "
                f"move it to a version directory of that number")
    return None


@dataclass(frozen=True)
class VersionPlan:
    """A version ready to deploy: verified, with its settings. ``key`` tells a changed
    version (new bytes or settings) from the one already serving."""

    model: str
    version: int
    path: str
    digest: str
    options: ServeOptions
    predictor_options: Mapping[str, Any] | None = None
    signed_by: str | None = None
    #: The settings its model's config file gave (which of them it chose, not defaults).
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.model}/{self.version}"

    @property
    def key(self) -> tuple[str, str]:
        return self.digest, repr((self.options, sorted((self.predictor_options or {}).items())))


@dataclass(frozen=True)
class Defaults:
    """What every model starts from: the command line's options (its model name and version
    are each version's own), trusted keys, precision and compiled mode; the per-replica CPUs and GPUs of a
    model whose config sets none (``share``, filled at start from the cluster)."""

    options: ServeOptions
    keys: tuple[str, ...] = ()
    precision: str = "recorded"
    compiled: str = "auto"
    cpus_per_replica: float | None = None
    gpus_per_replica: float | None = None


Problems = list[tuple[int | None, str]]


def plan_model(model: ModelDir, defaults: Defaults) -> tuple[list[VersionPlan], Problems]:
    """Each version of ``model`` verified and given its settings; the problems of those that
    cannot serve, by version (None: every version, the config file being refused)."""
    try:
        settings = read_model_config(model)
    except RepositoryError as exc:
        return [], [(None, p) for p in exc.problems]
    try:
        options = model_options(defaults, settings)
    except QkanPackError as exc:  # ServeOptions' range check
        return [], [(None, f"{model.name}/{MODEL_CONFIG}: {exc}")]
    plans: list[VersionPlan] = []
    problems: Problems = []
    for version in model.versions:
        try:
            plans.append(plan_version(version, options, defaults, settings))
        except RepositoryError as exc:
            problems += [(version.version, p) for p in exc.problems]
        except QkanPackError as exc:
            problems.append((version.version, f"{version.label}: {exc}"))
        except OSError as exc:
            problems.append((version.version, f"{version.label}: cannot read it ({exc})"))
    return plans, problems


def model_options(defaults: Defaults, settings: Mapping[str, Any]) -> ServeOptions:
    """A model's options: the command line's, its config's on top, resources by ``share``."""
    options = apply_settings(defaults.options, settings)
    resources = {key: getattr(defaults, key) for key in ("cpus_per_replica", "gpus_per_replica")
                 if key not in settings and getattr(defaults, key) is not None}
    return dataclasses.replace(options, **resources)


def plan_version(version: VersionDir, options: ServeOptions, defaults: Defaults,
                 settings: Mapping[str, Any]) -> VersionPlan:
    """``version`` verified (``read_artifact``: digests, and the signature with keys) and its
    manifest's names checked; RepositoryError, or the reader's own error, when it cannot."""
    from ..runtime import read_artifact

    artifact = read_artifact(version.path, trusted_keys=list(defaults.keys))
    problem = name_problem(artifact.manifest, version)
    if problem is not None:
        raise RepositoryError(path=str(version.path.parent.parent), problems=[problem])
    options = dataclasses.replace(options, model_name=version.model,
                                  model_version=str(version.version)).for_artifact(
        artifact.manifest)
    load = load_options(defaults.keys, settings.get("precision", defaults.precision),
                        settings.get("compiled", defaults.compiled))
    return VersionPlan(version.model, version.version, os.path.abspath(artifact.path),
                       artifact.digest, options, load, artifact.signed_by, dict(settings))


def plan_repository(models: Iterable[ModelDir], defaults: Defaults) -> list[VersionPlan]:
    """Every version of every model planned; RepositoryError naming every problem."""
    models = list(models)
    plans: list[VersionPlan] = []
    problems: list[str] = []
    for model in models:
        found, wrong = plan_model(model, defaults)
        plans += found
        problems += [text for _, text in wrong]
    if problems:
        raise RepositoryError(path=str(_common_root(models)), problems=problems)
    return plans


def _common_root(models: Iterable[ModelDir]) -> Path | str:
    return next((m.path.parent for m in models), "")


def share(plans: Sequence[VersionPlan], cpus: float | None, gpus: float | None,
          resources: Mapping[str, float]) -> tuple[float, float]:
    """The CPUs and GPUs per replica of a model whose config sets none: the command line's,
    else an even share of what the models that set theirs leave, with room kept for one
    model's reload (a new generation starts beside the serving one: ``_router``), counted
    as the largest model's replicas. CPUs: ``_placement.cpu_share`` (at most 1, in
    hundredths, at least ``MIN_CPU_SHARE``); GPUs: at most 1, none on a cluster without.
    PlacementError, naming each model's replicas, when the versions cannot all be placed."""
    from ._placement import EPSILON, MIN_CPU_SHARE, cpu_share

    have = {"CPU": float(resources.get("CPU", 0)), "GPU": float(resources.get("GPU", 0))}
    given = {"CPU": cpus, "GPU": gpus}
    replicas: dict[str, int] = {}
    for plan in plans:
        replicas[plan.model] = replicas.get(plan.model, 0) + plan.options.replicas
    spare = max(replicas.values(), default=0)
    chosen = {}
    for kind, key in (("CPU", "cpus_per_replica"), ("GPU", "gpus_per_replica")):
        own = sum(p.options.replicas * getattr(p.options, key) for p in plans if key in p.settings)
        rest = sum(p.options.replicas for p in plans if key not in p.settings)
        each = given[kind]
        if each is None:
            left = max(0.0, have[kind] - own)
            room = rest + spare
            each = cpu_share(left, room) if kind == "CPU" else \
                (min(1.0, left / room) if room and left else 0.0)
        if own + rest * each > have[kind] + EPSILON:
            least = (f"{MIN_CPU_SHARE:g} CPU is the least a replica is given: "
                     if given[kind] is None and kind == "CPU" else "")
            raise PlacementError(
                kind=kind, replicas=replicas, need=own + rest * each, have=have[kind],
                each=None if own else each,
                hint=f"{least}lower replicas or {key} in the models' {MODEL_CONFIG}, or "
                f"--{kind.lower()}s-per-replica")
        chosen[kind] = each
    return chosen["CPU"], chosen["GPU"]


def with_share(plan: VersionPlan, cpus: float, gpus: float) -> VersionPlan:
    """``plan`` with the shared resources where its model's config sets none."""
    shared = (("cpus_per_replica", cpus), ("gpus_per_replica", gpus))
    fill: dict[str, Any] = {key: value for key, value in shared if key not in plan.settings}
    return dataclasses.replace(plan, options=dataclasses.replace(plan.options, **fill))
