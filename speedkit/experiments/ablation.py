"""Leave-one-out: which runs say what each part of a recipe adds. The benchmark and the search both plan
and run their ablations here (``leave_one_out_runs``), so a part left out means the same thing in both reports.

A part is one of the recipe's methods the reference recipe (the baseline its speed-up is measured against) does
not have as it is, or one of the non-method ``PARTS`` where the two differ: together, the recipe's whole
difference from the reference. Leaving a part out gives the recipe the reference's value of it: a method the
reference has too at other settings gets the reference's settings, one it lacks is dropped. Every ablated run
carries ``ablation_marker``'s ``config["ablation"]``, which ``speedkit.experiments.compare.leave_one_out`` and the
run board read; ``leave_one_out_summary`` is the one table the benchmark's and the search's summaries and reports
hold.
"""
from __future__ import annotations

import dataclasses

from speedkit.core.devices import resolve_device, resolve_precision
from speedkit.experiments.compare import final_metric, part_effect
from speedkit.tasks.recipes import Recipe

# Parts of a recipe besides its methods that a leave-one-out run can swap for the reference's: together
# with the methods they are the recipe's whole difference from the reference.
PARTS = ("precision", "loader", "augment", "resolution", "budget", "schedule", "batch_size", "learning_rate",
         "optimizer")


def part_value(recipe: Recipe, part: str):
    """What ``part`` of a recipe is: a field, or the learning rate / the rest of the optimizer."""
    if part == "budget":
        return recipe.duration
    if part == "learning_rate":
        return recipe.optimizer.get("lr")
    if part == "optimizer":
        return {k: v for k, v in recipe.optimizer.items() if k != "lr"}
    return getattr(recipe, part)


def _swap_part(recipe: Recipe, part: str, reference: Recipe) -> dict:
    """The field changes that give ``recipe`` the reference's ``part``."""
    if part == "budget":
        return {"duration": reference.duration}
    if part == "learning_rate":
        return {"optimizer": {**recipe.optimizer, "lr": reference.optimizer.get("lr")}}
    if part == "optimizer":
        return {"optimizer": {**reference.optimizer, "lr": recipe.optimizer.get("lr")}}
    return {part: getattr(reference, part)}


def ablation_changes(recipe: Recipe, reference: Recipe) -> dict[str, dict]:
    """``{part left out: field changes}``: one per method the reference does not have as it is, in the
    recipe's order, then one per non-method part where the recipe differs from the reference."""
    changes = {}
    for method, params in recipe.methods.items():
        if reference.methods.get(method) == params:
            continue  # the reference has it too: not part of the difference
        kept = {m: p for m, p in recipe.methods.items() if m != method}
        if method in reference.methods:
            kept[method] = reference.methods[method]
        changes[method] = {"methods": kept}
    for part in PARTS:
        if part_value(recipe, part) != part_value(reference, part):
            changes[part] = _swap_part(recipe, part, reference)
    return changes


def ablated_recipes(recipe: Recipe, reference: Recipe) -> dict[str, Recipe]:
    """``{part left out: the recipe without it}`` (see ``ablation_changes``); each keeps the recipe's name."""
    # Not Recipe.with_changes: it skips None values, and the reference's part may be None (no augmentation).
    return {part: Recipe(**{**dataclasses.asdict(recipe), **change})
            for part, change in ablation_changes(recipe, reference).items()}


def as_run_on(recipe: Recipe, device) -> Recipe:
    """``recipe`` with "auto" precision as it runs on ``device``: "auto" beside a bf16 baseline that it runs as
    is no difference to leave out."""
    return recipe.with_changes(precision=resolve_precision(recipe.precision, resolve_device(device)))


def ablation_marker(of: str, left_out: str, against: str, of_run: str | None = None) -> dict:
    """``config["ablation"]`` of a run of ``of`` (the full run's name; ``of_run`` its run id, where runs of one name
    may be several) without ``left_out``, given the value of the reference recipe ``against`` names."""
    return {"of": of, "left_out": left_out, "against": against, **({"of_run": of_run} if of_run else {})}


def seed_to_ablate(seeds, recipe_times, reference_times):
    """The seed a leave-one-out runs on, from each seed's time to the target of the recipe and of the reference
    recipe its parts come from (None: not reached): the first where both reached it, so that each part's share
    of the speed-up over the reference can be measured there; else the first where the recipe reached it; else
    the first."""
    both = [seed for seed, mine, theirs in zip(seeds, recipe_times, reference_times)
            if mine is not None and theirs is not None]
    reached = [seed for seed, mine in zip(seeds, recipe_times) if mine is not None]
    return (both or reached or list(seeds))[0]


def leave_one_out_runs(recipe: Recipe, run, of: str, reference: Recipe, against: str,
                       of_run: str | None = None) -> dict:
    """The one leave-one-out driver (the benchmark's and the search's): ``run(part, ablated recipe, marker)``
    for each part of ``recipe``'s difference from ``reference`` left out (``ablated_recipes``), in order, with
    the run's ``config["ablation"]`` (``ablation_marker``: ``of`` names the full run, ``against`` the reference
    recipe); ``{part: what run returned}``."""
    return {part: run(part, ablated, ablation_marker(of, part, against, of_run))
            for part, ablated in ablated_recipes(recipe, reference).items()}


def leave_one_out_rows(ablations, metric: str, value: float) -> dict[str, dict]:
    """``{part left out: its run's row}`` of leave-one-out runs (RunRecords marked by ``ablation_marker``): the
    run, its time to ``metric`` ``value`` and its final metric, and its error where it failed; the rows
    ``leave_one_out_summary`` takes."""
    return {record.config["ablation"]["left_out"]: {
        "run": record.name, "time_without_s": record.time_to(metric, value),
        "final_metric": final_metric(record, metric), **({"error": record.error} if record.error else {})}
        for record in ablations}


def leave_one_out_summary(of: str, time_with: float | None, final_with: float | None, rows: dict[str, dict],
                          baseline_time: float | None = None, against: str | None = None, **about) -> dict:
    """The one leave-one-out table (the benchmark's summary.json and the search's): ``rows`` is ``{part left out:
    {"time_without_s", "final_metric", ...}}`` for the runs of ``of`` (the full run's name, whose time to the
    target is ``time_with``) without each part; each row gains ``compare.part_effect``'s slowdown and share of
    the speed-up over ``baseline_time``. ``against`` names the reference recipe the parts were taken from (None in
    tables written before every leave-one-out had one: methods dropped); ``about`` adds fields (the recipe, the
    seed)."""
    parts = {part: {**row, "slowdown": None, "share": None, "pays_off": None,
                    **(part_effect(row["time_without_s"], time_with, baseline_time) if time_with is not None else {})}
             for part, row in rows.items()}
    shares = [row["share"] for row in parts.values() if row.get("share") is not None]
    needed = [part for part, row in parts.items() if row["time_without_s"] is None and "error" not in row]
    return {**about, "of": of, "against": against, "share_sum": sum(shares) if shares else None,
            "not_reached_without": needed, "time_to_target_s": time_with, "final_metric": final_with, "parts": parts}
