"""Bad input, fuzzed with hypothesis: Trainer arguments, method parameters, data against the model, recipe files.

The property everywhere: a configuration is either accepted (and then it works: it builds, and where it is
cheap, it trains) or refused with a ValueError/TypeError whose message names the argument. An independent
oracle in this file says which of the two each configuration must be, so a refusal of good input fails as
surely as acceptance of bad input. Nothing may hang: every configuration runs under an alarm.
The number of configurations tried is printed at the end of the pytest run (see conftest.py).
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import signal
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from method_harness import tiny_vision
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from speedkit import Time, Trainer
from speedkit.core import Method, TimeUnit
from speedkit.methods import REGISTRY, build_methods, get_method
from speedkit.optim.schedulers import SCHEDULES
from speedkit.tasks import recipe_parts
from speedkit.tasks import TASKS, Recipe, get_recipe

COUNTS: dict[str, list[int]] = {}  # test -> [configurations tried, accepted]; conftest.py prints the totals
SCALE = float(os.environ.get("SPEEDKIT_FUZZ_SCALE", "1"))  # e.g. 20 for a long hunt; 1 keeps the file under a minute
LIMIT_S = 20.0  # per configuration: far above the slowest (a short fit), far below "hung"
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                      HealthCheck.data_too_large])
RUN_DIR = Path("runs/tests/fuzz")  # replaced by a pytest temporary folder below
_run_ids = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def _fuzz_session(request, tmp_path_factory):
    global RUN_DIR
    RUN_DIR = tmp_path_factory.mktemp("fuzz")  # hypothesis examples share one folder: they cannot take tmp_path
    request.config.speedkit_fuzz_counts = COUNTS  # read by pytest_terminal_summary in conftest.py
    yield


class _Hung(BaseException):
    """Raised by the alarm; a BaseException so that no `except Exception` in the library swallows it."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str):
    def on_alarm(signum, frame):
        raise _Hung()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Hung:
        raise AssertionError(f"hung for more than {seconds}s: {what}") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


def _count(test: str, accepted: bool = False) -> None:
    """Called once as a configuration is tried, and once more with ``accepted=True`` if it was accepted."""
    entry = COUNTS.setdefault(test, [0, 0])
    entry[1 if accepted else 0] += 1


def judge(test: str, what: str, build, ok: bool, names) -> object:
    """Run ``build()``: if ``ok`` it must succeed, otherwise raise ValueError/TypeError naming one of ``names``."""
    _count(test)
    names = (names,) if isinstance(names, str) else tuple(names)
    with time_limit(LIMIT_S, what):
        try:
            result = build()
        except (ValueError, TypeError) as e:
            assert not ok, f"{what} is good input but was refused: {type(e).__name__}: {e}"
            assert any(n in str(e) for n in names), f"{what}: the message does not name {names}: {e}"
            return e
    assert ok, f"{what} is bad input but was accepted"
    _count(test, accepted=True)
    return result


# -- shared pieces --------------------------------------------------------------------------------
def toy_batches(n_batches: int = 2, batch: int = 8, features: int = 4, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, features, generator=g), torch.randint(0, classes, (batch,), generator=g))
            for _ in range(n_batches)]


def toy_net(features: int = 4, classes: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(features, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes))


def trainer(model=None, train=None, **kwargs) -> Trainer:
    options = dict(device="cpu", run_dir=RUN_DIR, run_name=f"r{next(_run_ids)}", save_checkpoints=False)
    options.update(kwargs)
    return Trainer(model if model is not None else toy_net(), toy_batches() if train is None else train, **options)


def fit(model=None, train=None, **kwargs):
    return trainer(model, train, **{"max_duration": "1ba", **kwargs}).fit()


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.binary(max_size=3),
    st.lists(st.integers(0, 3), max_size=3), st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
    st.just(object()), st.just(1 + 2j), st.integers(0, 3).map(torch.tensor))
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=10)

# -- durations: an oracle for the documented grammar -------------------------------------------------
_GRAMMAR = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKMBG]?)\s*([a-z]+)\s*")
_MULTIPLIER = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}
_CLOCK = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def expected_duration(text: str, fraction_ok: bool, clock_ok: bool = True) -> tuple[str, float] | None:
    """(unit, value) for a duration the docs promise to accept; None for one that must be refused."""
    match = _GRAMMAR.fullmatch(text)
    if not match:
        return None
    number, multiplier, unit = match.groups()
    value = float(number) * _MULTIPLIER[multiplier]
    if multiplier and math.isfinite(value) and abs(value - round(value)) < 1e-6:
        value = float(round(value))
    if unit in _CLOCK:
        unit, value = "s", value * _CLOCK[unit]
    if unit not in ("ep", "ba", "sp", "tok", "dur", "s") or not math.isfinite(value) or value <= 0:
        return None
    if (unit in ("ba", "sp", "tok") and not value.is_integer()) or (unit == "dur" and (value > 1 or not fraction_ok)):
        return None
    if unit == "s" and not clock_ok:
        return None
    return unit, value


