"""What importing qkan-pack costs a fresh process, in checkouts side by side.

Each statement runs in a fresh interpreter (``python -c STATEMENT``) with ``PYTHONPATH`` set
to one checkout, the checkouts alternated run by run (A B, then B A; with more than two, the
order also rotates) so that whatever else the host does falls on each alike. Four measures
per statement and checkout:

* importtime: ``-X importtime``'s cumulative microseconds of the top-level imports the
  statement adds to a bare interpreter's (``python -c pass``'s are left out);
* own: the same log's own (self) microseconds of qkan-pack's modules alone, what the
  package's code costs beside what it imports (torch's seconds vary far more than that);
* wall: the whole process, start to exit, timed from outside (``perf_counter`` around it);
* cpu: the process's user + system CPU time (what it cost, less the time it waited for a
  core on a busy host).

Medians of ``--runs`` runs each (after ``--warmup`` untimed runs, which also write the
bytecode caches, in a temporary directory: timed runs read bytecode, as an installed package
does, even where ``PYTHONDONTWRITEBYTECODE`` is set). To set a commit against the working tree:

    git worktree add --detach /tmp/base BASE_COMMIT
    python benchmarks/import_time.py /tmp/base . --runs 30
    python benchmarks/import_time.py /tmp/base /tmp/before . --runs 30   # or several
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STATEMENTS = (
    "import qkan_pack",
    "import qkan_pack.format",
    "from qkan_pack import Predictor",
)

#: One ``-X importtime`` line: self and cumulative microseconds, then the module name
#: indented by two spaces per level of nesting.
IMPORTTIME_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def child_environment(checkout: Path, bytecode: str) -> dict[str, str]:
    """This environment, importing from ``checkout`` and keeping bytecode under ``bytecode``
    (compiled once, as an installed package has it, not at every start; outside the
    checkouts)."""
    environment = {name: value for name, value in os.environ.items()
                   if name != "PYTHONDONTWRITEBYTECODE"}
    return {**environment, "PYTHONPATH": str(checkout), "PYTHONPYCACHEPREFIX": bytecode}


def children_cpu() -> float:
    """User + system seconds of every child this process has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(python: str, checkout: Path, statement: str, importtime: bool,
             bytecode: str) -> tuple[float, float, str]:
    """Run ``statement`` in a fresh interpreter importing from ``checkout``: its wall and CPU
    times in milliseconds and what it wrote to stderr."""
    command = [python, *(["-X", "importtime"] if importtime else []), "-c", statement]
    environment = child_environment(checkout, bytecode)
    cpu, start = children_cpu(), time.perf_counter()
    done = subprocess.run(command, env=environment, cwd=checkout, capture_output=True,
                          text=True, check=False)
    elapsed = (time.perf_counter() - start) * 1e3
    cpu = (children_cpu() - cpu) * 1e3
    if done.returncode != 0:
        raise SystemExit(f"{statement!r} failed in {checkout}:\n{done.stderr}")
    return elapsed, cpu, done.stderr


def top_level_imports(stderr: str) -> dict[str, int]:
    """Cumulative microseconds of each top-level (not nested) import in an importtime log."""
    found = {}
    for line in stderr.splitlines():
        match = IMPORTTIME_LINE.match(line)
        if match and match.group(3) == " ":
            found[match.group(4)] = int(match.group(2))
    return found


def own_import_us(stderr: str, package: str = "qkan_pack") -> int:
    """The self microseconds of ``package``'s own modules in an importtime log."""
    return sum(int(match.group(1)) for line in stderr.splitlines()
               if (match := IMPORTTIME_LINE.match(line))
               and match.group(4).split(".")[0] == package)


def statement_import_us(stderr: str, startup: set[str]) -> int:
    """The microseconds of the top-level imports a statement adds to a bare interpreter's."""
    return sum(us for name, us in top_level_imports(stderr).items() if name not in startup)


