"""Plots of released data only: budget spend, ATE intervals, CATE slices, EBM shape functions.

Each function takes typed results (never rows: the client never has any) and writes a PNG with
matplotlib's Agg canvas, without touching pyplot's global state. Needs matplotlib, the ``plots``
extra (``pip install "dpcurator[plots]"``); without it every plot raises ``ImportError`` saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from dpcurator.models import LedgerEntry
from dpcurator.results import AteResult, EbmShapeResult, FunctionEvaluation, feature_label


def _figure(width: float = 7.0, height: float = 4.0) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            'plots need matplotlib: pip install "dpcurator[plots]"', name=exc.name
        ) from exc

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    return out


def plot_budget_spend(
    entries: Sequence[LedgerEntry], path: str | Path, *, title: str | None = None
) -> Path:
    """Cumulative ε spent over time (step plot) against the ε total, from the ledger."""
    if not entries:
        raise ValueError("the ledger has no entries to plot")
    times = [datetime.fromisoformat(e.created_at) for e in entries]
    spent = [float(e.epsilon_spent) for e in entries]
    total = [float(e.epsilon_total) for e in entries]
    fig = _figure()
    ax = fig.add_subplot()
    ax.step(times, spent, where="post", label="ε spent", color="tab:blue")
    ax.step(times, total, where="post", label="ε total", color="tab:gray", linestyle="--")
    charges = [
        (t, s) for t, s, e in zip(times, spent, entries, strict=True) if e.entry_type == "charge"
    ]
    if charges:
        ax.scatter(
            [t for t, _ in charges], [s for _, s in charges], s=14, color="tab:blue", zorder=3
        )
    import matplotlib.dates

    dates: Any = matplotlib.dates  # typed loosely: partly untyped upstream
    locator = dates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator))
    ax.set_ylim(bottom=0, top=max(max(total), max(spent), 1e-9) * 1.3)
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("ε")
    ax.set_title(title or "Privacy budget spent")
    ax.legend(loc="upper left")
    return _save(fig, path)


def default_ate_labels(results: Sequence[AteResult]) -> list[str]:
    """A row label per release: its epsilon, and the estimator and clip where the result names
    them (two releases at one epsilon with different clips must not look alike); rows that
    would still read the same are numbered."""
    names = []
    for r in results:
        parts = [f"ε={r.epsilon:g}"]
        estimator = r.raw.get("estimator")
        if isinstance(estimator, str) and estimator != "aipw":
            parts.append(estimator)
        clip = r.raw.get("clip")
        if isinstance(clip, str):
            parts.append(f"clip {clip}")
        names.append(", ".join(parts))
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    counts: dict[str, int] = {}
    out = []
    for name in names:
        if seen[name] > 1:
            counts[name] = counts.get(name, 0) + 1
            name = f"{name} #{counts[name]}"
        out.append(name)
    return out


def plot_ate(
    results: Sequence[AteResult],
    path: str | Path,
    *,
    labels: Sequence[str] | None = None,
    reference: float | None = None,
    title: str | None = None,
) -> Path:
    """DP ATE estimates with their confidence intervals, one row per release."""
    if not results:
        raise ValueError("no ATE results to plot")
    names = list(labels) if labels is not None else default_ate_labels(results)
    if len(names) != len(results):
        raise ValueError("one label per result")
    fig = _figure(7.0, 1.2 + 0.5 * len(results))
    ax = fig.add_subplot()
    ys = list(range(len(results)))
    ax.errorbar(
        [r.estimate for r in results],
        ys,
        xerr=[
            [r.estimate - r.ci_lower for r in results],
            [r.ci_upper - r.estimate for r in results],
        ],
        fmt="o",
        capsize=4,
        color="tab:blue",
    )
    if reference is not None:
        ax.axvline(reference, color="tab:gray", linestyle="--", label=f"reference {reference:g}")
        ax.legend(loc="best")
    ax.axvline(0.0, color="black", linewidth=0.6)
    ax.set_yticks(ys, names)
    ax.set_ylim(-0.6, len(results) - 0.4)
    level = results[0].ci_level
    ax.set_xlabel(f"average treatment effect ({level:.0%} CI, sampling and privacy noise)")
    ax.set_title(title or "DP average treatment effect")
    return _save(fig, path)


def plot_cate_slice(
    evaluation: FunctionEvaluation,
    path: str | Path,
    *,
    axis: int = 0,
    level: float = 0.95,
    feature: str | None = None,
    title: str | None = None,
) -> Path:
    """A CATE function along one covariate (the others fixed by the caller's points).

    The band is the pointwise privacy-noise band ``value ± z·sd`` when the server publishes the
    noise sd; the GP noise is correlated, so a whole curve may sit shifted within its band.
    """
    if not evaluation.points:
        raise ValueError("no points to plot")
    order = sorted(range(len(evaluation.points)), key=lambda i: evaluation.points[i][axis])
    xs = [evaluation.points[i][axis] for i in order]
    ys = [evaluation.values[i] for i in order]
    fig = _figure()
    ax = fig.add_subplot()
    bands = evaluation.bands(level)
    if bands is not None:
        ax.fill_between(
            xs,
            [bands[i][0] for i in order],
            [bands[i][1] for i in order],
            alpha=0.25,
            color="tab:orange",
            label=f"{level:.0%} pointwise noise band",
        )
    ax.plot(xs, ys, color="tab:orange", marker=".", label="DP CATE")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xlabel(feature or f"covariate {axis}")
    ax.set_ylabel("CATE")
    ax.set_title(title or "CATE function slice")
    ax.legend(loc="best")
    return _save(fig, path)


def plot_shape_functions(
    ebm: EbmShapeResult,
    path: str | Path,
    *,
    title: str | None = None,
    names: Sequence[str] | None = None,
) -> Path:
    """Each EBM shape function: steps over numeric bins, bars over categorical codes. ``names``:
    the schema's covariate names in order (``Dataset.schema``), shown beside the server's
    ``x3``."""
    shapes = ebm.shape_functions
    if not shapes:
        raise ValueError("the result has no shape functions")
    cols = min(3, len(shapes))
    rows = (len(shapes) + cols - 1) // cols
    fig = _figure(3.2 * cols, 2.6 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, shape in enumerate(shapes):
        ax = axes[i // cols][i % cols]
        if shape.codes is not None and shape.code_values is not None:
            ax.bar([str(c) for c in shape.codes], shape.code_values, color="tab:green")
        else:
            ax.stairs(shape.scores, shape.edges, color="tab:green", baseline=None)
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_title(
            feature_label(shape.feature, names) if shape.feature else f"term {i}", fontsize=10
        )
    for j in range(len(shapes), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.suptitle(title or f"DP-EBM shape functions (intercept {ebm.intercept:.3g})")
    return _save(fig, path)