NUMBERS = st.one_of(
    st.integers(0, 5000).map(str), st.floats(0, 1e4).map(lambda f: f"{f:g}"),
    st.sampled_from(["0", "0.0", ".5", "1.", "1e3", "2E2", "1e-3", "1e400", "-1", "-0.5", "+2", "1_000", "nan",
                     "inf", "0x10", "½", "٣", "1,5", "0.25", "3"]))
UNITS = st.sampled_from(["ep", "ba", "sp", "tok", "dur", "s", "sec", "m", "min", "h", "", "epochs", "EP", "Ba", "b",
                         "batches", "parsecs", "d", "ms", "µs", "ep2", "tokens"])
MULTIPLIERS = st.sampled_from(["", "", "", "k", "K", "M", "B", "G", "m", "x"])
GAPS = st.sampled_from(["", "", "", " ", "\t", "\n"])
COMPOSED = st.builds(lambda a, n, b, m, c, u, d: f"{a}{n}{b}{m}{c}{u}{d}", GAPS, NUMBERS, GAPS, MULTIPLIERS, GAPS,
                     UNITS, GAPS)
DURATION_STRINGS = st.one_of(COMPOSED, COMPOSED, TEXT)
DURATION_ARGS = st.sampled_from(["max_duration", "eval_interval", "save_interval"])


@settings(FUZZ, max_examples=examples(400))
@given(arg=DURATION_ARGS, text=DURATION_STRINGS)
def test_duration_strings_are_parsed_or_refused_by_name(arg, text):
    expected = expected_duration(text, fraction_ok=arg != "max_duration")
    built = judge("durations: strings", f"{arg}={text!r}", lambda: trainer(**{arg: text}), expected is not None, arg)
    if expected is not None and arg == "max_duration":
        unit, value = expected
        got = built.state.original_max_duration
        assert got.unit.value == unit and got.value == pytest.approx(value), (text, got)


@settings(FUZZ, max_examples=examples(150))
@given(arg=DURATION_ARGS, value=st.one_of(JUNK, st.integers(-5, 100), st.floats(0.1, 100)))
def test_durations_of_the_wrong_type_are_refused(arg, value):
    ok = value is None and arg != "eval_interval"  # None: the default / no periodic saving
    judge("durations: wrong types", f"{arg}={value!r}", lambda: trainer(**{arg: value}), ok, arg)


TIMES = st.one_of(
    st.builds(Time, st.floats(0, 50), st.sampled_from([TimeUnit.EPOCH, TimeUnit.SECOND])),
    st.builds(Time, st.integers(0, 10**6), st.sampled_from([TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN])),
    st.builds(Time, st.floats(0, 1), st.just(TimeUnit.DURATION)))


@settings(FUZZ, max_examples=examples(60))
@given(arg=DURATION_ARGS, time=TIMES)
def test_time_objects_are_checked_like_strings(arg, time):
    ok = time.value > 0 and (time.unit is not TimeUnit.DURATION or arg != "max_duration")
    judge("durations: Time objects", f"{arg}={time!r}", lambda: trainer(**{arg: time}), ok, arg)


# -- the Trainer's other arguments -----------------------------------------------------------------
def whole_ok(arg: str, value) -> bool:
    if arg == "microbatch_size" and (value is None or (isinstance(value, str) and value == "auto")):
        return True
    if type(value) is not int:
        return False
    return 0 <= value < 2**32 if arg == "seed" else value >= 1


@settings(FUZZ, max_examples=examples(200))
@given(arg=st.sampled_from(["grad_accum", "microbatch_size", "log_interval", "keep_checkpoints", "seed"]),
       value=st.one_of(JUNK, st.integers(-3, 40), st.just("auto"), st.sampled_from([2**32 - 1, 2**32, 2**31])))
def test_whole_number_arguments(arg, value):
    """Accepted values also train (two small batches), so none of them loops forever or breaks a step."""
    ok = whole_ok(arg, value)
    record = judge("trainer: whole numbers", f"{arg}={value!r}",
                   lambda: fit(**{arg: value, "max_duration": "2ba"}), ok, arg)
    if ok:
        assert record.status == "completed" and len(record.steps) >= 1