def checkout_label(checkout: Path) -> str:
    """The commit a checkout is at, marked ``+changes`` when its tree differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True,
                              text=True, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "?"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "qkan_pack")
    return f"{checkout} @ {commit}{' +changes' if dirty else ''}"


def run_order(count: int, round_: int) -> list[int]:
    """Checkout indices in the order a round runs them: rotated by one each round, and
    reversed every other round, so that each checkout follows each other one equally often."""
    rotated = [(index + round_ // 2) % count for index in range(count)]
    return rotated if round_ % 2 == 0 else rotated[::-1]


def measure(python: str, checkouts: list[Path], statements: list[str], runs: int,
            warmup: int, bytecode: str) -> dict[tuple[str, int], dict[str, list[float]]]:
    """Importtime, own, wall and CPU samples per (statement, checkout index), checkouts
    alternated."""
    _, _, bare = run_once(python, checkouts[0], "pass", True, bytecode)
    startup = set(top_level_imports(bare))
    samples: dict[tuple[str, int], dict[str, list[float]]] = {
        (statement, index): {"importtime": [], "own": [], "wall": [], "cpu": []}
        for statement in statements for index in range(len(checkouts))}
    for round_ in range(warmup + runs):
        for statement in statements:
            for index in run_order(len(checkouts), round_):
                wall, cpu, _ = run_once(python, checkouts[index], statement, False, bytecode)
                _, _, log = run_once(python, checkouts[index], statement, True, bytecode)
                if round_ >= warmup:
                    samples[statement, index]["wall"].append(wall)
                    samples[statement, index]["cpu"].append(cpu)
                    samples[statement, index]["importtime"].append(
                        statement_import_us(log, startup) / 1e3)
                    samples[statement, index]["own"].append(own_import_us(log) / 1e3)
    return samples


def spread(values: list[float]) -> str:
    """The median and the interquartile range, in milliseconds."""
    quartiles = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):8.2f} ({quartiles[0]:.2f}-{quartiles[2]:.2f})"


def table(samples: dict[tuple[str, int], dict[str, list[float]]], statements: list[str],
          count: int) -> str:
    """Medians (interquartile range) per checkout, and each later checkout's median less
    the first's."""
    names = [chr(ord("A") + index) for index in range(count)]
    lines = [" ".join([f"{'statement':34} {'measure':10}",
                       *(f"{name + ': median (IQR) ms':>24}" for name in names),
                       *(f"{name + ' - A ms':>9}" for name in names[1:])])]
    for statement in statements:
        for measure_ in ("importtime", "own", "wall", "cpu"):
            values = [samples[statement, index][measure_] for index in range(count)]
            first = statistics.median(values[0])
            lines.append(" ".join([f"{statement:34} {measure_:10}",
                                   *(f"{spread(v):>24}" for v in values),
                                   *(f"{statistics.median(v) - first:+9.2f}"
                                     for v in values[1:])]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", type=Path, nargs="+",
                        help="checkouts A, B, ... (A: the one the others are compared with)")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--statement", action="append", dest="statements",
                        help="a statement to time (repeatable; default: the three of STATEMENTS)")
    args = parser.parse_args()
    checkouts = [checkout.resolve() for checkout in args.checkouts]
    statements = args.statements or list(STATEMENTS)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="import-time-pycache-") as bytecode:
        samples = measure(args.python, checkouts, statements, args.runs, args.warmup, bytecode)
    print(f"python {platform.python_version()} ({args.python}), {os.cpu_count()} CPUs, "
          f"load average before: {load:.2f}, after: {os.getloadavg()[0]:.2f}")
    for index, checkout in enumerate(checkouts):
        print(f"{chr(ord('A') + index)} = {checkout_label(checkout)}")
    print(f"fresh processes, checkouts alternated, {args.runs} runs each after "
          f"{args.warmup} warm-up runs; bytecode cached (written by the warm-up runs)\n")
    print(table(samples, statements, len(checkouts)))


if __name__ == "__main__":
    main()
