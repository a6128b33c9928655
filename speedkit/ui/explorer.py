"""MethodExplorer: toggle and tune methods in a notebook, run, and watch the curves beside the baseline.

Layout, top to bottom: the run settings (task, model, duration, device, precision, seed, target),
the recipe presets, the method grid (built from the method cards), Run / Stop / Copy as code with
a status line, the live curves, and the run board.

Everything a click does is also a method (``set_recipe``, ``toggle``, ``set_param``, ``run``,
``stop``), so tests and headless notebooks drive the same code the buttons do. Under papermill,
``run_all(configs)`` runs a list of configurations one after another and ``show_static()`` ends
the notebook with plain plotly figures drawn from the RunRecords.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import html
import math
import os
import threading
import time
from pathlib import Path

import ipywidgets as w
import plotly.graph_objects as go

from speedkit.core.devices import PRECISIONS
from speedkit.core.method import HParam
from speedkit.experiments.compare import latest_baseline
from speedkit.methods import REGISTRY
from speedkit.record.runs import RunRecord
from speedkit.tasks import TASKS, get_recipe, get_task, resolve_task
from speedkit.tasks.task import Task
from speedkit.ui import plots
from speedkit.ui.board import RunBoard
from speedkit.tasks import RunRequest, make_trainer
from speedkit.ui.config import (default_preset, explorer_request, method_misfits, methods_differ, request_code,
                                request_problems, run_recipe, trainer_request, unsuitable_reason)
from speedkit.ui.live import BackgroundRun

PRINT_EVERY_S = 5.0  # how often a headless run prints a progress line


def available_devices() -> list[str]:
    import torch

    devices = ["auto", "cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def hparam_control(hp: HParam, value) -> w.Widget:
    """The control a card's hyperparameter asks for: a slider within its range, a dropdown, a toggle."""
    style, layout = {"description_width": "150px"}, w.Layout(width="420px")
    common = dict(description=hp.name, tooltip=hp.help, style=style, layout=layout)
    if hp.choices is not None:
        return w.Dropdown(options=[(str(c), c) for c in hp.choices], value=value, **common)
    if hp.type is bool:
        return w.Checkbox(value=bool(value), indent=False, **common)
    if hp.type in (int, float) and hp.low is not None and hp.high is not None:
        if hp.log and hp.low > 0:
            return w.FloatLogSlider(value=value, base=10, min=math.log10(hp.low), max=math.log10(hp.high),
                                    step=0.05, readout_format=".3g", **common)
        if hp.type is int:
            return w.IntSlider(value=value, min=int(hp.low), max=int(hp.high), step=int(hp.step or 1), **common)
        return w.FloatSlider(value=value, min=hp.low, max=hp.high, step=hp.step or (hp.high - hp.low) / 100,
                             readout_format=".3g", **common)
    if hp.type is int:
        return w.IntText(value=value, **common)
    if hp.type is float:
        return w.FloatText(value=value, **common)
    return w.Text(value=str(value), **common)


@contextlib.contextmanager
def _detached_widgets():
    """Widgets made inside keep their values but talk to no frontend.

    Headless runs use them: a notebook executed by papermill then stores no widget state (nbclient
    saves every widget that opened a comm), while the explorer's logic, which reads and writes the
    controls, stays one code path. It swaps in the comm package's own do-nothing comm.
    """
    import comm

    kernel_comm = comm.create_comm
    comm.create_comm = comm._create_comm
    try:
        yield
    finally:
        comm.create_comm = kernel_comm


def _badge(text: str, color: str, title: str = "") -> str:
    return (f"<span title='{html.escape(title, quote=True)}' style='background:{color};color:white;"
            f"border-radius:3px;padding:0 5px;margin-right:4px;font-size:11px'>{html.escape(text)}</span>")


