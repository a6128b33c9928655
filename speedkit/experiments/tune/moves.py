"""The search's proposals after its starting points: small moves from the best recipe so far, as a person tuning
by hand makes them (add, drop or retune one method, a shorter or longer budget, the learning rate, a neighbouring
batch size or schedule; see docs/guide.md). Independent draws over 30 switches mostly land on combinations
that miss the target; a move from the incumbent keeps what already works. Which method to drop first is read
from the domain's committed leave-one-out (``prior``). Every move is checked before it is proposed (valid,
inside the space, not tried); ``propose_move`` returns None when none is left and the sampler draws instead.
"""
from __future__ import annotations

import dataclasses
import json
import random

from speedkit.core.time import scaled_duration
from speedkit.experiments.tune.space import (FIELDS, SearchSpace, is_searched, limited_hparam, recipe_params,
                                             search_choices)

TWO_MOVES_SHARE = 0.25  # how often a proposal makes two changes at once (one move alone can sit in a local dip)
UNTRIED_ADD_WEIGHT = 3.0  # adding a method no trial has had yet: what the search knows least about
ESSENTIAL_DROP_WEIGHT = 0.25  # dropping a method without which the reference preset missed its target


def drop_weight(slowdown: float | None) -> float:
    """How likely dropping a method is, from its leave-one-out slowdown on the reference task (time without
    it over time with it): 1 for no effect, above for one that slowed the reference, at most 2."""
    return ESSENTIAL_DROP_WEIGHT if slowdown is None else min(2.0, 1.0 / slowdown ** 2)


@dataclasses.dataclass(frozen=True)
class Move:
    """One proposal: what changed from the incumbent, in words, and the recipe it makes."""

    what: str
    recipe: object  # speedkit.tasks.recipes.Recipe
    weight: float = 1.0  # how likely it is picked among the incumbent's moves


def recipe_key(recipe) -> str:
    """Two recipes that train alike have the same key (their names and summaries do not count)."""
    data = {k: v for k, v in dataclasses.asdict(recipe).items() if k not in ("name", "summary", "reached")}
    return json.dumps(data, sort_keys=True, default=str)


def propose_move(incumbent, reached: bool, base, space: SearchSpace, refused: set[str], tried: set[str],
                 rng: random.Random, added: set[str] = frozenset(), prior: dict | None = None) -> Move | None:
    """A move from ``incumbent`` not tried yet (one, or now and then two), or None when none is left.

    ``reached``: whether the incumbent reached the target (then a shorter budget is the likeliest gain,
    else a longer one). ``refused``: methods that found nothing in this model. ``tried``: ``recipe_key`` of
    every recipe proposed so far. ``added``: methods some trial had (adding one that none had is likelier).
    ``prior``: method -> its leave-one-out slowdown on the reference task (``drop_weight``).
    """
    first = _pick(neighbour_moves(incumbent, reached, base, space, refused, tried, added, prior), rng)
    if first is None:
        return None
    if rng.random() < TWO_MOVES_SHARE:
        second = _pick([m for m in neighbour_moves(first.recipe, reached, base, space, refused, tried, added, prior)
                        if m.what.split(" ", 1)[0] != first.what.split(" ", 1)[0]], rng)
        if second is not None:
            return Move(f"{first.what}, {second.what}", second.recipe)
    return first


def _move(what: str, changes: dict, recipe, weight: float = 1.0) -> list[Move]:
    """[the move], or [] where the changed recipe is refused (a method's settings break its card's rules)."""
    try:
        return [Move(what, recipe.with_changes(**changes), weight)]
    except (ValueError, TypeError):
        return []


def _pick(moves: list[Move], rng: random.Random) -> Move | None:
    if not moves:
        return None
    return rng.choices(moves, weights=[m.weight for m in moves], k=1)[0]


def neighbour_moves(recipe, reached: bool, base, space: SearchSpace, refused: set[str],
                    tried: set[str], added: set[str] = frozenset(), prior: dict | None = None) -> list[Move]:
    """Every single move from ``recipe`` that is valid, inside ``space`` and not tried."""
    moves = [*_method_moves(recipe, space, refused, added, prior or {}), *_budget_moves(recipe, reached),
             *_lr_moves(recipe), *_field_moves(recipe, base, space)]
    return [m for m in moves if recipe_key(m.recipe) not in tried and _valid(m.recipe, base, space)]