@settings(FUZZ, max_examples=examples(120))
@given(scale=st.one_of(JUNK, st.floats(1e-6, 1e6), st.sampled_from([1e-9, 0.0624, 0.0625, 0.07, 1, 3, 1e308, 1.7e308])))
def test_schedule_scale(scale):
    ok = (type(scale) in (int, float) and math.isfinite(scale) and scale > 0 and math.isfinite(8 * scale)
          and round(8 * scale) >= 1)
    built = judge("trainer: schedule_scale", f"schedule_scale={scale!r}",
                  lambda: trainer(max_duration="8ba", schedule_scale=scale), ok, "schedule_scale")
    if ok:
        assert built.state.max_duration.unit is TimeUnit.BATCH
        assert built.state.max_duration.value == pytest.approx(round(8 * scale), rel=1e-9)


def _cuda_ok(text: str) -> bool:
    match = re.fullmatch(r"cuda(?::(0|[1-9][0-9]*))?", text)
    return bool(match) and torch.cuda.is_available() and int(match.group(1) or 0) < torch.cuda.device_count()


CHOICES = {
    "precision": lambda v: v is None or (type(v) is str and v in ("fp32", "bf16", "auto")),
    "device": lambda v: (isinstance(v, torch.device) and v.type == "cpu") or (
        type(v) is str and (v in ("auto", "cpu") or _cuda_ok(v))),
    "nan_policy": lambda v: v is None or (type(v) is str and v in ("stop", "skip")),
}
CANDIDATES = ["fp32", "bf16", "fp16", "auto", "FP32", "bf16 ", "float32", "amp", "", "cpu", "cuda", "cuda:0",
              "cuda:1", "cuda:x", "cuda:-1", "cpu:0", "cpu:-1", "auto:3", "mps", "tpu", "meta", "stop", "skip",
              "Stop", "ignore", "raise"]


@settings(FUZZ, max_examples=examples(200))
@given(arg=st.sampled_from(sorted(CHOICES)),
       value=st.one_of(st.sampled_from(CANDIDATES), st.sampled_from(CANDIDATES), JUNK, TEXT,
                       st.sampled_from(["cpu", "meta"]).map(torch.device)))
def test_precision_device_and_nan_policy(arg, value):
    judge("trainer: precision/device/nan_policy", f"{arg}={value!r}", lambda: trainer(**{arg: value}),
          CHOICES[arg](value), arg)


METRIC_NAMES = st.one_of(st.sampled_from(["eval/accuracy", "eval/loss", "accuracy", "eval/acc", "eval/", "/",
                                          "", "train/loss", "eval/top5"]), TEXT)
TARGETS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 2), st.booleans(),
                    st.text(max_size=3), st.none(), st.floats(0, 1))
STOP_AT = st.one_of(
    st.tuples(st.sampled_from(["eval/accuracy", "eval/loss", "eval/bpb"]), st.floats(0, 2)),
    st.tuples(METRIC_NAMES, TARGETS), st.lists(st.one_of(METRIC_NAMES, TARGETS), max_size=3),
    st.fixed_dictionaries({"metric": METRIC_NAMES, "value": TARGETS}),
    st.dictionaries(st.sampled_from(["metric", "value", "target"]), st.one_of(METRIC_NAMES, TARGETS), max_size=3),
    JUNK)


def stop_at_ok(stop_at, with_eval: bool) -> bool:
    if isinstance(stop_at, dict):
        if set(stop_at) != {"metric", "value"}:
            return False
        metric, value = stop_at["metric"], stop_at["value"]
    elif isinstance(stop_at, (tuple, list)) and len(stop_at) == 2:
        metric, value = stop_at
    else:
        return stop_at is None
    return (with_eval and type(metric) is str and "/" in metric and type(value) in (int, float)
            and math.isfinite(value))


@settings(FUZZ, max_examples=examples(120))
@given(stop_at=STOP_AT, with_eval=st.booleans())
def test_stop_at_shapes(stop_at, with_eval):
    """Accepted pairs then fit: a metric no evaluator logs is refused at fit start, not left to never fire."""
    evaluation = {"eval_dataloader": toy_batches(1)} if with_eval else {}
    ok = stop_at_ok(stop_at, with_eval)
    built = judge("trainer: stop_at", f"stop_at={stop_at!r}, eval={with_eval}",
                  lambda: trainer(stop_at=stop_at, **evaluation), ok, "stop_at")
    if ok and stop_at is not None:
        metric = stop_at["metric"] if isinstance(stop_at, dict) else stop_at[0]
        known = metric in ("eval/accuracy", "eval/loss")
        record = judge("trainer: stop_at", f"fit with stop_at={stop_at!r}", built.fit, known, "stop_at")
        if known:
            assert record.status in ("completed", "target_reached")