class MethodRow:
    """One method in the grid: a checkbox, badges, and (on expand) its controls and card."""

    def __init__(self, name: str, on_change):
        self.name, self.card = name, REGISTRY[name].CARD
        self.checkbox = w.Checkbox(value=False, description=name, indent=False, layout=w.Layout(width="200px"))
        self.expand = w.ToggleButton(value=False, description="details", layout=w.Layout(width="80px"))
        self.badges = w.HTML(self._badges())
        self.controls = {hp.name: hparam_control(hp, hp.default) for hp in self.card.hparams}
        self.measured = w.HTML(self._measured_html("not measured here"))  # what this task's records say
        self.details = w.VBox([*self.controls.values(), w.HTML(self._card_html()), self.measured],
                              layout=w.Layout(display="none", margin="0 0 6px 24px"))
        self.expand.observe(lambda c: setattr(self.details.layout, "display", "flex" if c["new"] else "none"), "value")
        self.checkbox.observe(lambda c: on_change(), "value")
        for control in self.controls.values():
            control.observe(lambda c: on_change(), "value")
        # rows keep their natural height inside the scrolling grid instead of being squeezed to fit it
        self.box = w.VBox([w.HBox([self.checkbox, self.expand, self.badges]), self.details],
                          layout=w.Layout(flex="0 0 auto"))

    def _badges(self) -> str:
        card = self.card
        badges = [_badge(card.domain, {"vision": "#2ca02c", "language": "#9467bd"}.get(card.domain, "#7f7f7f"))]
        if card.requirements:
            badges.append(_badge("needs", "#ff7f0e", "; ".join(card.requirements)))
        for role in card.exclusive:
            badges.append(_badge(f"role: {role}", "#8c564b", "only one method may hold this role"))
        if card.effect:
            badges.append(_badge("effect", "#1f77b4", card.effect))
        if card.conflicts:
            badges.append(_badge(f"conflicts: {', '.join(card.conflicts)}", "#d62728",
                                 "; ".join(f"{k}: {v}" for k, v in card.conflicts.items())))
        return " ".join(badges) + f" <span style='font-size:12px'>{html.escape(card.summary)}</span>"

    def _card_html(self) -> str:
        card = self.card
        items = [("acts at", ", ".join(e.value for e in card.events)), ("expected effect", card.effect),
                 ("requirements", "; ".join(card.requirements) or "none"), ("source", card.source)]
        items += [(f"conflicts with {k}", v) for k, v in card.conflicts.items()]
        return "<div style='font-size:12px'>" + "".join(
            f"<b>{html.escape(k)}</b>: {html.escape(str(v))}<br>" for k, v in items) + "</div>"

    @staticmethod
    def _measured_html(text: str) -> str:
        return f"<div style='font-size:12px'><b>measured here</b>: {html.escape(text)}</div>"

    def set_measured(self, text: str) -> None:
        """The records' evidence on the current task, beside the card's claimed effect."""
        self.measured.value = self._measured_html(text)

    @property
    def enabled(self) -> bool:
        return self.checkbox.value

    def params(self) -> dict:
        """Parameters that differ from the card's defaults (the rest the method fills in itself)."""
        values = {name: control.value for name, control in self.controls.items()}
        return {k: v for k, v in values.items() if v != self.card.hparam(k).default}

    def set(self, enabled: bool, params: dict | None = None) -> None:
        for hp in self.card.hparams:
            self.controls[hp.name].value = (params or {}).get(hp.name, hp.default)
        self.checkbox.value = enabled

    def set_available(self, reason: str | None) -> None:
        """Disable the row with the reason shown, or enable it."""
        self.checkbox.disabled = reason is not None
        self.checkbox.tooltip = reason or self.card.summary
        self.badges.value = (_badge("unavailable", "#555", reason) + f"<i style='font-size:12px'>{html.escape(reason)}</i>"
                             if reason else self._badges())


