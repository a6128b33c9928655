"""The catalogue as a whole: every card complete, every Composer name present, and pairs of methods either
train together or are refused with the declared conflict. Pairs come from the registry, so a new method is
covered without editing this file: every pair whose cards say they interact (a declared conflict or order,
or an event and a target in common) runs on its own; of the others, which touch disjoint parts of a step,
a seeded sample runs in one test (``SPEEDKIT_PAIR_SEED`` picks another sample)."""
from __future__ import annotations

import itertools
import os
import random

import pytest
import torch
from method_harness import run_steps, tiny_language, tiny_vision

from speedkit.core import IncompatibleMethodsError
from speedkit.core.method import CARD_DOMAINS, STAGES
from speedkit.methods import REGISTRY

COMPOSER_METHODS = [
    "alibi", "augmix", "blurpool", "channels_last", "colout", "cutmix", "cutout", "ema", "factorize",
    "gated_linear_units", "ghost_batchnorm", "gradient_clipping", "gyro_dropout", "label_smoothing",
    "layer_freezing", "low_precision_groupnorm", "low_precision_layernorm", "mixup", "progressive_resizing",
    "randaugment", "sam", "selective_backprop", "seq_length_warmup", "squeeze_excite", "stochastic_depth", "swa",
    "weight_standardization",
]

# What a method needs from the tiny tasks to have something to act on: a part to add to the model
# ("groupnorm", "layernorm", "dropout"), smaller size thresholds, or "slow" (left to its own tests).
NEEDS = {
    "low_precision_groupnorm": {"groupnorm"},
    "low_precision_layernorm": {"layernorm"},
    "gyro_dropout": {"dropout"},
    "torch_compile": {"slow"},
    "fp8": {"gpu"},  # refused on a CPU (tests/methods/test_fp8_and_cuda_graphs.py)
}
PARAMS = {
    "blurpool": {"min_channels": 8},
    "squeeze_excite": {"min_channels": 8, "latent_channels": 4.0},
    "factorize": {"min_channels": 8},
}


def test_registry_has_every_composer_method_and_at_least_38():
    missing = [name for name in COMPOSER_METHODS if name not in REGISTRY]
    assert not missing, f"Composer methods missing from the registry: {missing}"
    assert len(REGISTRY) >= 38, sorted(REGISTRY)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_card_is_complete(name):
    cls = REGISTRY[name]
    card = cls.CARD
    assert card.name == name and card.summary and card.domain in CARD_DOMAINS
    assert card.events, f"{name} declares no events"
    assert card.writes and all(w in STAGES for w in (*card.reads, *card.writes))
    assert card.effect and card.source, f"{name} must state its expected effect and its source"
    for hp in card.hparams:
        hp.validate(hp.default, name)  # every default lies within its own range
        if hp.type in (int, float) and hp.choices is None:
            assert hp.low is not None and hp.high is not None, f"{name}.{hp.name} needs a range"
            assert hp.step or (hp.log and hp.low > 0), f"{name}.{hp.name} needs a step (or log=True)"
    for other in card.conflicts:
        assert other in REGISTRY, f"{name} declares a conflict with unknown method {other!r}"
    instance = cls()  # constructible from its card's defaults
    assert instance.params == {hp.name: hp.default for hp in card.hparams}


def _setup_for(domain: str, needs: set[str]):
    if domain == "language":
        return tiny_language(dropout=0.1 if "dropout" in needs else 0.0)
    model, train, test = tiny_vision()
    head = [model.fc]
    if "dropout" in needs:
        head.insert(0, torch.nn.Dropout(0.1))
    if "layernorm" in needs:
        head.insert(0, torch.nn.LayerNorm(model.fc.in_features))
    model.fc = torch.nn.Sequential(*head) if len(head) > 1 else model.fc
    if "groupnorm" in needs:
        model.stem.append(torch.nn.GroupNorm(2, model.stem[0].out_channels))
    return model, train, test


def _domains(a: str, b: str) -> list[str]:
    da, db = REGISTRY[a].CARD.domain, REGISTRY[b].CARD.domain
    if "any" not in (da, db) and da != db:
        return []
    shared = da if da != "any" else db
    return ["vision", "language"] if shared == "any" else [shared]


def cards_interact(a: str, b: str) -> bool:
    """The cards say the two methods meet: a declared conflict, a shared exclusive role, an explicit order,
    or an event at which one writes what the other reads or writes."""
    ca, cb = REGISTRY[a].CARD, REGISTRY[b].CARD
    if b in ca.conflicts or a in cb.conflicts or set(ca.exclusive) & set(cb.exclusive):
        return True
    if a in cb.runs_after or b in ca.runs_after:
        return True
    shared_target = set(ca.writes) & {*cb.reads, *cb.writes} or set(cb.writes) & set(ca.reads)
    return bool(set(ca.events) & set(cb.events) and shared_target)


ALL_PAIRS = [(a, b, domain) for a, b in itertools.combinations(sorted(REGISTRY), 2)
             if not {"slow", "gpu"} & (NEEDS.get(a, set()) | NEEDS.get(b, set())) for domain in _domains(a, b)[:1]]
PAIRS = [pair for pair in ALL_PAIRS if cards_interact(*pair[:2])]
OTHER_PAIRS = [pair for pair in ALL_PAIRS if not cards_interact(*pair[:2])]
PAIR_SEED = int(os.environ.get("SPEEDKIT_PAIR_SEED", "0"))
SAMPLED = 12  # of the pairs that touch disjoint parts of a step


@pytest.mark.parametrize("a, b, domain", PAIRS, ids=[f"{a}+{b}" for a, b, _ in PAIRS])
def test_every_interacting_pair_trains_together_or_is_refused(tmp_path, a, b, domain):
    check_pair(tmp_path, a, b, domain)