def _valid(recipe, base, space: SearchSpace) -> bool:
    """The methods build with these settings and together, and the recipe is a point of the space."""
    from speedkit.core.method import IncompatibleMethodsError, check_compatibility
    from speedkit.methods import build_methods

    try:
        check_compatibility(build_methods(recipe.methods))
    except (ValueError, TypeError, IncompatibleMethodsError):
        return False
    return recipe_params(recipe, base, space) is not None


def _method_moves(recipe, space: SearchSpace, refused: set[str], added: set[str], prior: dict) -> list[Move]:
    from speedkit.methods import REGISTRY

    moves = []
    for name in space.methods:
        if name in recipe.methods:
            moves += _move(f"-{name}", {"methods": {k: v for k, v in recipe.methods.items() if k != name}}, recipe,
                           drop_weight(prior[name]) if name in prior else 1.0)
        elif name not in refused:
            moves += _move(f"+{name}", {"methods": {**recipe.methods, name: {}}}, recipe,
                           1.0 if name in added else UNTRIED_ADD_WEIGHT)
    if not space.tune_hparams:
        return moves
    retunes = []
    for name, params in recipe.methods.items():
        card = REGISTRY[name].CARD
        current = {h.name: h.default for h in card.hparams} | dict(params or {})
        for hp in filter(is_searched, card.hparams):
            for value in _retuned(limited_hparam(name, hp, space.hparam_limits, current), current[hp.name]):
                changed = {**recipe.methods, name: {**(params or {}), hp.name: value}}
                shown = f"{value:.3g}" if isinstance(value, float) else f"{value}"
                retunes += _move(f"{name}.{hp.name}={shown}", {"methods": changed}, recipe)
    share = 2.0 / max(1, len(retunes))  # all retunes together weigh as two adds or drops
    return moves + [dataclasses.replace(m, weight=share) for m in retunes]


def _retuned(hp, value) -> list:
    """The values one step away from ``value`` in the hyperparameter's (narrowed) range."""
    choices = search_choices(hp)
    if choices is not None:
        return [c for c in choices if c != value]
    if hp.log and hp.low > 0:
        steps = [value / 2, value * 2]
    else:
        quarter = (hp.high - hp.low) / 4
        steps = [value - quarter, value + quarter]
    out = []
    for step in steps:
        step = min(hp.high, max(hp.low, step))
        step = int(round(step)) if hp.type is int else float(f"{step:.3g}")
        if step != value and step not in out:
            out.append(step)
    return out


def _budget_moves(recipe, reached: bool) -> list[Move]:
    """A shorter budget is where a recipe that reached the target gains; a longer one rescues one that missed."""
    shorter, longer = (4.0, 0.5) if reached else (0.5, 4.0)
    return [*_move("budget x0.8", {"duration": scaled_duration(recipe.duration, 0.8)}, recipe, shorter),
            *_move("budget x1.25", {"duration": scaled_duration(recipe.duration, 1.25)}, recipe, longer)]


def _lr_moves(recipe) -> list[Move]:
    lr = recipe.optimizer.get("lr")
    if not lr:
        return []
    return [move for factor in (0.7, 1.4)
            for move in _move(f"lr x{factor:g}", {"optimizer": {"lr": float(f"{lr * factor:.4g}")}}, recipe)]


def _field_moves(recipe, base, space: SearchSpace) -> list[Move]:
    """Another choice of a recipe field (``space.FIELDS``; a neighbouring one on an ordered scale such as the
    batch size): less likely than a method move."""
    moves = []
    for field in (f for f in FIELDS if f.move_weight is not None):  # precision and loader: the sampler's
        choices = getattr(space, field.space_attr)
        if field.neighbours:
            ordered, current = sorted(choices), field.value(recipe)
            at = ordered.index(current) if current in ordered else None
            choices = [] if at is None else [ordered[i] for i in (at - 1, at + 1) if 0 <= i < len(ordered)]
        for choice in choices:
            value = field.to_value(choice, base)
            if value != field.value(recipe):
                moves += _move(f"{field.name}={choice}", field.changes(value, recipe), recipe, field.move_weight)
    return moves
