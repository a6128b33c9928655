"""Training curves from RunRecords: one layout for the live FigureWidget and for static figures.

Six panels: loss, the evaluation metric and throughput against training seconds (evaluation
excluded), and loss, the metric and the learning rate against samples seen. Every run is one
colour across the panels; the baseline is grey and dashed. Histories are thinned to a few hundred
points per trace, so drawing a long run costs the same as drawing a short one.
"""
from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from speedkit.record.runs import RunRecord

MAX_POINTS = 400
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#8c564b", "#bcbd22")
BASELINE_STYLE = {"color": "#7f7f7f", "dash": "dash"}


def panels(metric: str) -> list[tuple[str, str, str]]:
    """(y key, x key, title) for each panel, row by row."""
    short = metric.split("/", 1)[-1]
    return [("loss", "wall_s", "train loss vs seconds"), (metric, "wall_s", f"{short} vs seconds"),
            ("throughput/samples_per_s", "wall_s", "samples/s vs seconds"),
            ("loss", "sample", "train loss vs samples"), (metric, "sample", f"{short} vs samples"),
            ("lr", "sample", "learning rate vs samples")]


def thin(xs: list, ys: list, max_points: int = MAX_POINTS) -> tuple[list, list]:
    """Every k-th point so at most ``max_points`` remain; the last point is always kept."""
    if len(xs) <= max_points:
        return list(xs), list(ys)
    stride = -(-len(xs) // (max_points - 1))
    keep = list(range(0, len(xs) - 1, stride)) + [len(xs) - 1]
    return [xs[i] for i in keep], [ys[i] for i in keep]


def record_metric(record: RunRecord, default: str = "eval/accuracy") -> str:
    return (record.target or {}).get("metric") or default


def run_label(record: RunRecord) -> str:
    methods = ", ".join(record.method_names)
    return f"{record.name} ({methods})" if methods else record.name


def empty_figure(metric: str, height: int = 520) -> go.Figure:
    """The six empty panels with their titles and axis labels."""
    layout = panels(metric)
    fig = make_subplots(rows=2, cols=3, subplot_titles=[title for *_, title in layout],
                        horizontal_spacing=0.07, vertical_spacing=0.16)
    for i, (y, x, _) in enumerate(layout):
        row, col = divmod(i, 3)
        fig.update_xaxes(title_text="training seconds" if x == "wall_s" else "samples", row=row + 1, col=col + 1)
    fig.update_layout(height=height, margin=dict(l=40, r=10, t=40, b=40), template="plotly_white",
                      legend=dict(orientation="h", y=-0.14), uirevision="keep-zoom")
    return fig


def retitle(fig: go.Figure, metric: str) -> None:
    """Point the panels at another metric (a new task): clear the traces, rename the titles."""
    fig.data = ()
    for annotation, (*_, title) in zip(fig.layout.annotations, panels(metric)):
        annotation.text = title


def add_run(fig: go.Figure, record: RunRecord, metric: str, color: str | None = None, baseline: bool = False,
            max_points: int = MAX_POINTS) -> None:
    """Add one trace per panel for ``record``, tagged ``meta="<run_id>-<panel>"``.

    (Not ``uid``: a FigureWidget replaces trace uids with its own.)
    """
    style = dict(BASELINE_STYLE) if baseline else {"color": color or PALETTE[0]}
    for i, (y, x, _) in enumerate(panels(metric)):
        xs, ys = thin(*record.series(y, x), max_points)
        row, col = divmod(i, 3)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers" if y == metric else "lines",
                                 name=("baseline: " if baseline else "") + run_label(record),
                                 meta=f"{record.run_id}-{i}", legendgroup=record.run_id, showlegend=i == 0,
                                 line=dict(width=1.5, **style), marker=dict(size=5)),
                      row=row + 1, col=col + 1)


def curves_figure(records: list[RunRecord], metric: str | None = None, baseline: RunRecord | None = None,
                  max_points: int = MAX_POINTS, height: int = 520) -> go.Figure:
    """A static figure of ``records`` (and a dashed ``baseline``), drawn the way the live plot draws."""
    metric = metric or (record_metric(records[0]) if records else "eval/accuracy")
    fig = empty_figure(metric, height)
    if baseline is not None:
        add_run(fig, baseline, metric, baseline=True, max_points=max_points)
    for i, record in enumerate(r for r in records if r is not baseline):
        add_run(fig, record, metric, PALETTE[i % len(PALETTE)], max_points=max_points)
    return fig


def update_run(fig: go.Figure, record: RunRecord, metric: str, max_points: int = MAX_POINTS) -> bool:
    """Refresh ``record``'s traces in place (a FigureWidget sends only the changed data); False if absent."""
    traces = {t.meta: t for t in fig.data}
    if f"{record.run_id}-0" not in traces:
        return False
    with fig.batch_update():
        for i, (y, x, _) in enumerate(panels(metric)):
            xs, ys = thin(*record.series(y, x), max_points)
            trace = traces[f"{record.run_id}-{i}"]
            trace.x, trace.y = xs, ys
    return True


def remove_run(fig: go.Figure, run_id: str) -> None:
    fig.data = tuple(t for t in fig.data if t.legendgroup != run_id)


def use_static_renderer() -> None:
    """Figures as JupyterLab's plotly output plus self-contained HTML (plotly.js once per notebook),
    so an executed notebook's HTML export shows them offline."""
    pio.renderers.default = "plotly_mimetype+notebook"
