"""One run request: the CLI, the explorer, the benchmark and the search build the same RunRequest from the
same settings, its checks are written once (a bad field is refused, naming it, by every front end alike),
and the Trainer options it passes on are read from the Trainer's own signature."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from speedkit.cli.main import _parser, main
from speedkit.cli.train import run_request
from speedkit.experiments.bench import get_profile, harness
from speedkit.experiments.tune.objective import TrialContext, trial_request
from speedkit.tasks import RunRequest, make_trainer
from speedkit.tasks.build import resolved_request
from speedkit.tasks import get_recipe
from speedkit.tasks.request import trainer_options
from speedkit.train.trainer import Trainer
from speedkit.ui.config import EXPLORER_FIELDS, explorer_request, request_problems, trainer_request

SETTINGS = {"task": "fashion-mnist", "recipe": "mild", "duration": "2ep", "device": "cpu", "seed": 3,
            "data_fraction": 0.1, "eval_fraction": 0.2, "eval_interval": "0.5ep", "target": 0.8}
# What each front end adds for its own bookkeeping (where records go, what they are marked with, its
# callbacks); the run itself is the rest.
BOOKKEEPING = {"run_name": None, "run_dir": None, "extra_config": None, "trainer_options": {},
               "stop_at_target": False, "loggers": None}


def from_cli() -> RunRequest:
    s = SETTINGS
    args = _parser().parse_args(["train", "--task", s["task"], "--recipe", s["recipe"], "--duration", s["duration"],
                                 "--device", s["device"], "--seed", str(s["seed"]), "--data-fraction",
                                 str(s["data_fraction"]), "--eval-fraction", str(s["eval_fraction"]),
                                 "--eval-interval", s["eval_interval"], "--target", str(s["target"])])
    return run_request(args)


def from_explorer() -> RunRequest:
    return trainer_request(explorer_request(SETTINGS))


def from_bench() -> RunRequest:
    s = SETTINGS
    profile = get_profile("vision", "cpu").replace(device=s["device"], data_fraction=s["data_fraction"],
                                                   eval_fraction=s["eval_fraction"], eval_interval=s["eval_interval"],
                                                   duration=s["duration"], target=s["target"])
    return harness.run_request(profile, harness.scheduled_recipe(profile, s["recipe"]), s["seed"], "run", "runs", {})


def from_tune() -> RunRequest:
    s = SETTINGS
    recipe = get_recipe(s["task"], s["recipe"]).with_changes(name="tune-search-t0003", duration=s["duration"])
    run = RunRequest(s["task"], recipe, seed=s["seed"], run_dir="runs", run_name="trial", device=s["device"],
                     data_fraction=s["data_fraction"], eval_fraction=s["eval_fraction"],
                     eval_interval=s["eval_interval"], extra_config={"seed": s["seed"]})
    context = TrialContext(run=run, metric="eval/accuracy", target=s["target"], limit_s=60.0, stop_after_s=60.0)
    return trial_request(context)


def the_run(request: RunRequest) -> RunRequest:
    """The request with its recipe resolved, less each front end's bookkeeping. The recipe's name and what
    the preset reached are what a record is labelled with, not what runs (the explorer drops ``reached``
    from a changed preset, the search names each trial's recipe)."""
    resolved = resolved_request(request)
    recipe = {k: v for k, v in resolved.recipe.to_dict().items() if k not in ("name", "reached")}
    return resolved.replace(recipe="compared below", **BOOKKEEPING), recipe


def test_every_front_end_builds_the_same_request_from_the_same_settings():
    runs = {name: the_run(build()) for name, build in (("cli", from_cli), ("explorer", from_explorer),
                                                       ("bench", from_bench), ("tune", from_tune))}
    cli_request, cli_recipe = runs.pop("cli")
    assert cli_recipe["duration"] == "2ep" and cli_request.seed == 3 and cli_request.data_fraction == 0.1
    assert cli_recipe["eval_interval"] == "0.5ep"  # mild evaluates every epoch; the flag says 0.5ep
    for name, (request, recipe) in runs.items():
        assert request == cli_request, name
        assert recipe == cli_recipe, name


def test_the_convenience_form_builds_the_request_it_names():
    request = RunRequest.build("fashion-mnist", "mild", methods="label_smoothing, ema", seed=2, autoresume=True)
    assert request.methods == {"label_smoothing": {}, "ema": {}}  # one form of methods, whatever was given
    assert request.trainer_options == {"autoresume": True}  # a Trainer argument, passed on as it is
    assert request.replace(save_checkpoints=False).trainer_options == {"autoresume": True, "save_checkpoints": False}
    with pytest.raises(TypeError, match=r"make_trainer\(request\) takes the request alone"):
        make_trainer(request, seed=1)


def test_trainer_options_are_read_from_the_trainer_signature():
    parameters = set(list(inspect.signature(Trainer.__init__).parameters)[1:])
    fields = {f.name for f in dataclasses.fields(RunRequest)}
    assert set(trainer_options()) < parameters
    assert parameters - set(trainer_options()) <= fields | {"model", "train_dataloader", "eval_dataloader",
                                                             "evaluators", "max_duration", "optimizers",
                                                             "schedulers", "stop_at", "loss_fn", "config"}


def test_an_unknown_setting_is_refused_naming_it_and_what_is_taken():
    with pytest.raises(TypeError, match=r"unknown run setting\(s\) \['epochs'\].*'duration'.*'callbacks'"):
        make_trainer("fashion-mnist", "mild", epochs=3)
    with pytest.raises(TypeError, match=r"trainer_options \['seed'\]: a run request fills these itself"):
        RunRequest(trainer_options={"seed": 1})


@pytest.mark.parametrize("field, value, message", [
    ("seed", -1, "seed must be a whole number in [0, 4294967295], got -1"),
    ("data_fraction", 1.5, "data_fraction must be in (0, 1], got 1.5"),
    ("eval_fraction", 0, "eval_fraction must be in (0, 1], got 0"),
    ("duration", "3", "duration: "),
    ("precision", "fp8", "precision must be one of"),
    ("device", "tpu", "device must be one of"),
    ("target", "high", "target must be a finite number"),
])
def test_a_bad_field_is_refused_once_with_its_name_by_every_front_end(field, value, message):
    with pytest.raises((ValueError, TypeError)) as direct:
        RunRequest(**{field: value})
    assert message in str(direct.value)
    with pytest.raises(type(direct.value), match="^" + _escaped(str(direct.value)) + "$"):
        make_trainer("fashion-mnist", "mild", **{field: value})  # refused before any data is read
    if field in EXPLORER_FIELDS:  # the explorer shows the request's own refusal as its problem
        assert request_problems({field: value}) == [str(direct.value)]
    with pytest.raises(type(direct.value), match="^" + _escaped(str(direct.value)) + "$"):
        get_profile("vision", "cpu").replace(**{field: value})  # a profile's runs are its RunRequest's


@pytest.mark.parametrize("flags, message", [
    (["--seed", "-1"], "seed must be a whole number"),
    (["--data-fraction", "2"], "data_fraction must be in (0, 1]"),
    (["--duration", "3"], "duration: "),
])
def test_the_cli_refuses_a_bad_flag_with_the_request_message(capsys, flags, message):
    assert main(["train", "--device", "cpu", *flags]) == 2
    assert message in capsys.readouterr().err


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_a_rung_picked_by_name_is_planned_on_the_data_by_every_front_end_unless_a_length_is_given():
    """The ladder's step floor: `speedkit train --recipe hot` had it, the explorer's and the bench's hot did not."""
    s = {**SETTINGS, "recipe": "hot"}
    cli = run_request(_parser().parse_args(["train", "--task", s["task"], "--recipe", "hot", "--device", "cpu"]))
    explorer = trainer_request(explorer_request({k: v for k, v in s.items() if k != "duration"}))
    profile = get_profile("vision", "cpu").replace(device="cpu")
    bench = harness.run_request(profile, harness.scheduled_recipe(profile, "hot"), 0, "run", "runs", {})
    assert resolved_request(cli).step_floor and explorer.step_floor and bench.step_floor
    asked = [run_request(_parser().parse_args(["train", "--task", s["task"], "--recipe", "hot", "--duration", "2ep"])),
             trainer_request(explorer_request(s)),
             harness.run_request(profile.replace(duration="2ep"), harness.scheduled_recipe(profile, "hot"), 0, "r", "r", {})]
    assert not any(resolved_request(r).step_floor for r in asked)  # a length asked for is the user's