RECIPE_NAMES = st.one_of(
    st.sampled_from(["baseline", "mild", "medium", "hot", "fashion-mnist:mild", "fashion-mnist:baseline",
                     "pydocs:mild", "pydocs:baseline", "fashion-mnist:nope", "nope", "fashion-mnist:", ":", "",
                     "Mild", " mild", "x.yaml", "fashion-mnist:missing.yaml", "fashion-mnist: mild", "cifar:mild"]),
    TEXT, JUNK, st.sampled_from(sorted(TASKS["fashion-mnist"].recipes)).map(lambda n: get_recipe("fashion-mnist", n)))


def recipe_ok(spec) -> bool:
    if isinstance(spec, Recipe):
        return True
    if type(spec) is not str:
        return False
    if ":" in spec:
        task, name = spec.split(":", 1)
        return task == "fashion-mnist" and name in TASKS[task].recipes  # the model is a vision model
    return spec in TASKS["fashion-mnist"].recipes


@settings(FUZZ, max_examples=examples(80))
@given(spec=RECIPE_NAMES)
def test_recipe_names(spec):
    model, train, _ = tiny_vision()
    judge("trainer: recipe", f"recipe={spec!r}",
          lambda: trainer(model, train, **recipe_parts(spec, model, max_duration="1ba", precision="fp32")),
          recipe_ok(spec), "recipe")


# -- every method x each of its card's parameters --------------------------------------------------
def _bounds(hp):
    low = -1e6 if hp.low is None else hp.low
    high = 1e6 if hp.high is None else hp.high
    return low, high


def good_values(hp):
    """Values the card promises to accept."""
    if hp.choices is not None:
        return st.sampled_from(hp.choices)
    if hp.type is bool:
        return st.booleans()
    low, high = _bounds(hp)
    if hp.type is int:
        return st.one_of(st.integers(math.ceil(low), math.floor(high)), st.sampled_from([int(low), int(high)]))
    if hp.type is float:
        return st.one_of(st.floats(low, high), st.sampled_from([low, high]))
    return st.sampled_from(["10ba", "1ep", "0.5ep", "0.1dur", "100sp", "2ktok"])  # ema.half_life


def any_values(hp):
    """Good values, near misses and junk."""
    if hp.choices is not None:
        near = [str(c).upper() for c in hp.choices] + [1, 0, 1.0, 0.0, "None", "true", f"{hp.choices[0]} "]
        return st.one_of(good_values(hp), st.sampled_from(near), JUNK)
    if hp.type is bool:
        return st.one_of(good_values(hp), st.sampled_from([0, 1, 1.0, "True", "yes", None]), JUNK)
    if hp.type in (int, float):
        low, high = _bounds(hp)
        span = max(high - low, 1)
        edges = [low - 1, high + 1, low - 1e-6, high + 1e-6, low - span, high * 10 + 1, float(low), 2**70]
        return st.one_of(good_values(hp), st.floats(low - span, high + span), st.integers(int(low) - 5, int(high) + 5),
                         st.sampled_from(edges), st.floats(allow_nan=True, allow_infinity=True), JUNK)
    return st.one_of(good_values(hp), DURATION_STRINGS, JUNK)


def param_ok(hp, value) -> bool:
    if hp.choices is not None:
        return any(type(value) is type(c) and value == c for c in hp.choices)
    if hp.type is bool:
        return type(value) is bool
    if hp.type in (int, float):
        if type(value) not in (int, float) or not math.isfinite(value):
            return False
        if hp.type is int and not float(value).is_integer():
            return False
        low, high = _bounds(hp)
        return low <= value <= high
    return type(value) is str and expected_duration(value, fraction_ok=True, clock_ok=False) is not None


def _cross_rule(card, message: str) -> bool:
    """A refusal of individually good values must be a rule between parameters, naming two of them."""
    return sum(hp.name in message for hp in card.hparams) >= 2


