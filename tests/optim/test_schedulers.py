"""Tests for speedkit.optim.schedulers: values, warmup, stretching, apply_schedule, registry."""
import json
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from speedkit.core.time import Time, TimeUnit
from speedkit.optim import (
    SCHEDULES,
    Constant,
    Cosine,
    Linear,
    LinearToZero,
    MultiStep,
    OneCycle,
    Schedule,
    Step,
    WarmupStableDecay,
    apply_schedule,
    dur_to_fraction,
    get_schedule,
)

FAST = settings(max_examples=60, deadline=None)
approx = pytest.approx


def batches_to_fraction(total_batches):
    """What the Trainer would pass: converts batch (and dur) times given the run's total length."""
    def to_fraction(t: Time) -> float:
        if t.unit is TimeUnit.DURATION:
            return float(t.value)
        assert t.unit is TimeUnit.BATCH
        return t.value / total_batches
    return to_fraction


# -- values at chosen fractions ---------------------------------------------------------------
def test_constant():
    assert [Constant()(t) for t in (0, 0.3, 1)] == [1.0, 1.0, 1.0]


def test_linear():
    s = Linear(start=1.0, end=0.2)
    assert s(0) == 1.0 and s(1) == 0.2 and s(0.5) == approx(0.6)
    up = Linear(start=0.1, end=1.0)
    assert up(0) == 0.1 and up(1) == 1.0


@pytest.mark.parametrize("final", [0.0, 0.1, 0.5])
def test_cosine(final):
    s = Cosine(final=final)
    assert s(0) == 1.0
    assert s(0.5) == approx((1 + final) / 2)
    assert s(1) == final
    assert s(0.25) == approx(final + (1 - final) * (1 + math.cos(math.pi / 4)) / 2)


def test_linear_to_zero():
    s = LinearToZero()
    assert s(0) == 1.0 and s(0.25) == 0.75 and s(1.0) == 0.0
    assert LinearToZero(warmup="0.1dur")(1.0) == 0.0


@pytest.mark.parametrize("anneal", ["cosine", "linear"])
@pytest.mark.parametrize("peak_at", [0.1, 0.25, 0.6])
def test_one_cycle(anneal, peak_at):
    s = OneCycle(peak_at=peak_at, start=0.04, final=1e-4, anneal=anneal)
    assert s(0) == approx(0.04)
    assert s(peak_at) == 1.0
    assert s(1) == approx(1e-4)
    assert s(peak_at / 2) == approx((0.04 + 1) / 2)  # midway up (both anneals are symmetric about the middle)
    assert s(peak_at + (1 - peak_at) / 2) == approx((1e-4 + 1) / 2)
    xs = [i / 100 for i in range(101)]
    ys = [s(x) for x in xs]
    k = xs.index(min(xs, key=lambda x: abs(x - peak_at)))
    assert all(a <= b + 1e-12 for a, b in zip(ys[:k], ys[1:k + 1]))  # rises to the peak
    assert all(a >= b - 1e-12 for a, b in zip(ys[k:], ys[k + 1:]))  # then falls
    assert OneCycle().warmup is None


def test_one_cycle_linear_is_linear():
    s = OneCycle(peak_at=0.5, start=0.0, final=0.0, anneal="linear")
    assert s(0.25) == approx(0.5) and s(0.75) == approx(0.5)


def test_step_drops_by_gamma_at_each_multiple():
    s = Step(every="0.25dur", gamma=0.5)
    assert s(0) == 1.0 and s(0.2499) == 1.0
    assert s(0.25) == 0.5 and s(0.49) == 0.5
    assert s(0.5) == 0.25 and s(0.75) == 0.125 and s(1.0) == 0.0625
    d = Step()  # every 0.33dur, gamma 0.1
    assert d(0.32) == 1.0 and d(0.33) == approx(0.1) and d(0.66) == approx(0.01)


def test_multistep_drops_at_milestones():
    s = MultiStep(milestones=["0.3dur", "0.6dur", "0.9dur"], gamma=0.5)
    assert s(0.29) == 1.0 and s(0.3) == 0.5 and s(0.59) == 0.5
    assert s(0.6) == 0.25 and s(0.9) == 0.125 and s(1.0) == 0.125
    d = MultiStep()
    assert d(0.49) == 1.0 and d(0.5) == approx(0.1) and d(0.75) == approx(0.01)
    assert MultiStep(milestones=["0.6dur", "0.3dur"], gamma=0.5)(0.4) == 0.5  # order doesn't matter


