"""A user's own method, registered through ``speedkit.methods.register_method``, is named like a built-in one."""
from __future__ import annotations

import pytest
from method_harness import run_steps, tiny_vision

from speedkit import Event, Method, MethodCard
from speedkit.core.method import HParam
from speedkit.experiments.tune.space import candidate_methods
from speedkit.methods import REGISTRY, build_methods, get_method, register_method, unregister_method


class HalveInputs(Method):
    """Scales training images by ``factor`` (a visible change the tests can read back from the batch)."""

    CARD = MethodCard(name="halve_inputs", summary="Scale training images.", domain="vision",
                      events=(Event.AFTER_DATALOADER,), reads=("batch",), writes=("batch",),
                      hparams=(HParam("factor", float, 0.5, low=0.0, high=1.0),))

    def apply(self, event, state, logger):
        images, *rest = state.batch
        state.batch = (images * self.params["factor"], *rest)


def test_a_registered_method_is_built_by_name_and_runs_at_its_event(tmp_path):
    assert register_method(HalveInputs) is HalveInputs
    [method] = build_methods({"halve_inputs": {"factor": 0.25}})
    assert isinstance(method, HalveInputs) and method.params == {"factor": 0.25}
    trainer = run_steps(tiny_vision(), [method], steps=3, tmp_path=tmp_path)
    assert trainer.engine.events_of("halve_inputs") == {Event.AFTER_DATALOADER: 3}
    with pytest.raises(ValueError, match="halve_inputs.factor"):
        get_method("halve_inputs", factor=2.0)  # its card's range is checked like a built-in's
    methods, _ = candidate_methods("vision", None, "cpu")
    assert "halve_inputs" in methods  # speedkit tune may try it
    unregister_method("halve_inputs")
    assert "halve_inputs" not in REGISTRY


def test_registering_the_same_class_twice_is_harmless_and_a_different_one_needs_replace():
    register_method(HalveInputs)
    register_method(HalveInputs)

    class Other(HalveInputs):
        CARD = HalveInputs.CARD

    with pytest.raises(ValueError, match="registered already; pass replace=True"):
        register_method(Other)
    register_method(Other, replace=True)
    assert REGISTRY["halve_inputs"] is Other


@pytest.mark.parametrize("bad, error, message", [
    (object, TypeError, "takes an Method subclass"),
    (HalveInputs(), TypeError, "takes an Method subclass"),
    (type("NoCard", (Method,), {"apply": lambda *a: None}), TypeError, "has no CARD of its own"),
])
def test_what_is_not_a_method_is_refused_with_the_fix(bad, error, message):
    with pytest.raises(error, match=message):
        register_method(bad)


def test_built_in_names_and_bad_names_are_refused():
    class FakeEma(HalveInputs):
        CARD = MethodCard(name="ema", summary="not the real one", domain="vision", events=(Event.AFTER_DATALOADER,))

    class Shouting(HalveInputs):
        CARD = MethodCard(name="TrimBorder", summary="x", domain="vision", events=(Event.AFTER_DATALOADER,))

    with pytest.raises(ValueError, match="'ema' is built in; give your method's card another name"):
        register_method(FakeEma, replace=True)
    with pytest.raises(ValueError, match="must be snake_case"):
        register_method(Shouting)
    with pytest.raises(ValueError, match="built-in method and cannot be unregistered"):
        unregister_method("ema")
    assert REGISTRY["ema"].CARD.summary != "not the real one"