@pytest.mark.parametrize("name", sorted(REGISTRY))
@settings(FUZZ, max_examples=examples(45))
@given(data=st.data())
def test_method_parameters(name, data):
    card = REGISTRY[name].CARD
    test = "methods: card parameters"
    mode = data.draw(st.sampled_from(["one"] * 6 + ["all", "all-good", "unknown"] if card.hparams else ["unknown"]))
    if mode == "unknown":
        bogus = data.draw(st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True).filter(
            lambda n: n not in {hp.name for hp in card.hparams}))
        judge(test, f"{name}({bogus}=1)", lambda: get_method(name, **{bogus: 1}), False, bogus)
        return
    if mode == "one":
        hp = data.draw(st.sampled_from(card.hparams))
        params = {hp.name: data.draw(any_values(hp))}
    else:
        pick = good_values if mode == "all-good" else any_values
        params = {hp.name: data.draw(pick(hp)) for hp in card.hparams}
    bad = [hp for hp in card.hparams if hp.name in params and not param_ok(hp, params[hp.name])]
    what = f"{name}({params!r})"
    _count(test)
    with time_limit(LIMIT_S, what):
        try:
            method = get_method(name, **params)
        except (ValueError, TypeError) as e:
            message = str(e)
            if bad:
                assert any(f"{name}.{hp.name}" in message for hp in bad), f"{what}: message names none of {bad}: {e}"
            else:
                assert isinstance(e, ValueError) and _cross_rule(card, message), f"{what} was refused: {e}"
            return
    assert not bad, f"{what} was accepted, but {[hp.name for hp in bad]} are bad"
    _count(test, accepted=True)
    assert isinstance(method, Method)
    for key, value in params.items():
        assert method.params[key] == value


def _misspell(name: str):
    return st.sampled_from([name[:-1], name + "s", name.upper(), name.replace("_", "-"), name[1:], f" {name}",
                            name.replace("_", ""), name + "_"])


@settings(FUZZ, max_examples=examples(150))
@given(name=st.one_of(st.sampled_from(sorted(REGISTRY)), st.sampled_from(sorted(REGISTRY)).flatmap(_misspell),
                      TEXT, JUNK))
def test_method_names(name):
    ok = type(name) is str and name in REGISTRY
    judge("methods: names", f"get_method({name!r})", lambda: get_method(name), ok,
          ("Known methods", "known methods"))


METHOD_SPECS = st.one_of(
    st.lists(st.sampled_from(["ema", "mixup", "cutout", "nope", " ema", ""]), max_size=3).map(",".join),
    st.lists(st.one_of(st.sampled_from(["ema", "label_smoothing", "bogus"]), st.integers(0, 2), st.none()), max_size=3),
    st.dictionaries(st.sampled_from(["ema", "label_smoothing", "bogus"]),
                    st.one_of(st.none(), st.just({}), st.just({"bogus": 1}), st.integers(0, 2), st.text(max_size=2)),
                    max_size=2),
    JUNK)


def spec_ok(spec) -> bool:
    if isinstance(spec, str):
        return all(s.strip() in REGISTRY for s in spec.split(",") if s.strip())
    if isinstance(spec, dict):
        return all(type(k) is str and k in REGISTRY and (v is None or v == {}) for k, v in spec.items())
    if isinstance(spec, (list, tuple)):
        return all(type(s) is str and s in REGISTRY for s in spec)
    return False


@settings(FUZZ, max_examples=examples(120))
@given(spec=METHOD_SPECS)
def test_method_specs(spec):
    ok = spec_ok(spec)
    built = judge("methods: specs", f"build_methods({spec!r})", lambda: build_methods(spec), ok,
                  ("method", "parameter", "bogus", "nope", "Known"))
    if ok:
        assert all(isinstance(a, Method) for a in built)


# -- data against the model ---------------------------------------------------------------------
class _NothingIterable(IterableDataset):
    def __iter__(self):
        return iter(())


def empty_loader(kind: str, features: int, batch: int):
    x, y = torch.randn(3, features), torch.randint(0, 3, (3,))
    return {
        "empty dataset": lambda: DataLoader(TensorDataset(torch.zeros(0, features), torch.zeros(0, dtype=torch.long)),
                                            batch_size=batch),
        "empty list": lambda: [],
        "drop_last": lambda: DataLoader(TensorDataset(x, y), batch_size=3 + batch, drop_last=True),
        "empty generator": lambda: (b for b in ()),
        "used-up generator": lambda: (b for b in [(x, y)]),
        "empty iterable dataset": lambda: DataLoader(_NothingIterable(), batch_size=batch),
    }[kind]()


def _has_length(loader) -> bool:
    try:
        len(loader)
        return True
    except TypeError:
        return False


@settings(FUZZ, max_examples=examples(60))
@given(kind=st.sampled_from(["empty dataset", "empty list", "drop_last", "empty generator", "used-up generator",
                             "empty iterable dataset"]),
       role=st.sampled_from(["train", "eval"]), features=st.integers(1, 6), batch=st.integers(1, 8))