def test_step_milestones_in_batches_need_a_converter():
    s = MultiStep(milestones=["100ba", "200ba"], gamma=0.1)
    with pytest.raises(ValueError, match="Trainer"):
        s(0.5)
    conv = batches_to_fraction(300)
    assert s(99 / 300, conv) == 1.0
    assert s(100 / 300, conv) == approx(0.1)
    assert s(200 / 300, conv) == approx(0.01)
    st_ = Step(every="100ba", gamma=0.5)
    assert [st_(b / 300, conv) for b in (0, 99, 100, 199, 200, 300)] == approx([1, 1, 0.5, 0.5, 0.25, 0.125])


@pytest.mark.parametrize("decay_shape", ["linear", "cosine", "sqrt"])
def test_wsd(decay_shape):
    s = WarmupStableDecay(decay="0.2dur", final=0.1, decay_shape=decay_shape)
    assert all(s(t) == 1.0 for t in (0.0, 0.3, 0.5, 0.79, 0.8))  # flat before the decay
    assert s(1.0) == approx(0.1)
    mid = {"linear": 0.5, "cosine": 0.5, "sqrt": 1 - math.sqrt(0.5)}[decay_shape]
    assert s(0.9) == approx(0.1 + 0.9 * mid)
    assert s(0.85) > s(0.9) > s(0.95) > s(1.0)


def test_wsd_with_warmup_is_flat_between_warmup_and_decay():
    s = WarmupStableDecay(decay="0.2dur", warmup="0.1dur")
    assert s(0) == 0.0 and s(0.05) == approx(0.5) and s(0.1) == 1.0
    assert all(s(t) == 1.0 for t in (0.1, 0.4, 0.8))  # decay window is the last 20% of the whole run
    assert s(0.9) == approx(0.5) and s(1.0) == 0.0


def test_wsd_decay_in_batches():
    s = WarmupStableDecay(decay="200ba", warmup="100ba")
    conv = batches_to_fraction(1000)
    assert s(50 / 1000, conv) == approx(0.5)
    assert s(800 / 1000, conv) == 1.0
    assert s(900 / 1000, conv) == approx(0.5)
    assert s(1.0, conv) == 0.0


# -- warmup ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("warmup_start", [0.0, 0.25])
def test_warmup_ramps_linearly_to_the_schedule_start(name, warmup_start):
    w = 0.2
    s = get_schedule({"name": name, "warmup": f"{w}dur", "warmup_start": warmup_start})
    top = s.shape(0.0)
    assert s(0.0) == approx(warmup_start * top)
    for frac in (0.25, 0.5, 0.75):
        assert s(frac * w) == approx(warmup_start * top + (top - warmup_start * top) * frac)
    assert s(w) == approx(top)
    # after warmup, the shape is squeezed onto [w, 1]
    if name not in ("step", "multistep", "wsd"):  # those place Time parameters on the whole run
        for u in (0.1, 0.5, 0.9, 1.0):
            assert s(w + u * (1 - w)) == approx(s.shape(u))


def test_warmup_in_batches():
    s = Cosine(warmup="100ba")
    with pytest.raises(ValueError) as info:
        s(0.5)
    assert "'ba'" in str(info.value) and "Trainer" in str(info.value)
    conv = batches_to_fraction(1000)
    assert s(0.0, conv) == 0.0 and s(0.05, conv) == approx(0.5) and s(0.1, conv) == 1.0
    assert s(0.55, conv) == approx(0.5)  # cosine midpoint of the post-warmup part


def test_warmup_longer_than_the_run_only_ramps():
    s = Cosine(warmup="2000ba")
    conv = batches_to_fraction(1000)
    with pytest.warns(UserWarning, match="whole run"):
        assert s(0.5, conv) == approx(0.5)  # the warmup is clamped to the run
    assert s(1.0, conv) == 1.0


def test_t_is_clamped_and_checked():
    s = LinearToZero()
    assert s(-0.5) == 1.0 and s(1.5) == 0.0
    with pytest.raises(ValueError, match="NaN"):
        s(float("nan"))
    with pytest.raises(TypeError):
        s("0.5")


def test_default_converter():
    assert dur_to_fraction(Time.fraction(0.3)) == 0.3
    with pytest.raises(ValueError, match="ep"):
        dur_to_fraction(Time.epochs(1))


# -- stretching ----------------------------------------------------------------------------------
STRETCHABLE = [
    Constant(warmup="50ba"),
    Linear(start=0.9, end=0.1, warmup="20ba", warmup_start=0.1),
    Cosine(final=0.05, warmup="60ba"),
    OneCycle(),
    Step(every="120ba", gamma=0.5, warmup="30ba"),
    MultiStep(milestones=["150ba", "250ba"], gamma=0.3, warmup="10ba"),
    LinearToZero(warmup="45ba"),
    WarmupStableDecay(decay="100ba", final=0.01, decay_shape="sqrt", warmup="25ba"),
]


