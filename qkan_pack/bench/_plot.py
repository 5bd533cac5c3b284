"""PNG plots of benchmark results (matplotlib's Agg backend: no display, no pyplot state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import BenchError
from ._names import LABELS, VARIANTS
from ._results import BenchReport, variant_ok


def new_axes(width: float, height: float = 4.5) -> tuple[Any, Any]:
    """A figure and its axes; a clear error when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise BenchError(f"the plot needs matplotlib ({exc}); install it with "
                         "pip install 'qkan-pack[bench]', or leave out --plot") from None
    figure = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def save_png(figure: Any, path: str | Path) -> Path:
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def write_plot(report: BenchReport, path: str | Path) -> Path:
    """Median latency per shape per variant, grouped bars, log scale, whiskers to p90."""
    names = [n for n in VARIANTS if any(variant_ok(s.variants.get(n)) for s in report.shapes)]
    figure, axes = new_axes(max(6.0, 1.6 + 1.4 * len(report.shapes) * max(1, len(names)) / 3))
    _latency_bars(axes, report, names)
    axes.set_yscale("log")
    axes.set_xticks(range(len(report.shapes)), [s.label for s in report.shapes])
    axes.set_ylabel("latency per call, us (median; whisker to p90)")
    axes.set_xlabel("input shape")
    gpu = report.machine.get("gpu") or report.machine.get("cpu")
    name = Path(report.artifact["path"]).name
    axes.set_title(f"{name} ({report.artifact['model']}) on {report.device}, {gpu}\n"
                   f"torch {report.versions.get('torch')}, {report.created[:10]}", fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(axis="y", which="both", alpha=0.3)
    return save_png(figure, path)


def _latency_bars(axes: Any, report: BenchReport, names: list[str]) -> None:
    width = 0.8 / max(1, len(names))
    for slot, name in enumerate(names):
        xs, medians, whiskers = [], [], []
        for position, shape in enumerate(report.shapes):
            item = shape.variants.get(name)
            if variant_ok(item) and item.median_us is not None and item.p90_us is not None:
                xs.append(position + (slot - (len(names) - 1) / 2) * width)
                medians.append(item.median_us)
                whiskers.append(max(0.0, item.p90_us - item.median_us))
        axes.bar(xs, medians, width=width * 0.95, label=LABELS[name],
                 yerr=[[0.0] * len(whiskers), whiskers], capsize=3, error_kw={"linewidth": 0.8})
    for position, shape in enumerate(report.shapes):
        if shape.kernel_us:
            axes.hlines(shape.kernel_us, position - 0.45, position + 0.45, colors="black",
                        linestyles="dashed", linewidth=1,
                        label="GPU kernel time" if position == 0 else None)


def write_serve_plot(report: Any, path: str | Path) -> Path:
    """The serve load curve: req/s, p50/p99 and rows per replay against clients, the
    artifact (a line per protocol) beside the no-op deployment."""
    figure, axes = new_axes(13.0, 4.2)
    figure.delaxes(axes)
    panels = [figure.add_subplot(1, 3, i + 1) for i in range(3)]
    for mode, curve in report.curves.items():
        protocols = list(dict.fromkeys(p.protocol for p in curve))
        for protocol in protocols:
            points = [p for p in curve if p.protocol == protocol]
            label = mode if len(protocols) == 1 else f"{mode} {protocol}"
            clients = [p.clients for p in points]
            style = "--s" if mode == "noop" else "-o"
            panels[0].plot(clients, [p.requests_per_s for p in points], style, label=label)
            panels[1].plot(clients, [p.p50_ms for p in points], style, label=f"{label} p50")
            panels[1].plot(clients, [p.p99_ms for p in points], style, alpha=0.5,
                           label=f"{label} p99")
            if any(p.rows_per_replay for p in points):  # the artifact's, a repository's
                panels[2].plot(clients, [p.rows_per_replay for p in points], style, label=label)
    for panel, ylabel in zip(panels, ("requests/s (200 only)", "latency ms", "rows per replay")):
        panel.set_xscale("log", base=2)
        panel.set_xlabel("concurrent clients")
        panel.set_ylabel(ylabel)
        panel.grid(alpha=0.3, which="both")
        panel.legend(fontsize=8)
    panels[1].set_yscale("log")
    where = report.machine.get("gpu") or report.machine.get("cpu")
    figure.suptitle(f"qkan-pack serve: {Path(report.artifact).name} on {where}, "
                    f"{report.created[:10]}", fontsize=9)
    return save_png(figure, path)
