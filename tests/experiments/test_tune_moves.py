"""The search's moves from the best recipe so far (speedkit.experiments.tune.moves) and card constraints."""
from __future__ import annotations

import random

import pytest
from prerequisites import import_or_missing  # noqa: E402

optuna = import_or_missing("optuna")

from speedkit.experiments.tune.moves import neighbour_moves, propose_move, recipe_key  # noqa: E402
from speedkit.experiments.tune.space import SearchSpace, full_space, recipe_params, suggest_hparams  # noqa: E402
from speedkit.methods import get_method  # noqa: E402
from speedkit.tasks import Recipe  # noqa: E402

BASE = Recipe(name="b", task="fashion-mnist", domain="vision", model="resnet8", duration="8ep", batch_size=128,
              optimizer={"name": "sgd", "lr": 0.1}, loader="memory", augment={"crop_pad": 2, "flip": "random"})
SPACE = full_space(BASE, ["mixup", "cutmix", "label_smoothing", "gyro_dropout", "ema"], "cpu")


def _incumbent():
    return BASE.with_changes(methods={"mixup": {}, "label_smoothing": {}}, duration="4ep")


def test_every_move_is_one_change_inside_the_space_and_builds():
    incumbent = _incumbent()
    moves = neighbour_moves(incumbent, True, BASE, SPACE, refused=set(), tried=set())
    whats = {m.what for m in moves}
    assert {"-mixup", "-label_smoothing", "+ema", "+gyro_dropout", "budget x0.8", "budget x1.25"} <= whats
    assert "+cutmix" not in whats  # it holds mixup's role: the pair is never proposed
    for move in moves:
        assert recipe_params(move.recipe, BASE, SPACE) is not None, move.what
        [get_method(name, **params) for name, params in move.recipe.methods.items()]  # builds as proposed
        changed = {k for k in ("methods", "duration", "optimizer", "batch_size", "schedule", "augment")
                   if getattr(move.recipe, k) != getattr(incumbent, k)}
        assert len(changed) == 1, (move.what, changed)


def test_a_recipe_that_reached_is_most_likely_shortened_and_one_that_missed_lengthened():
    for reached, likeliest in ((True, "budget x0.8"), (False, "budget x1.25")):
        moves = neighbour_moves(_incumbent(), reached, BASE, SPACE, set(), set())
        assert max(moves, key=lambda m: m.weight).what == likeliest


def test_refused_and_tried_recipes_are_never_proposed_again():
    incumbent, tried = _incumbent(), set()
    rng = random.Random(0)
    for _ in range(60):
        move = propose_move(incumbent, True, BASE, SPACE, refused={"gyro_dropout"}, tried=tried, rng=rng)
        if move is None:
            break
        assert "gyro_dropout" not in move.recipe.methods
        key = recipe_key(move.recipe)
        assert key not in tried, move.what
        tried.add(key)
    assert len(tried) >= 20  # many distinct proposals, none a repeat


def test_no_move_is_left_when_every_neighbour_was_tried():
    space = SearchSpace(methods=("label_smoothing",), tune_hparams=False, lr_factor=None, duration_scale_range=None)
    base = BASE.with_changes(methods={})
    moves = neighbour_moves(base, True, base, space, set(), set())
    assert [m.what for m in moves] == ["+label_smoothing"]
    tried = {recipe_key(moves[0].recipe)}
    assert propose_move(base, True, base, space, set(), tried, random.Random(0)) is None


def test_a_card_constraint_is_refused_when_built_and_kept_when_sampled():
    with pytest.raises(ValueError, match=r"tau=64 must not exceed sigma=8"):
        get_method("gyro_dropout", sigma=8, tau=64)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(100):
        trial = study.ask()
        params = suggest_hparams(trial, "gyro_dropout")
        assert params["tau"] <= params["sigma"], params
        get_method("gyro_dropout", **params)
        study.tell(trial, 1.0)
    incumbent = BASE.with_changes(methods={"gyro_dropout": {"sigma": 4, "tau": 4}})
    for move in neighbour_moves(incumbent, True, BASE, SPACE, set(), set()):
        gyro = move.recipe.methods.get("gyro_dropout")
        if gyro:
            assert gyro.get("tau", 16) <= gyro.get("sigma", 256), move.what


def test_the_reference_leave_one_out_sets_which_method_is_dropped_first():
    """A method the reference preset reached its target sooner without is dropped likeliest; one it missed the
    target without, least; one with no figure as usual. The figures are the committed benchmark's."""
    from speedkit.tasks.ladder import reference_leave_one_out

    prior = reference_leave_one_out("vision")  # hot's methods, each a slowdown without it, or None: never reached
    assert {"muon", "label_smoothing", "test_time_augmentation"} <= set(prior) and prior["muon"] is None
    assert all(slowdown is None or slowdown > 0 for slowdown in prior.values())
    assert reference_leave_one_out("audio") == {}
    incumbent = BASE.with_changes(methods={"mixup": {}, "label_smoothing": {}, "ema": {}})
    planted = {"mixup": 0.8, "label_smoothing": None}  # faster without mixup; no target without label smoothing
    weights = {m.what: m.weight for m in neighbour_moves(incumbent, True, BASE, SPACE, set(), set(), prior=planted)}
    assert weights["-mixup"] > weights["-ema"] == 1.0 > weights["-label_smoothing"]
    plain = {m.what: m.weight for m in neighbour_moves(incumbent, True, BASE, SPACE, set(), set())}
    assert plain["-mixup"] == plain["-label_smoothing"] == plain["-ema"]


def test_each_field_choice_a_trial_draws_reads_back_as_that_choice_and_is_one_move_away():
    """``space.FIELDS`` is the one description of a searched recipe field: a recipe a trial draws with a choice
    reads back (``recipe_params``, what enqueues a known recipe) as that choice, and a move from the base reaches
    it (precision and loader are left to the sampler; the batch size moves to a neighbour only)."""
    from speedkit.experiments.tune.space import FIELDS, suggest_recipe

    study = optuna.create_study()
    moves = {m.what for m in neighbour_moves(BASE, True, BASE, SPACE, refused=set(), tried=set())}
    for field in FIELDS:
        choices = getattr(SPACE, field.space_attr)
        assert choices, field.name
        for choice in choices:
            study.enqueue_trial({field.name: choice})
            recipe = suggest_recipe(study.ask(), BASE, SPACE, "t")
            assert recipe_params(recipe, BASE, SPACE)[field.name] == choice, (field.name, choice)
            if field.move_weight is not None and field.to_value(choice, BASE) != field.value(BASE) \
                    and not field.neighbours:
                assert f"{field.name}={choice}" in moves, (field.name, choice)
    assert {"batch_size=64", "batch_size=256"} <= moves and "batch_size=512" not in moves
    assert not any(m.startswith(("precision=", "loader=")) for m in moves)