@pytest.mark.parametrize("schedule", STRETCHABLE, ids=lambda s: s.name)
@pytest.mark.parametrize("ratio", [2, 3])
def test_stretching_the_run_keeps_the_shape(schedule, ratio):
    total = 400
    base = batches_to_fraction(total)
    stretched = batches_to_fraction(total * ratio)
    # Time parameters in batches scale with the run (what a schedule scale ratio does to a recipe)
    scaled = get_schedule({k: _scale(v, ratio) for k, v in schedule.to_dict().items()})
    for b in range(0, total + 1, 7):
        assert scaled((b * ratio) / (total * ratio), stretched) == approx(schedule(b / total, base))


def _scale(value, ratio):
    if isinstance(value, str) and value.endswith("ba"):
        return str(Time.from_string(value) * ratio)
    if isinstance(value, list):
        return [_scale(v, ratio) for v in value]
    return value


@pytest.mark.parametrize("schedule", STRETCHABLE, ids=lambda s: s.name)
def test_dur_schedules_depend_only_on_the_fraction(schedule):
    d = {k: _to_dur(v, 400) for k, v in schedule.to_dict().items()}
    s = get_schedule(d)
    for total in (100, 400, 1234):
        for i in range(11):
            assert s(i / 10, batches_to_fraction(total)) == approx(schedule(i / 10, batches_to_fraction(400)))


def _to_dur(value, total):
    if isinstance(value, str) and value.endswith("ba"):
        return f"{Time.from_string(value).value / total}dur"
    if isinstance(value, list):
        return [_to_dur(v, total) for v in value]
    return value


# -- apply_schedule ------------------------------------------------------------------------------
def _optimizer():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    return torch.optim.SGD([{"params": a.parameters(), "lr": 0.1}, {"params": b.parameters(), "lr": 0.02}],
                           momentum=0.9)


def test_apply_schedule_sets_each_group_lr():
    opt = _optimizer()
    s = Cosine(warmup="0.1dur")
    m = apply_schedule(opt, s, 0.05)
    assert m == approx(0.5)
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.02]
    assert [g["lr"] for g in opt.param_groups] == approx([0.05, 0.01])
    m = apply_schedule(opt, s, 0.55)
    assert [g["lr"] for g in opt.param_groups] == approx([0.1 * m, 0.02 * m])
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.02]  # not overwritten by the scheduled lr
    assert apply_schedule(opt, s, 1.0) == 0.0 and [g["lr"] for g in opt.param_groups] == [0.0, 0.0]
    # training still works with the scheduled lr
    apply_schedule(opt, s, 0.3)
    loss = sum(p.sum() for g in opt.param_groups for p in g["params"])
    loss.backward()
    opt.step()


def test_apply_schedule_accepts_specs_and_a_converter():
    opt = _optimizer()
    m = apply_schedule(opt, {"name": "multistep", "milestones": ["10ba"], "gamma": 0.5}, 10 / 20,
                       batches_to_fraction(20))
    assert m == 0.5 and [g["lr"] for g in opt.param_groups] == approx([0.05, 0.01])
    assert apply_schedule(opt, "constant", 0.9) == 1.0 and opt.param_groups[0]["lr"] == 0.1


def test_apply_schedule_respects_existing_initial_lr():
    opt = _optimizer()
    opt.param_groups[0]["initial_lr"] = 1.0
    apply_schedule(opt, Linear(), 0.5)
    assert [g["lr"] for g in opt.param_groups] == approx([0.5, 0.01])


def test_apply_schedule_tensor_lr():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([p], lr=torch.tensor(0.01))
    lr = opt.param_groups[0]["lr"]
    apply_schedule(opt, Linear(), 0.5)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == approx(0.005)


# -- registry, round trip, errors ----------------------------------------------------------------
ROUND_TRIP = STRETCHABLE + [cls() for cls in SCHEDULES.values()] + [
    Cosine(final=0.1, warmup=Time.fraction(0.05), warmup_start=0.01),
    OneCycle(peak_at=0.3, anneal="linear"),
    WarmupStableDecay(decay="0.1dur", decay_shape="cosine", warmup="0.05dur"),
]


@pytest.mark.parametrize("schedule", ROUND_TRIP, ids=repr)
def test_to_dict_round_trip(schedule):
    d = schedule.to_dict()
    assert d["name"] in SCHEDULES and SCHEDULES[d["name"]] is type(schedule)
    again = get_schedule(json.loads(json.dumps(d)))  # survives JSON (a RunRecord / recipe)
    assert again == schedule and again.to_dict() == d
    conv = batches_to_fraction(400)
    assert [again(t / 10, conv) for t in range(11)] == [schedule(t / 10, conv) for t in range(11)]