def test_empty_loaders_are_refused(kind, role, features, batch):
    loader = empty_loader(kind, features, batch)
    if role == "eval":
        assume(_has_length(loader))  # an eval loader without a length is only known empty once run
        judge("data: empty loaders", f"eval {kind}", lambda: trainer(toy_net(features), eval_dataloader=loader),
              False, "eval_dataloader")
        return
    judge("data: empty loaders", f"train {kind}",
          lambda: fit(toy_net(features), loader, max_duration="2ep"), False, "train_dataloader")


LABEL_KINDS = ["index", "index with ignored", "uint8 index", "index >= classes", "negative index", "index [B, k]",
               "batch mismatch", "probabilities", "probabilities wrong width", "float [B]", "negative probabilities",
               "nan probabilities", "bool", "int32", "list"]
GOOD_LABELS = {"index", "index with ignored", "uint8 index", "probabilities"}


def make_labels(kind: str, batch: int, classes: int, data) -> object:
    draw = data.draw
    if kind == "index":
        return torch.tensor(draw(st.lists(st.integers(0, classes - 1), min_size=batch, max_size=batch)))
    if kind == "index with ignored":
        labels = draw(st.lists(st.sampled_from([*range(classes), -100]), min_size=batch, max_size=batch))
        labels[0] = draw(st.integers(0, classes - 1))  # not all ignored: a mean over nothing is NaN
        return torch.tensor(labels)
    if kind == "uint8 index":
        return torch.randint(0, classes, (batch,), dtype=torch.uint8)
    if kind == "index >= classes":
        labels = torch.randint(0, classes, (batch,))
        labels[draw(st.integers(0, batch - 1))] = draw(st.integers(classes, classes + 1000))
        return labels
    if kind == "negative index":
        labels = torch.randint(0, classes, (batch,))
        labels[draw(st.integers(0, batch - 1))] = draw(st.one_of(st.integers(-99, -1), st.integers(-10**6, -101)))
        return labels
    if kind == "index [B, k]":
        return torch.randint(0, classes, (batch, draw(st.integers(1, 12))))
    if kind == "batch mismatch":
        return torch.randint(0, classes, (batch + draw(st.sampled_from([-1, 1, 5])),))
    if kind == "probabilities":
        return torch.softmax(torch.randn(batch, classes), dim=1)
    if kind == "probabilities wrong width":
        return torch.rand(batch, draw(st.integers(1, 12).filter(lambda k: k != classes)))
    if kind == "float [B]":
        return torch.rand(batch)
    if kind == "negative probabilities":
        return torch.randn(batch, classes).clamp(max=-0.01)
    if kind == "nan probabilities":
        labels = torch.rand(batch, classes)
        labels[0, 0] = float("nan")
        return labels
    if kind == "bool":
        return torch.zeros(batch, dtype=torch.bool)
    if kind == "int32":
        return torch.randint(0, classes, (batch,), dtype=torch.int32)
    return [0] * batch  # "list"


@settings(FUZZ, max_examples=examples(100))
@given(batch=st.integers(1, 6), classes=st.integers(2, 10), kind=st.sampled_from(LABEL_KINDS), data=st.data())
def test_labels_must_fit_the_model(batch, classes, kind, data):
    labels = make_labels(kind, batch, classes, data)
    if kind == "batch mismatch":
        assume(labels.shape[0] > 0)
    batches = [(torch.randn(batch, 4), labels)]
    record = judge("data: labels vs model", f"{kind} labels {labels!r} for {classes} classes",
                   lambda: fit(toy_net(4, classes), batches), kind in GOOD_LABELS, "label")
    if kind in GOOD_LABELS:
        assert record.status == "completed"


INPUT_KINDS = ["good", "wrong width", "images", "one-dimensional", "integer", "empty batch", "scalar", "dict",
               "list of floats", "string"]


def make_inputs(kind: str, batch: int, width: int):
    return {
        "good": lambda: torch.randn(batch, 4),
        "wrong width": lambda: torch.randn(batch, width),
        "images": lambda: torch.randn(batch, 1, width, width),
        "one-dimensional": lambda: torch.randn(4),
        "integer": lambda: torch.randint(0, 5, (batch, 4)),
        "empty batch": lambda: torch.randn(0, 4),
        "scalar": lambda: torch.tensor(1.0),
        "dict": lambda: {"x": torch.randn(batch, 4)},
        "list of floats": lambda: [0.5] * batch,
        "string": lambda: "inputs",
    }[kind]()