def test_a_seeded_sample_of_the_other_pairs_trains_together(tmp_path):
    assert len(PAIRS) + len(OTHER_PAIRS) == len(ALL_PAIRS) and PAIRS and OTHER_PAIRS
    for a, b, domain in random.Random(PAIR_SEED).sample(OTHER_PAIRS, SAMPLED):
        try:
            check_pair(tmp_path / f"{a}+{b}", a, b, domain)
        except Exception as error:
            raise AssertionError(f"{a}+{b} ({domain}) failed; rerun this sample with SPEEDKIT_PAIR_SEED="
                                 f"{PAIR_SEED}: {type(error).__name__}: {error}") from error


def check_pair(tmp_path, a: str, b: str, domain: str) -> None:
    """Two methods train three steps together and evaluate, or are refused naming both when declared apart."""
    first, second = REGISTRY[a](**PARAMS.get(a, {})), REGISTRY[b](**PARAMS.get(b, {}))
    declared = (b in first.CARD.conflicts or a in second.CARD.conflicts
                or set(first.CARD.exclusive) & set(second.CARD.exclusive))
    setup = _setup_for(domain, NEEDS.get(a, set()) | NEEDS.get(b, set()))
    if declared:
        with pytest.raises(IncompatibleMethodsError) as info:
            run_steps(setup, [first, second], steps=2, tmp_path=tmp_path)
        assert a in str(info.value) and b in str(info.value)
        return
    trainer = run_steps(setup, [first, second], steps=3, tmp_path=tmp_path, precision="bf16")
    record = trainer.record
    assert record.status == "completed"
    assert all(torch.isfinite(p).all() for p in trainer.state.model.parameters())
    assert record.evals, "the pair must also evaluate"


def test_readme_methods_table_is_generated_from_the_cards():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("update_readme", root / "scripts" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme, guide = (root / "README.md").read_text(), (root / "docs" / "guide.md").read_text()
    assert module.render(readme) == readme, "README's generated tables are stale: run `make readme`"
    assert module.render(guide, module.GUIDE_SECTIONS) == guide, "docs/guide.md's tables are stale: `make readme`"


def test_every_method_module_is_exported_by_name():
    """methods/__init__.py imports each method class by name (no discovery): a new module must be listed."""
    import pkgutil

    import speedkit.methods as package
    from speedkit.methods import METHODS

    modules = {info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_")}
    listed = {cls.__module__.rpartition(".")[2] for cls in METHODS}
    assert modules == listed, f"method modules not in METHODS: {sorted(modules - listed)}"
    assert all(getattr(package, cls.__name__) is cls and cls.__name__ in package.__all__ for cls in METHODS)


def spells(class_name: str, method_name: str) -> bool:
    """The class name is the method name in CamelCase: the same letters in order once the underscores go, each
    word starting with a capital; inner capitals and acronyms stay as written (BlurPool, MixUp, ALiBi, FP8, QKNorm)."""
    letters = method_name.replace("_", "")
    starts, at = [], 0
    for word in method_name.split("_"):
        starts.append(at)
        at += len(word)
    return class_name.lower() == letters and all(class_name[i].isupper() for i in starts if letters[i].isalpha())


def test_every_method_class_spells_its_method_name():
    """``low_precision_layernorm`` is LowPrecisionLayerNorm, ``relu_squared`` ReLUSquared: what a person reads in a
    recipe is what they import. A method's own nn.Module takes another name (ReLUSquaredModule)."""
    from speedkit.methods import METHODS

    wrong = [f"{cls.CARD.name}: {cls.__name__}" for cls in METHODS if not spells(cls.__name__, cls.CARD.name)]
    assert not wrong, f"method classes not named after their method: {wrong}"
    assert spells("QKNorm", "qk_norm") and spells("ALiBi", "alibi") and spells("FP8", "fp8")
    assert not spells("QKNormalization", "qk_norm") and not spells("LowPrecisionLayerNormMethod",
                                                                     "low_precision_layernorm")
    assert not spells("Seqlengthwarmup", "seq_length_warmup")


@pytest.mark.parametrize("old, new", [("LowPrecisionGroupNormMethod", "LowPrecisionGroupNorm"),
                                      ("LowPrecisionLayerNormMethod", "LowPrecisionLayerNorm"),
                                      ("QKNormalization", "QKNorm"), ("ReLUSquaredActivation", "ReLUSquared")])
def test_the_old_class_names_still_import_for_a_release_with_a_deprecation_warning(old, new):
    import speedkit.methods as package

    with pytest.warns(DeprecationWarning, match=f"speedkit.methods.{old} is renamed {new} "):
        assert getattr(package, old) is getattr(package, new)
    with pytest.warns(DeprecationWarning, match=new):
        exec(f"from speedkit.methods import {old}", {})
    assert old not in package.__all__  # `import *` neither warns nor brings the old names
    with pytest.raises(AttributeError, match="no attribute 'QKNormalisation'"):
        package.QKNormalisation


def test_what_a_method_varies_over_a_run_comes_from_its_card():
    """DDP's find_unused_parameters and FSDP's refusal read ``Method.varies_parameters`` (from the card)."""
    from speedkit.methods import EMA, LayerFreezing, StochasticDepth

    assert LayerFreezing().varies_parameters and StochasticDepth(mode="block").varies_parameters
    assert not StochasticDepth(mode="sample").varies_parameters and not EMA().varies_parameters
    varying = sorted(name for name, cls in REGISTRY.items() if cls.CARD.varies_parameters)
    assert varying == ["layer_freezing", "stochastic_depth"]
