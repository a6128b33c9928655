"""The run board: every run of a session (and runs loaded from folders) side by side.

A table (methods, parameters, final metric, time to target, speed-up over the baseline), a
scatter of time to target against final metric with its Pareto frontier, and a bar chart of
each method's share of the speed-up when leave-one-out runs exist. All of it is computed by
``speedkit.experiments.compare`` from RunRecords, the same functions the benchmark reports with.
"""
from __future__ import annotations

import html
import os
from typing import Callable

import plotly.graph_objects as go

from speedkit.experiments.compare import (baseline_runs, common_target, compare_table, final_metric, leave_one_out,
                                          pareto_front, time_at)
from speedkit.record.runs import RunRecord, load_records, lower_is_better


def _fmt(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


class RunBoard:
    """Runs of one task. ``on_select(record)`` is called when a point of the scatter is clicked."""

    def __init__(self, records: list[RunRecord] = (), task: str | None = None,
                 on_select: Callable[[RunRecord], None] | None = None):
        self.task, self.on_select = task, on_select
        self.records: list[RunRecord] = []
        self._widgets = None
        for record in records:
            self.add(record)

    # -- contents -------------------------------------------------------------------------
    def add(self, record: RunRecord) -> None:
        """Add a run (or refresh it, when the same run is already on the board)."""
        if self.task and record.config.get("task") not in (None, self.task):
            return
        if all(r.run_id != record.run_id for r in self.records):
            self.records.append(record)
        self.refresh()

    def load(self, folder: str | os.PathLike) -> int:
        """Add every RunRecord under ``folder``; returns how many were added."""
        before = len(self.records)
        for record in load_records(folder):
            self.add(record)
        return len(self.records) - before

    def select(self, index: int) -> RunRecord:
        record = self.finished()[index]
        if self.on_select is not None:
            self.on_select(record)
        return record

    def shown(self) -> list[RunRecord]:
        """The runs of the board's task (the explorer switches it; the other task's runs come back with it): a
        table of two tasks would time one task's runs against the other's baseline."""
        return [r for r in self.records if not self.task or r.config.get("task") in (None, self.task)]

    def finished(self) -> list[RunRecord]:
        return [r for r in self.shown() if r.status not in ("created", "running")]

    @property
    def target(self) -> dict | None:
        """The one target the board times every run at (``compare.common_target``: the latest baseline's)."""
        return common_target(self.shown())

    @property
    def metric(self) -> str:
        return self.target["metric"] if self.target else "eval/accuracy"

    def rows(self) -> list[dict]:
        return compare_table(self.shown())

    # -- views ----------------------------------------------------------------------------
    def table_html(self) -> str:
        target = self.target
        header = ["run", "status", "methods", "parameters", f"final {self.metric}",
                  f"time to {target['metric']} {target['value']:g}" if target else "time to target", "speed-up"]
        lines = ["<table class='speedkit-board'><thead><tr>" + "".join(f"<th>{h}</th>" for h in header)
                 + "</tr></thead><tbody>"]
        for row in self.rows():
            params = "; ".join(f"{m}: {', '.join(f'{k}={v}' for k, v in p.items())}" for m, p in row["params"].items())
            cells = [row["name"], row["status"], row["methods"], params, _fmt(row["final"], ".4f"),
                     _fmt(row["time_to_target_s"], ".1f", "not reached") + ("s" if row["time_to_target_s"] else ""),
                     _fmt(row["speedup"], ".2f") + ("x" if row["speedup"] else "")
                     + (f" (other settings: {'; '.join(row['other_settings'])})" if row["other_settings"] else "")]
            lines.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        lines.append("</tbody></table>")
        return "\n".join(lines)

    def scatter_figure(self) -> go.Figure:
        """Time to the board's target (or total time, marked x, where never reached) against the final metric."""
        runs, target = self.finished(), self.target
        baselines = {id(r) for r in baseline_runs(runs)}
        points = [(time_at(r, target), final_metric(r, self.metric)) for r in runs]
        xs = [t if t is not None else r.timings.get("train_s") for (t, _), r in zip(points, runs)]
        fig = go.Figure(go.Scatter(
            x=xs, y=[m for _, m in points], mode="markers", name="runs",
            text=[f"{r.name}<br>{', '.join(r.method_names) or 'no methods'}" for r in runs],
            hovertemplate="%{text}<br>%{x:.1f}s, %{y:.4f}<extra></extra>",
            marker=dict(size=11, symbol=["circle" if t is not None else "x" for t, _ in points],
                        color=["#7f7f7f" if id(r) in baselines else "#1f77b4" for r in runs])))
        front = pareto_front(points, lower_metric_better=lower_is_better(self.metric))
        if front:
            fig.add_trace(go.Scatter(x=[points[i][0] for i in front], y=[points[i][1] for i in front],
                                     mode="lines", name="Pareto frontier", line=dict(color="#d62728", dash="dot"),
                                     hoverinfo="skip"))
        fig.update_layout(title="time to target vs final metric (x: target not reached; click a point to "
                                "overlay its curves)", xaxis_title="training seconds to target",
                          yaxis_title=self.metric, height=360, template="plotly_white",
                          margin=dict(l=50, r=10, t=50, b=40))
        return fig

    def contribution_figure(self) -> go.Figure | None:
        """Each method's share of the speed-up from leave-one-out runs; None when there are none."""
        table = leave_one_out(self.shown())
        if not table:
            return None
        fig = go.Figure()
        for full, methods in table.items():
            names = list(methods)
            slowdowns = [methods[m]["slowdown"] for m in names]
            fig.add_trace(go.Bar(x=names, y=[min(s, 10.0) for s in slowdowns], name=full,
                                 text=[f"{s:.2f}x" if s != float("inf") else "never reached" for s in slowdowns]))
        fig.add_hline(y=1.0, line_dash="dot", annotation_text="no effect")
        fig.update_layout(title="leave-one-out: slowdown when each method is removed (above 1: it pays off)",
                          yaxis_title="time without / time with", height=340, template="plotly_white")
        return fig

    # -- widgets --------------------------------------------------------------------------
    def widget(self):
        """The board as ipywidgets: the table, a clickable scatter and the contributions."""
        import ipywidgets as w

        if self._widgets is None:
            scatter = go.FigureWidget(self.scatter_figure())
            self._widgets = {"table": w.HTML(self.table_html()), "scatter": scatter,
                             "contrib": w.Output(), "box": None}
            self._widgets["box"] = w.VBox([w.HTML("<b>Run board</b>"), self._widgets["table"], scatter,
                                           self._widgets["contrib"]])
            self._hook_clicks()
        return self._widgets["box"]

    def refresh(self) -> None:
        if self._widgets is None:
            return
        self._widgets["table"].value = self.table_html()
        fresh = self.scatter_figure()
        scatter = self._widgets["scatter"]
        with scatter.batch_update():
            scatter.data = ()
            for trace in fresh.data:
                scatter.add_trace(trace)
        self._hook_clicks()
        contrib = self.contribution_figure()
        if contrib is not None:
            self._widgets["contrib"].clear_output()
            self._widgets["contrib"].append_display_data(go.FigureWidget(contrib))

    def _hook_clicks(self) -> None:
        scatter = self._widgets["scatter"]
        if scatter.data:
            scatter.data[0].on_click(lambda trace, points, state: [self.select(i) for i in points.point_inds])