@settings(FUZZ, max_examples=examples(80))
@given(kind=st.sampled_from(INPUT_KINDS), batch=st.integers(1, 6), width=st.integers(1, 9).filter(lambda w: w != 4))
def test_inputs_must_fit_the_model(kind, batch, width):
    """A refusal names the model and the shape of the batch that did not fit it."""
    inputs = make_inputs(kind, batch, width)
    labels = torch.randint(0, 3, (batch,))
    model = toy_net(4, 3)
    result = judge("data: inputs vs model", f"{kind} inputs", lambda: fit(model, [(inputs, labels)]), kind == "good",
                   ("train_dataloader", "batch"))
    if isinstance(result, ValueError) and isinstance(inputs, torch.Tensor) and inputs.dim() > 0 \
            and inputs.shape[0] > 0:
        assert str(list(inputs.shape)) in str(result), result
        assert "Sequential" in str(result) or "train_dataloader" in str(result), result


class _Detached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x).detach()


def _frozen(model):
    for p in model.parameters():
        p.requires_grad_(False)
    return model


MODELS = {
    "Flatten": lambda: torch.nn.Flatten(),
    "Identity": lambda: torch.nn.Identity(),
    "ReLU only": lambda: torch.nn.Sequential(torch.nn.ReLU()),
    "buffers only": lambda: torch.nn.BatchNorm1d(4, affine=False),
    "all frozen": lambda: _frozen(toy_net()),
    "frozen ResNet": lambda: _frozen(tiny_vision()[0]),
    "detached outputs": _Detached,
    "not a module": lambda: toy_net,
    "a module class": lambda: torch.nn.Linear,
}


@settings(FUZZ, max_examples=examples(30))
@given(kind=st.sampled_from(sorted(MODELS)))
def test_models_without_trainable_parameters(kind):
    model = MODELS[kind]()
    names = ("model", "trainable", "gradient")
    judge("data: parameterless models", kind, lambda: fit(model), False, names)


BATCH_SHAPES = st.sampled_from(["tensor only", "single-item tuple", "dict", "nested", "None", "labels as list"])


@settings(FUZZ, max_examples=examples(30))
@given(kind=BATCH_SHAPES, batch=st.integers(1, 5))
def test_batch_structures(kind, batch):
    x, y = torch.randn(batch, 4), torch.randint(0, 3, (batch,))
    structure = {"tensor only": x, "single-item tuple": (x,), "dict": {"inputs": x, "labels": y},
                 "nested": ((x, y),), "None": None, "labels as list": (x, y.tolist())}[kind]
    judge("data: batch structures", kind, lambda: fit(train=[structure]), False, ("batch", "label"))


def test_tokens_duration_over_image_batches_is_refused_not_endless():
    for arg in ("max_duration", "eval_interval"):
        extra = {"eval_dataloader": toy_batches(1)} if arg == "eval_interval" else {}
        judge("data: durations in tokens", f"{arg} in tokens", lambda: fit(**{arg: "100tok"}, **extra), False, arg)


# -- recipes read from files ----------------------------------------------------------------------
BASE_RECIPE = {k: v for k, v in get_recipe("fashion-mnist", "mild").to_dict().items() if k != "reached"}
YAML_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                      TEXT, st.lists(st.integers(0, 3), max_size=3),
                      st.dictionaries(st.text("abcxyz_", max_size=4), st.integers(0, 3), max_size=2))
FIELD_VALUES = {
    "name": st.sampled_from(["mine", "", "  "]),
    "task": st.sampled_from(["fashion-mnist", ""]),
    "domain": st.sampled_from(["vision", "language", "audio", "Vision"]),
    "model": st.sampled_from(["resnet8", ""]),
    "duration": DURATION_STRINGS,
    "eval_interval": DURATION_STRINGS,
    "batch_size": st.sampled_from([1, 256, 0, -3, 1.5, 2.0, "256"]),
    "optimizer": st.fixed_dictionaries({"name": st.sampled_from(["sgd", "adamw", "adam", "lion", ""]),
                                        "lr": st.one_of(st.floats(0, 1), st.floats(allow_nan=True, allow_infinity=True),
                                                        st.sampled_from([-0.1, "0.1", None]))}),
    "schedule": st.one_of(st.none(), st.sampled_from(["cosine", "linear", "bogus", "Cosine", "one-cycle"]),
                          st.fixed_dictionaries({"name": st.sampled_from(["cosine", "bogus"]),
                                                 "warmup": st.sampled_from(["0.1dur", "often"])})),
    "methods": st.one_of(st.dictionaries(st.sampled_from(["ema", "label_smoothing", "bogus"]),
                                         st.one_of(st.none(), st.just({}), st.just({"smoothing": 0.2}),
                                                   st.just({"smoothing": 7}), st.just({"half_life": "0ba"}),
                                                   st.integers(0, 3)), max_size=2)),
    "precision": st.sampled_from(["fp32", "bf16", "fp16", "auto", "fp8", "FP32"]),
    "loader": st.sampled_from(["memory", "torch", "disk", "Memory"]),
    "augment": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "crop_pad": st.sampled_from([0, 2, -1, 1.5, True, "2"]),
        "flip": st.sampled_from(["random", "alternating", None, "always", True]),
        "pad_mode": st.sampled_from(["reflect", "zeros", "wrap"])})),
    "summary": st.sampled_from(["", "fast"]),
    "reached": st.one_of(st.none(), st.just({"metric": "eval/accuracy"})),
}