class MethodExplorer:
    """The explorer widget. Display it as the last expression of a cell, or call ``display()``."""

    _tune_panel = None  # speedkit.ui.tune_panel.TunePanel, built on first use

    def __init__(self, task: str | Task = "fashion-mnist", recipe: str | None = None, *, data=None,
                 duration: str | None = None,
                 device: str = "auto", seed: int = 0, data_fraction: float = 1.0, eval_fraction: float | None = None,
                 eval_interval: str | None = None, run_dir: str | os.PathLike = "runs/explorer",
                 records: str | os.PathLike | None = None, baseline: RunRecord | str | None = None,
                 update_interval: float = 1.0, live: bool = True, loggers=None):
        """``live=False`` (headless) draws into a plain plotly Figure instead of a FigureWidget, so an
        executed notebook stores no widget JavaScript; everything else works the same. ``loggers`` (names
        or LoggerDestination objects, as the Trainer takes) log every run the explorer starts; None: the
        preset's own ``loggers`` field."""
        task = resolve_task(task, data).name  # a name, a Task, "pkg.mod:attr", a folder task with data=DIR
        self.loggers = loggers
        self.data_fraction, self.eval_fraction, self.eval_interval = data_fraction, eval_fraction, eval_interval
        self._widget = None
        with (contextlib.nullcontext() if live else _detached_widgets()):
            self._build(task, recipe, duration, device, seed, run_dir, records, baseline, update_interval, live)

    def _build(self, task, recipe, duration, device, seed, run_dir, records, baseline, update_interval, live):
        self.run_dir, self.update_interval = Path(run_dir), update_interval
        self.current: BackgroundRun | None = None
        self.history: list[RunRecord] = []
        self._applying = False  # True while a preset sets the controls, so they don't mark it "custom"
        self._lock = threading.Lock()  # one run starts at a time
        self._draw_lock = threading.Lock()  # the reporter thread and clicks both change the figure
        self._build_settings(task, device, seed)
        self.rows = {name: MethodRow(name, self._on_method_change) for name in REGISTRY}
        self._build_actions()
        self.board = RunBoard(task=task, on_select=self.overlay)
        empty = plots.empty_figure(get_task(task).target_metric)
        self.live = live
        self._printed_at = -float("inf")  # when a headless run last printed its progress
        self.figure = go.FigureWidget(empty) if live else empty
        self._baseline = RunRecord.load(baseline) if isinstance(baseline, (str, os.PathLike)) else baseline
        if records is not None:
            self.board.load(records)
            self.refresh_measured()
        self.set_task(task, recipe)
        if duration:
            self.duration.value = duration

    @property
    def widget(self) -> w.Widget:
        """The whole explorer as one widget, built when first shown."""
        if not self.live:
            return w.HTML("this explorer was made with live=False (headless): it runs configurations with "
                          "run_all() and draws with show_static(); make one with live=True to use the widgets")
        if self._widget is None:
            self._widget = self._layout()
        return self._widget

    # -- building the widgets ---------------------------------------------------------------
    def _build_settings(self, task: str, device: str, seed: int) -> None:
        narrow = {"style": {"description_width": "70px"}, "layout": w.Layout(width="220px")}
        self.task = w.Dropdown(options=list(TASKS), value=task, description="task", **narrow)
        self.model = w.Dropdown(options=get_task(task).model_names, description="model", **narrow)
        self.duration = w.Text(description="duration", placeholder="3ep, 500ba, 90s", **narrow)
        devices = available_devices()
        self.device = w.Dropdown(options=devices if device in devices else [*devices, device], value=device,
                                 description="device", **narrow)
        self.precision = w.Dropdown(options=PRECISIONS, description="precision", **narrow)
        self.seed = w.IntText(value=seed, description="seed", **narrow)
        self.target = w.FloatText(description="target", **narrow)
        self.target_label = w.HTML()
        self.preset = w.ToggleButtons(options=[*TASKS[task].recipes, "custom"], description="recipe")
        self.domain_filter = w.ToggleButtons(options=["all", "vision", "language", "any"], value="all",
                                             description="show")
        self.task.observe(lambda c: None if self._applying else self.set_task(c["new"]), "value")
        self.preset.observe(self._on_preset, "value")
        self.domain_filter.observe(lambda c: self._filter_rows(), "value")
        for control in (self.model, self.duration, self.precision):
            control.observe(lambda c: self._on_method_change(), "value")

    def _build_actions(self) -> None:
        self.run_button = w.Button(description="Run", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.code_button = w.Button(description="Copy as code", icon="code")
        self.run_button.on_click(lambda b: self.run())
        self.stop_button.on_click(lambda b: self.stop())
        self.code_button.on_click(lambda b: self.show_code())
        self.conflicts = w.HTML()
        self.status = w.HTML("ready")
        self.status.add_class("speedkit-status")
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="300px"))
        self.code = w.Textarea(layout=w.Layout(width="100%", height="220px"))
        self.recipe_file = w.Textarea(layout=w.Layout(width="100%", height="220px"))
        self.code_tabs = w.Tab(children=[self.code, self.recipe_file], layout=w.Layout(display="none"))
        self.code_tabs.set_title(0, "Trainer call")
        self.code_tabs.set_title(1, "recipe file (YAML)")

    def _layout(self) -> w.Widget:
        settings = w.VBox([w.HBox([self.task, self.model, self.duration, self.device]),
                           w.HBox([self.precision, self.seed, self.target, self.target_label])])
        grid = w.VBox([row.box for row in self.rows.values()],
                      layout=w.Layout(max_height="420px", overflow_y="auto", border="1px solid #ddd"))
        actions = w.HBox([self.run_button, self.stop_button, self.code_button, self.progress, self.status])
        return w.VBox([settings, self.preset, self.domain_filter, grid, self.conflicts, actions, self.code_tabs,
                       self.tune_panel.widget, self.figure, self.board.widget()])

    def display(self):
        from IPython.display import display

        display(self.widget)

    def _ipython_display_(self):
        self.display()

    # -- the run description ----------------------------------------------------------------
    def settings(self) -> dict:
        """What the controls hold right now, as RunRequest fields (``speedkit.ui.config.EXPLORER_FIELDS``),
        unchecked: ``request`` checks them."""
        return {"task": self.task.value, "recipe": self._base_recipe_name(),
                "methods": {name: row.params() for name, row in self.rows.items() if row.enabled},
                "model": self.model.value, "duration": self.duration.value.strip() or None,
                "precision": self.precision.value, "device": self.device.value, "seed": self.seed.value,
                "target": self.target.value, "data_fraction": self.data_fraction,
                "eval_fraction": self.eval_fraction, "eval_interval": self.eval_interval}

    @property
    def request(self) -> RunRequest:
        """The run the controls describe right now (a setting the request refuses raises, naming it)."""
        return explorer_request(self.settings())

    def recipe(self):
        """The recipe a run would train now: the preset with the grid's methods and the settings folded in."""
        return run_recipe(self.request)

    def _base_recipe_name(self) -> str:
        return self.preset.value if self.preset.value != "custom" else self._custom_base

    def set_task(self, task: str, recipe: str | None = None) -> None:
        spec = get_task(task)
        with self._applying_preset():
            self.task.options = list(TASKS)  # tasks registered since (a user's Task, a folder task)
            if self.task.value != task:
                self.task.value = task  # its observer calls back here; the guard above keeps it single
            self.model.options = spec.model_names
            self.target.value = spec.target_value
            self.target_label.value = f"<span style='font-size:12px'>{spec.target_metric}</span>"
            self.preset.options = [*TASKS[task].recipes, "custom"]
        self.board.task = task
        self.board.refresh()  # the new task's runs, if it had any
        if getattr(self, "_plotted_metric", None) != spec.target_metric:  # keep the curves within a task
            with self._draw_lock:
                plots.retitle(self.figure, spec.target_metric)
            self._plotted_metric = spec.target_metric
        self.set_recipe(recipe or default_preset(task))

    def set_recipe(self, name: str) -> None:
        """Set every control from a preset (or a recipe file that ``use_recipe`` offered)."""
        recipe = TASKS[self.task.value].recipes.get(name)
        if recipe is None and name in self._recipe_files:
            recipe = get_recipe(self.task.value, name)
        if recipe is None:
            raise ValueError(f"unknown recipe {name!r} for {self.task.value}; known: {sorted(TASKS[self.task.value].recipes)}")
        with self._applying_preset():
            self._custom_base = name
            self.preset.value = name
            self.model.value = recipe.model
            self.duration.value = recipe.duration
            self.precision.value = recipe.precision
            for method, row in self.rows.items():
                row.set(method in recipe.methods, recipe.methods.get(method))
        self._on_method_change()

    _recipe_files: tuple = ()  # recipe files offered beside the presets (speedkit tune's winner)

    def use_recipe(self, path: str | os.PathLike) -> None:
        """Load a recipe file (``speedkit tune``'s winner) into the controls: a "tuned" choice beside the
        presets, its methods ticked in the grid; runs then start from the whole file (optimizer, schedule,
        batch size, input pipeline)."""
        path = str(path)
        recipe = get_recipe(self.task.value, path)  # refuses a file for another task, naming both
        self._recipe_files = (path,)
        with self._applying_preset():
            self.preset.options = [*((n, n) for n in TASKS[self.task.value].recipes), (recipe.name, path), ("custom", "custom")]
        self.set_recipe(path)

    # -- tune -------------------------------------------------------------------------------
    @property
    def tune_panel(self):
        """The Tune panel (target, budget, methods; Start/Stop run ``speedkit.experiments.tune`` on a worker thread)."""
        if self._tune_panel is None:
            from speedkit.ui.tune_panel import TunePanel

            with (contextlib.nullcontext() if self.live else _detached_widgets()):
                self._tune_panel = TunePanel(self)
        return self._tune_panel

    def tune(self, wait: bool = True, use_winner: bool = True, **arguments):
        """Search for the fastest recipe from here (headless under papermill): the Tune panel's settings,
        overridden by any ``speedkit.experiments.tune`` argument. Trials appear on the run board as they finish; the
        confirmed winner is loaded into the controls when ``use_winner``. Returns the TuneResult (or the
        worker thread when ``wait`` is false)."""
        self.tune_panel.refresh_methods()
        result = self.tune_panel.start(wait=wait, **arguments)
        if wait and use_winner and result is not None and result.recipe_path is not None:
            self.use_recipe(result.recipe_path)
        return result

    def refresh_measured(self) -> None:
        """Each method row's "measured here": what this task's records on the board say about it."""
        from speedkit.ui.evidence import measured_here

        records = self.board.finished()
        for name, row in self.rows.items():
            row.set_measured(measured_here(records, name, self.task.value))

    def toggle(self, method: str, on: bool = True) -> None:
        if method not in self.rows:
            raise ValueError(f"unknown method {method!r}; known methods: {', '.join(self.rows)}")
        row = self.rows[method]
        if on and row.checkbox.disabled:
            raise ValueError(f"{method} cannot be used here: {row.checkbox.tooltip}")
        row.checkbox.value = on

    def set_param(self, method: str, name: str, value) -> None:
        control = self.rows[method].controls.get(name)
        if control is None:
            raise ValueError(f"{method} has no parameter {name!r}; it has {list(self.rows[method].controls)}")
        self.rows[method].card.hparam(name).validate(value, method)
        control.value = value

    def load_config(self, config: RunRequest | dict) -> None:
        """Set the controls from a configuration (a RunRequest, or a dict of its fields the explorer sets)."""
        config = explorer_request(config)
        self.set_task(config.task, config.recipe)
        with self._applying_preset():
            for field in ("model", "duration", "precision", "device"):
                value = getattr(config, field)
                if value is not None:
                    getattr(self, field).value = value
            self.seed.value = config.seed
            if config.target is not None:
                self.target.value = config.target
            if config.methods is not None:
                for method in config.methods:
                    if method not in self.rows:
                        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(self.rows)}")
                for name, row in self.rows.items():
                    row.set(name in config.methods, config.methods.get(name))
        self.data_fraction, self.eval_fraction = config.data_fraction, config.eval_fraction
        self.eval_interval = config.eval_interval or self.eval_interval
        self._on_method_change()

    @contextlib.contextmanager
    def _applying_preset(self):
        """Controls set inside are the preset's doing, so their observers do not mark it "custom"."""
        outer, self._applying = self._applying, True
        try:
            yield
        finally:
            self._applying = outer

    def _on_preset(self, change) -> None:
        if not self._applying and change["new"] != "custom":
            self.set_recipe(change["new"])

    def _on_method_change(self) -> None:
        if self._applying:
            return
        self._grey_unfit_methods()
        settings = self.settings()
        with self._applying_preset():
            self.preset.value = "custom" if self._differs_from_preset(settings) else settings["recipe"]
        problems = request_problems(settings)
        self.conflicts.value = "".join(f"<div style='color:#d62728'>⚠ {html.escape(p)}</div>" for p in problems)
        self.run_button.disabled = bool(problems) or self.running

    def _grey_unfit_methods(self) -> None:
        """Grey the methods that cannot act on this task's domain or on the chosen model, each with its reason."""
        spec, model = get_task(self.task.value), self.model.value
        misfits = method_misfits(spec, model) if model and spec.model_fit_problem(model) is None else {}
        for name, row in self.rows.items():
            row.set_available(unsuitable_reason(name, spec.domain) or misfits.get(name))

    @staticmethod
    def _differs_from_preset(settings: dict) -> bool:
        base = get_recipe(settings["task"], settings["recipe"])
        return (methods_differ(settings["methods"], base.methods) or (settings["model"], settings["duration"],
                settings["precision"]) != (base.model, base.duration, base.precision))

    def _filter_rows(self) -> None:
        shown = self.domain_filter.value
        for row in self.rows.values():
            row.box.layout.display = "flex" if shown in ("all", row.card.domain) else "none"

    # -- running ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.current is not None and self.current.running

    def run(self, wait: bool = False, stop_at_target: bool = False) -> BackgroundRun | None:
        """Start the configured run on a worker thread (``wait=True``: return when it has ended;
        ``stop_at_target=True``: end it once it reaches the target, to time it there)."""
        with self._lock:
            if self.running:
                self.status.value = "a run is already training; stop it first"
                return None
            problems = request_problems(self.settings())
            if problems:
                self.status.value = "<span style='color:#d62728'>cannot run: " + html.escape("; ".join(problems)) + "</span>"
                return None
            request = self.request
            name = self._run_name(request)
            trainer = make_trainer(trainer_request(request, run_name=name, run_dir=self.run_dir, loggers=self.loggers,
                                                   stop_at_target=stop_at_target,
                                                   progress_bar=False))  # the explorer draws its own progress
            with self._draw_lock:
                self._show_baseline(trainer.record)
                plots.add_run(self.figure, trainer.record, self._metric,
                              plots.PALETTE[len(self.history) % len(plots.PALETTE)])
            self.history.append(trainer.record)
            self.board.add(trainer.record)
            self.current = BackgroundRun(trainer, on_progress=self._on_progress, on_finish=self._on_finish,
                                         interval=self.update_interval)
            self.run_button.disabled, self.stop_button.disabled = True, False
            self.status.value = f"starting {name} …"
            self.current.start()
        if wait:
            self.current.wait()
        return self.current

    def stop(self) -> None:
        """End the current run at the next batch; it keeps its checkpoint and its RunRecord."""
        if self.running:
            self.status.value = f"stopping {self.current.trainer.run_name} …"
            self.current.stop("stopped from the explorer")

    def wait(self, timeout: float | None = None) -> RunRecord | None:
        return self.current.wait(timeout) if self.current is not None else None

    def run_all(self, configs: list, stop_at_target: bool = False, **defaults) -> list[RunRecord]:
        """Headless: run each configuration in turn, waiting for each (``stop_at_target=True``: each ends
        once it reaches the target, so its time to target costs no more training than it takes).

        A configuration is a RunRequest or a dict of its fields the explorer sets
        (``speedkit.ui.config.EXPLORER_FIELDS``). What a dict leaves out comes from
        ``defaults`` (for example the notebook's ``device``), then from the explorer's own settings; a
        ``None`` default (say ``duration=None``) keeps the recipe's own value.
        """
        current = {"task": self.task.value, "device": self.device.value, "seed": self.seed.value,
                   "data_fraction": self.data_fraction, "eval_fraction": self.eval_fraction,
                   "eval_interval": self.eval_interval}
        current.update({k: v for k, v in defaults.items() if v is not None})
        records = []
        for config in configs:
            if not isinstance(config, RunRequest):
                config = explorer_request({**current, **config})
            self.load_config(config)
            problems = request_problems(self.settings())
            if problems:
                raise ValueError(f"configuration {config} cannot run: " + "; ".join(problems))
            records.append(self.run(wait=True, stop_at_target=stop_at_target).record)
        return records

    @property
    def _metric(self) -> str:
        return get_task(self.task.value).target_metric

    def _run_name(self, request: RunRequest) -> str:
        label = run_recipe(request).name
        stamp = _dt.datetime.now().strftime("%H%M%S")
        name, n = f"{label}-{stamp}", 1
        while (self.run_dir / name).exists() or any(r.name == name for r in self.history):
            n += 1
            name = f"{label}-{stamp}-{n}"
        return name

    def _show_baseline(self, record: RunRecord) -> None:
        """Draw the baseline's curves once: the one passed in, else the board's latest baseline run."""
        baseline = self._baseline or latest_baseline(self.board.finished())
        if baseline is None or baseline.config.get("task") != record.config.get("task"):
            return
        if not any(t.legendgroup == baseline.run_id for t in self.figure.data):
            plots.add_run(self.figure, baseline, self._metric, baseline=True)

    def _on_progress(self, run: BackgroundRun) -> None:
        record, state = run.record, run.trainer.state
        with self._draw_lock:
            plots.update_run(self.figure, record, self._metric)
        self.progress.value = state.fraction_done()
        last = record.steps[-1] if record.steps else {}
        speed = last.get("throughput/samples_per_s")
        evaluated = record.evals[-1].get(self._metric) if record.evals else None
        parts = [record.status, f"epoch {state.timestamp.epoch}", f"batch {state.timestamp.batch}",
                 f"{100 * state.fraction_done():.0f}%", f"{state.timestamp.wall_s:.1f}s"]
        if speed:
            parts.append(f"{speed:,.0f} samples/s")
        if evaluated is not None:
            parts.append(f"{self._metric} {evaluated:.4f}")
        self.status.value = " · ".join([f"<b>{html.escape(record.name)}</b>", *parts])
        if not self.live and time.monotonic() - self._printed_at >= PRINT_EVERY_S:
            # Headless (papermill, `make demo`): nobody sees the widgets, so the run's progress goes to the
            # cell's output, which a headless runner streams as it arrives.
            self._printed_at = time.monotonic()
            print(f"{record.name}: " + ", ".join(parts), flush=True)

    def _on_finish(self, run: BackgroundRun) -> None:
        record = run.record
        self.board.add(record)
        self.refresh_measured()
        self.run_button.disabled, self.stop_button.disabled = False, True
        self._on_method_change()
        reached = record.time_to_target
        outcome = f"target reached after {reached:.1f}s" if reached is not None else "target not reached"
        error = f" — {html.escape(record.error)}" if record.error else ""
        self.status.value = (f"<b>{html.escape(record.name)}</b> {record.status}{error} · "
                             f"{record.timings.get('train_s', 0):.1f}s training · {outcome}")
        if not self.live:
            self._printed_at = -float("inf")  # the next run prints its first progress at once
            final = ", ".join(f"{k} {v:.4f}" for k, v in record.final_metrics.items() if isinstance(v, float))
            print(f"{record.name}: {record.status}{' (' + record.error + ')' if record.error else ''}, "
                  f"{record.timings.get('train_s', 0):.1f}s training, {final}", flush=True)

    def overlay(self, record: RunRecord) -> None:
        """Show a finished run's curves on the live plot, or hide them if they are shown."""
        with self._draw_lock:
            if any(t.legendgroup == record.run_id for t in self.figure.data):
                plots.remove_run(self.figure, record.run_id)
            else:
                plots.add_run(self.figure, record, self._metric, plots.PALETTE[-1])

    # -- code and static output -------------------------------------------------------------
    def show_code(self) -> str:
        request = self.request
        self.code.value = request_code(request)
        self.recipe_file.value = run_recipe(request).to_yaml()
        self.code_tabs.layout.display = "flex"
        return self.code.value

    def figures(self) -> list[go.Figure]:
        """Static figures of the session: curves of every run (baseline dashed), the board, contributions."""
        runs = self.board.finished()
        baseline = self._baseline or latest_baseline(runs)
        figs = [plots.curves_figure(runs, self._metric, baseline=baseline), self.board.scatter_figure()]
        contributions = self.board.contribution_figure()
        return figs + ([contributions] if contributions is not None else [])

    def show_static(self) -> None:
        """End a headless notebook with plain figures and the board's table (no widget state stored)."""
        from IPython.display import HTML, display

        plots.use_static_renderer()
        display(HTML(self.board.table_html()))
        for fig in self.figures():
            fig.show()
