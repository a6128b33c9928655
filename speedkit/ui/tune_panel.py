"""The explorer's Tune panel: ``speedkit.experiments.tune`` on a worker thread, its runs on the board as they finish.

Target, budget and the methods the search may try are controls; Start runs the search off the
kernel's main thread (so Stop, a widget event, is handled while it trains); each finished run's
RunRecord (the baseline plan's, the trials', the confirmation's) goes onto the explorer's run board and the best
trial so far is named; "Use this recipe" loads
the confirmed winner into the explorer's controls. ``start(wait=True)`` is the headless form.
"""
from __future__ import annotations

import html
import threading
import traceback
from pathlib import Path

import ipywidgets as w

from speedkit.methods import REGISTRY
from speedkit.record.runs import RunRecord
from speedkit.tasks import get_task
from speedkit.ui.config import unsuitable_reason

# what the search is doing when a run of its phase (its RunRecord's config["tune"]["phase"]) finishes
PHASE_STATUS = {"baseline": "tuning the baseline", "confirm": "confirming on fresh seeds"}


class TunePanel:
    def __init__(self, explorer, out_dir: str | Path | None = None, budget: str = "10m"):
        self.explorer = explorer
        self.out_dir = Path(out_dir) if out_dir is not None else Path(explorer.run_dir) / "tune"
        narrow = {"style": {"description_width": "90px"}, "layout": w.Layout(width="240px")}
        self.budget = w.Text(value=budget, description="budget", placeholder="10m, 90s, 1h", **narrow)
        self.target = w.FloatText(value=explorer.target.value, description="target", **narrow)
        self.methods = w.SelectMultiple(description="may try", rows=8, layout=w.Layout(width="360px"),
                                        style={"description_width": "90px"})
        self.start_button = w.Button(description="Start search", button_style="success", icon="search")
        self.stop_button = w.Button(description="Stop search", button_style="danger", icon="stop", disabled=True)
        self.use_button = w.Button(description="Use this recipe", icon="check", disabled=True)
        self.status = w.HTML("ready")
        self.best = w.HTML()
        self.start_button.on_click(lambda b: self.start())
        self.stop_button.on_click(lambda b: self.stop())
        self.use_button.on_click(lambda b: self.use_recipe())
        self.result = None
        self.error: str | None = None
        self.trials = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._study = None  # the search's study, once a trial finished: the best so far is ranked there
        self._widget = None
        self.refresh_methods()

    # -- controls ---------------------------------------------------------------------------
    def refresh_methods(self) -> None:
        """Offer the methods that fit the explorer's task; those ticked in its grid start selected."""
        domain = get_task(self.explorer.task.value).domain
        fitting = [name for name in REGISTRY if unsuitable_reason(name, domain) is None]
        ticked = [name for name in fitting if self.explorer.rows[name].enabled]
        self.methods.options = fitting
        self.methods.value = tuple(ticked or fitting)
        self.target.value = self.explorer.target.value

    @property
    def widget(self) -> w.Widget:
        """The panel, collapsed until opened (built once)."""
        if self._widget is None:
            actions = w.HBox([self.start_button, self.stop_button, self.use_button, self.status])
            body = w.VBox([w.HBox([w.VBox([self.budget, self.target]), self.methods]), actions, self.best])
            self._widget = w.Accordion(children=[body])
            self._widget.set_title(0, "Tune: search for the fastest recipe (speedkit.experiments.tune)")
            self._widget.selected_index = None
        return self._widget

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- running ----------------------------------------------------------------------------
    def start(self, wait: bool = False, **overrides):
        """Start the search with the panel's settings (``overrides``: any other ``speedkit.experiments.tune`` argument).

        Returns the TuneResult when ``wait`` is true, else the worker thread.
        """
        if self.running:
            self.status.value = "a search is already running; stop it first"
            return None
        arguments = self._arguments(overrides)
        self._stop.clear()
        self.result, self.error, self.trials, self._study = None, None, 0, None
        self.start_button.disabled, self.stop_button.disabled, self.use_button.disabled = True, False, True
        self.status.value = f"searching ({html.escape(str(arguments['budget']))}) …"
        self._thread = threading.Thread(target=self._search, args=(arguments,), name="speedkit-tune", daemon=True)
        self._thread.start()
        if not wait:
            return self._thread
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"the search failed: {self.error}")
        return self.result

    def _arguments(self, overrides: dict) -> dict:
        explorer = self.explorer
        arguments = {"task": explorer.task.value, "target": self.target.value, "budget": self.budget.value,
                     "searched_methods": list(self.methods.value), "device": explorer.device.value,
                     "data_fraction": explorer.data_fraction, "eval_fraction": explorer.eval_fraction,
                     "eval_interval": explorer.eval_interval, "out_dir": str(self.out_dir),
                     "run_dir": str(explorer.run_dir)}
        return {**arguments, **overrides}

    def stop(self) -> None:
        """End the search at the next batch; finished trials stay in its study, and Start continues it."""
        if self.running:
            self._stop.set()
            self.status.value = "stopping at the next batch …"

    def _search(self, arguments: dict) -> None:
        from speedkit.experiments.tune import TuneSettings, tune

        try:
            self.result = tune(TuneSettings(**arguments), on_trial=self._on_trial, on_run=self._on_run,
                               should_stop=self._stop.is_set, log=lambda *_: None)
        except Exception as e:  # shown in the panel: a worker thread's exception would vanish
            self.error = f"{type(e).__name__}: {e}"
            self.status.value = f"<span style='color:#d62728'>{html.escape(self.error)}</span>"
            self._last_traceback = traceback.format_exc()
        else:
            self.status.value = self._outcome()
        finally:
            self.start_button.disabled, self.stop_button.disabled = False, True
            self.use_button.disabled = self.result is None or self.result.recipe is None

    def _outcome(self) -> str:
        result = self.result
        spent = time_line(result.summary.get("time"))
        if result.recipe is None:
            return f"done: no candidate reached the target on every seed (see the report) · {spent}"
        speedup = result.speedup
        return (f"done: the winner is {'-' if speedup is None else f'{speedup:.2f}x'} the faster baseline "
                f"({html.escape(result.recipe.summary)}); report: {html.escape(str(result.report_path))} · {spent}")

    def _on_run(self, record: RunRecord) -> None:
        """Called on the search thread after each run it trains (the baseline plan's, a trial's, a confirmation
        run): its record onto the board, so the board fills while the baseline is tuned and confirmed too."""
        self.explorer.board.add(record)
        self.explorer.refresh_measured()
        phase = record.config.get("tune", {}).get("phase")
        if phase != "search":
            self.status.value = f"{PHASE_STATUS.get(phase, 'running')} … {record.name} finished"

    def _on_trial(self, study, trial) -> None:
        """Called on the search thread after each search trial: the best so far named."""
        self.trials += 1
        self._study = study
        self._show_best()
        self.status.value = f"searching … {self.trials} trials finished"

    def _show_best(self) -> None:
        """The best recipe so far as the search ranks it (by its worst seed)."""
        from speedkit.experiments.report import proposal
        from speedkit.experiments.tune.search import SEARCH_SEED, standings

        leaders = standings(self._study)[:1] if self._study is not None else []
        if not leaders:
            return
        lead = leaders[0]
        first = lead.first
        origin = proposal({**first.user_attrs, "seed": first.user_attrs.get("seed", SEARCH_SEED)})
        times = [t.user_attrs.get("time_to_target_s") for t in lead.runs]
        what = ("reached the target at " + " / ".join(f"{t:.1f}s" for t in times) if lead.reached
                else f"objective {lead.score:.1f}") + (f" ({lead.seeds} seeds)" if lead.seeds > 1 else "")
        self.best.value = (f"<b>best so far</b> ({html.escape(self._study.study_name)} #{first.number}): {what} · "
                           f"{html.escape(str(first.user_attrs.get('change', '')))} · proposed as {html.escape(origin)}")

    def use_recipe(self) -> None:
        """Load the confirmed winner into the explorer's controls (its methods into the grid)."""
        if self.result is None or self.result.recipe_path is None:
            raise ValueError("no winner to use yet: run a search that confirms one first")
        self.explorer.use_recipe(self.result.recipe_path)


def time_line(time: dict | None) -> str:
    """Where the search's time went, in one line (the report's table, shortened)."""
    if not time:
        return ""
    from speedkit.experiments.report import spent_line

    runs = time.get("runs", {})
    parts = [f"{what} {seconds:.0f}s" + (f" ({runs[what]} runs)" if runs.get(what) else "")
             for what, seconds in time["seconds"].items() if runs.get(what) or seconds >= 0.5]
    return html.escape(f"{spent_line(time)}: " + ", ".join(parts))