def recipe_field_ok(field: str, value) -> bool:
    if field in ("task", "domain") and value is None:  # left out: the task that holds the recipe says
        return True
    if field in ("name", "task", "model"):
        return type(value) is str and bool(value.strip())
    if field == "summary":
        return type(value) is str
    if field == "domain":
        return value in ("vision", "language") and type(value) is str
    if field in ("duration", "eval_interval"):
        return type(value) is str and expected_duration(value, fraction_ok=field == "eval_interval") is not None
    if field == "batch_size":
        return type(value) is int and value >= 1
    if field == "optimizer":
        if type(value) is not dict or set(value) - {"name", "lr"} or value.get("name") not in ("sgd", "adamw", "adam"):
            return False
        lr = value.get("lr", 0.1)
        return type(lr) in (int, float) and math.isfinite(lr) and lr >= 0
    if field == "schedule":
        if value is None:
            return True
        if type(value) is str:
            return value.strip().lower().replace("-", "_") in SCHEDULES
        return (type(value) is dict and set(value) <= {"name", "warmup"} and value.get("name") == "cosine"
                and value.get("warmup", "0.1dur") == "0.1dur")
    if field == "methods":
        good = {"ema": (None, {}, {"smoothing": 0.2}), "label_smoothing": (None, {}, {"smoothing": 0.2})}
        return type(value) is dict and all(k in good and v in good[k] for k, v in value.items())
    if field == "precision":
        return value in ("fp32", "bf16", "fp16", "auto") and type(value) is str
    if field == "loader":
        return value in ("memory", "torch") and type(value) is str
    if field == "augment":
        if value is None:
            return True
        return (type(value) is dict and set(value) <= {"crop_pad", "flip", "pad_mode"}
                and (type(value.get("crop_pad", 0)) is int and value.get("crop_pad", 0) >= 0)
                and value.get("flip", "random") in ("random", "alternating", None)
                and value.get("pad_mode", "reflect") in ("reflect", "zeros"))
    if field == "reached":
        return value is None or type(value) is dict
    raise AssertionError(field)


def recipe_path(prefix: str) -> Path:
    folder = RUN_DIR / "recipes"
    folder.mkdir(exist_ok=True)
    return folder / f"{prefix}{next(_run_ids)}.yaml"


@settings(FUZZ, max_examples=examples(300))
@given(field=st.sampled_from(sorted(FIELD_VALUES)), data=st.data())
def test_recipe_file_fields(field, data):
    value = data.draw(st.one_of(FIELD_VALUES[field], FIELD_VALUES[field], YAML_JUNK))
    text = yaml.safe_dump({**BASE_RECIPE, field: value}, sort_keys=False)
    assume(repr(yaml.safe_load(text)[field]) == repr(value))  # the file says what was drawn
    path = recipe_path("r")
    path.write_text(text, encoding="utf-8")
    names = (field, "recipe file")
    judge("recipes: fields from YAML", f"{field}: {value!r}", lambda: Recipe.from_file(path),
          recipe_field_ok(field, value), names)


@settings(FUZZ, max_examples=examples(80))
@given(text=st.one_of(TEXT, st.sampled_from(["{a: [1, 2", "- 1\n- 2", "name: x", "[", "\t- a", "{}", "null", ": :",
                                             "a: b: c", "!!python/object/apply:os.getcwd []"])))
def test_recipe_files_that_are_not_recipes(text):
    path = recipe_path("t")
    path.write_text(text, encoding="utf-8")
    judge("recipes: malformed files", f"file {text!r}", lambda: Recipe.from_file(path), False, "recipe file")


def test_a_missing_recipe_file_is_a_value_error_too():
    judge("recipes: malformed files", "missing file", lambda: Recipe.from_file(RUN_DIR / "nope.yaml"), False,
          "recipe file")
    with pytest.raises(FileNotFoundError):
        Recipe.from_file(RUN_DIR / "nope.yaml")


def test_the_alarm_catches_a_hang():
    """The guard every configuration runs under does fire (so a hang fails the test instead of stalling it)."""
    import time

    with pytest.raises(AssertionError, match="hung"):
        with time_limit(0.2, "sleeping"):
            time.sleep(5)