def test_get_schedule_forms():
    c = Cosine()
    assert get_schedule(c) is c
    assert isinstance(get_schedule("cosine"), Cosine)
    assert isinstance(get_schedule("one-cycle"), OneCycle)
    assert isinstance(get_schedule("WSD"), WarmupStableDecay)
    s = get_schedule({"name": "cosine", "warmup": "0.1dur"})
    assert s.warmup == Time.fraction(0.1) and s(0.1) == 1.0
    for name, cls in SCHEDULES.items():
        assert cls.name == name and isinstance(get_schedule(name), Schedule)


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError) as info:
        get_schedule("cosine_annealing_with_restarts")
    msg = str(info.value)
    assert "cosine_annealing_with_restarts" in msg and all(name in msg for name in SCHEDULES)
    with pytest.raises(ValueError, match="name"):
        get_schedule({"warmup": "0.1dur"})
    with pytest.raises(TypeError):
        get_schedule(3)
    with pytest.raises(TypeError):
        get_schedule(None)


@pytest.mark.parametrize(
    "spec, error, param",
    [
        ({"name": "step", "gamma": -0.1}, ValueError, "gamma"),
        ({"name": "multistep", "gamma": 2}, ValueError, "gamma"),
        ({"name": "step", "gamma": "0.1"}, TypeError, "gamma"),
        ({"name": "step", "every": "0dur"}, ValueError, "every"),
        ({"name": "step", "every": "parsecs"}, ValueError, "every"),
        ({"name": "multistep", "milestones": "0.5dur"}, TypeError, "milestones"),
        ({"name": "multistep", "milestones": ["0.5dur", "1.5ba"]}, ValueError, "milestones[1]"),
        ({"name": "one_cycle", "peak_at": 0.0}, ValueError, "peak_at"),
        ({"name": "one_cycle", "peak_at": 1.0}, ValueError, "peak_at"),
        ({"name": "one_cycle", "peak_at": 1.5}, ValueError, "peak_at"),
        ({"name": "one_cycle", "anneal": "exp"}, ValueError, "anneal"),
        ({"name": "one_cycle", "start": -1}, ValueError, "start"),
        ({"name": "cosine", "final": 1.5}, ValueError, "final"),
        ({"name": "cosine", "final": float("nan")}, ValueError, "final"),
        ({"name": "cosine", "final": True}, TypeError, "final"),
        ({"name": "wsd", "final": 2}, ValueError, "final"),
        ({"name": "wsd", "decay": "1.5dur"}, ValueError, "decay"),
        ({"name": "wsd", "decay_shape": "exp"}, ValueError, "decay_shape"),
        ({"name": "linear", "end": 1.1}, ValueError, "end"),
        ({"name": "cosine", "warmup": "1dur"}, ValueError, "warmup"),
        ({"name": "cosine", "warmup": "-1ep"}, ValueError, "warmup"),
        ({"name": "cosine", "warmup": [1]}, TypeError, "warmup"),
        ({"name": "cosine", "warmup_start": 2}, ValueError, "warmup_start"),
        ({"name": "cosine", "fnial": 0.1}, TypeError, "fnial"),
    ],
)
def test_bad_parameters_name_the_parameter(spec, error, param):
    with pytest.raises(error) as info:
        get_schedule(spec)
    assert param in str(info.value)


# -- bounds (property) ---------------------------------------------------------------------------
unit_floats = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@FAST
@given(name=st.sampled_from(sorted(SCHEDULES)), t=unit_floats)
def test_defaults_stay_in_unit_interval(name, t):
    assert 0.0 <= get_schedule(name)(t) <= 1.0


@FAST
@given(name=st.sampled_from(sorted(SCHEDULES)), t=unit_floats, w=st.floats(0.0, 0.95),
       start=unit_floats, total=st.integers(1, 10**6))
def test_with_warmup_stays_in_unit_interval(name, t, w, start, total):
    s = get_schedule({"name": name, "warmup": Time.batches(int(w * total)), "warmup_start": start})
    assert 0.0 <= s(t, batches_to_fraction(total)) <= 1.0


@FAST
@given(t1=unit_floats, t2=unit_floats, name=st.sampled_from(["linear", "cosine", "linear_to_zero", "step",
                                                               "multistep", "wsd"]))
def test_decaying_schedules_never_increase(t1, t2, name):
    s = get_schedule(name)
    lo, hi = min(t1, t2), max(t1, t2)
    assert s(lo) >= s(hi)
