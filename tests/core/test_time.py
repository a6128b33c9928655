"""Property tests for speedkit.core.time: parsing, printing, arithmetic, Timestamp counters."""
import math
import operator

import pytest
from hypothesis import given, settings, strategies as st

from speedkit.core.time import ACCEPTED_UNITS, Time, TimeUnit, Timestamp

# per-test settings (not a global profile, which would leak into other test files)
FAST = settings(max_examples=60, deadline=None)

WHOLE = [TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN]
FLOATY = [TimeUnit.EPOCH, TimeUnit.SECOND]

whole_values = st.integers(min_value=0, max_value=2**53)
float_values = st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False)
dur_values = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def times(draw, unit=None):
    unit = draw(st.sampled_from(list(TimeUnit))) if unit is None else unit
    if unit in WHOLE:
        return Time(draw(whole_values), unit)
    if unit is TimeUnit.DURATION:
        return Time(draw(dur_values), unit)
    return Time(draw(float_values), unit)


# -- parse / print round trip -----------------------------------------------------------------
@pytest.mark.parametrize("unit", list(TimeUnit), ids=lambda u: u.value)
@FAST
@given(data=st.data())
def test_str_round_trip_every_unit(unit, data):
    t = data.draw(times(unit))
    text = str(t)
    assert text.endswith(unit.value)
    assert Time.from_string(text) == t


@FAST
@given(times())
def test_dict_round_trip(t):
    d = t.to_dict()
    assert d == {"value": t.value, "unit": t.unit.value}
    assert Time.from_dict(d) == t


@FAST
@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(WHOLE))
def test_whole_units_parse_as_ints(n, unit):
    t = Time.from_string(f"{n}{unit.value}")
    assert t == Time(n, unit) and isinstance(t.value, int)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2Mtok", Time(2_000_000, TimeUnit.TOKEN)),
        ("1.5Mtok", Time(1_500_000, TimeUnit.TOKEN)),
        ("3ksp", Time(3_000, TimeUnit.SAMPLE)),
        ("3Ksp", Time(3_000, TimeUnit.SAMPLE)),
        ("1Bba", Time(1_000_000_000, TimeUnit.BATCH)),
        ("1Gtok", Time(1_000_000_000, TimeUnit.TOKEN)),
        ("5m", Time(300.0, TimeUnit.SECOND)),
        ("5min", Time(300.0, TimeUnit.SECOND)),
        ("90s", Time(90.0, TimeUnit.SECOND)),
        ("90sec", Time(90.0, TimeUnit.SECOND)),
        ("1.5h", Time(5400.0, TimeUnit.SECOND)),
        ("0.25dur", Time(0.25, TimeUnit.DURATION)),
        ("1dur", Time(1.0, TimeUnit.DURATION)),
        ("2.5ep", Time(2.5, TimeUnit.EPOCH)),
        (" 10 ep ", Time(10, TimeUnit.EPOCH)),
        ("1e3ba", Time(1000, TimeUnit.BATCH)),
    ],
)
def test_multipliers_and_clock_units(text, expected):
    assert Time.from_string(text) == expected


@FAST
@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "k", "M"]))
def test_integer_multipliers(n, mult):
    factor = {"": 1, "k": 1_000, "M": 1_000_000}[mult]
    assert Time.from_string(f"{n}{mult}tok") == Time(n * factor, TimeUnit.TOKEN)


@pytest.mark.parametrize("make, value", [(lambda: Time.from_string("2.01ktok"), 2010),
                                         (lambda: Time(2**53 + 1, TimeUnit.TOKEN), 2**53 + 1)],
                         ids=["2.01ktok", "2**53+1tok"])
def test_whole_units_survive_float_rounding(make, value):
    assert make().value == value


@pytest.mark.parametrize(
    "make",
    [Time.epochs, Time.batches, Time.samples, Time.tokens, Time.fraction, Time.seconds],
)
def test_constructors(make):
    t = make(1)
    assert t.value == 1 and isinstance(t.unit, TimeUnit)


def test_from_input():
    assert Time.from_input(None) is None
    t = Time.epochs(2)
    assert Time.from_input(t) is t
    assert Time.from_input("3ba") == Time.batches(3)
    assert Time.from_input(0.5, default_unit="dur") == Time.fraction(0.5)
    with pytest.raises(TypeError, match="10ep"):
        Time.from_input(5)  # a bare number needs a default unit


# -- arithmetic and comparison ----------------------------------------------------------------
@FAST
@given(st.data(), st.sampled_from(list(TimeUnit)))
def test_same_unit_arithmetic_and_comparison_match_numbers(data, unit):
    a, b = data.draw(times(unit)), data.draw(times(unit))
    if unit is TimeUnit.DURATION or unit in FLOATY:
        # keep sums finite
        a, b = Time(min(a.value, 1e290), unit), Time(min(b.value, 1e290), unit)
    if unit is TimeUnit.DURATION and a.value + b.value > 1:
        with pytest.raises(ValueError, match="between 0 and 1"):
            a + b  # a fraction of the run cannot exceed the run
    else:
        assert (a + b).value == a.value + b.value and (a + b).unit is unit
        assert (a + str(b)) == a + b  # strings are parsed
    hi, lo = (a, b) if a.value >= b.value else (b, a)
    assert (hi - lo).value == hi.value - lo.value
    for op in (operator.lt, operator.le, operator.gt, operator.ge):
        assert op(a, b) == op(a.value, b.value)
    assert (a == b) == (a.value == b.value)
    assert (a < str(b)) == (a.value < b.value)


@FAST
@given(st.data())
def test_subtracting_more_than_there_is_raises(data):
    unit = data.draw(st.sampled_from(WHOLE))
    a = data.draw(st.integers(min_value=0, max_value=10**9))
    b = data.draw(st.integers(min_value=a + 1, max_value=10**9 + 1))
    with pytest.raises(ValueError, match="negative"):
        Time(a, unit) - Time(b, unit)


@FAST
@given(st.data())
def test_mixing_units_raises(data):
    u1, u2 = data.draw(st.lists(st.sampled_from(list(TimeUnit)), min_size=2, max_size=2, unique=True))
    a, b = data.draw(times(u1)), data.draw(times(u2))
    for op in (operator.add, operator.sub, operator.lt, operator.le, operator.gt, operator.ge, operator.truediv):
        with pytest.raises(ValueError, match="units differ"):
            op(a, b)


def test_mul_div():
    assert Time.batches(10) * 2.5 == Time.batches(25)
    assert 3 * Time.epochs(1.5) == Time.epochs(4.5)
    assert Time.batches(10) * 0.33 == Time.batches(3)  # whole units round
    assert Time.batches(10) / Time.batches(4) == 2.5
    assert Time.batches(10) / "5ba" == 2.0
    assert Time.epochs(3) / 2 == Time.epochs(1.5)
    with pytest.raises(TypeError):
        Time.batches(1) * "2"


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, mentions_units",
    [
        ("10", True),
        ("ep", True),
        ("10 parsecs", True),
        ("-1ep", True),
        ("", True),
        ("1.5ba", False),
        ("2dur", False),
        ("1.5tok", False),
        ("10EP", True),
    ],
)
def test_bad_strings_raise_with_the_text(text, mentions_units):
    with pytest.raises(ValueError) as info:
        Time.from_string(text)
    message = str(info.value)
    assert repr(text) in message
    if mentions_units:
        assert ACCEPTED_UNITS in message


@pytest.mark.parametrize("value", [10, 1.5, None, b"10ep", ["10ep"], Time.epochs(1)])
def test_non_strings_raise_type_error(value):
    with pytest.raises(TypeError) as info:
        Time.from_string(value)
    assert type(value).__name__ in str(info.value)


@FAST
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12))
def test_arbitrary_text_parses_or_raises_value_error(text):
    try:
        t = Time.from_string(text)
    except ValueError as e:
        assert repr(text) in str(e)
    else:
        assert isinstance(t, Time) and t.value >= 0


@pytest.mark.parametrize(
    "value, unit, error",
    [
        (-1, TimeUnit.EPOCH, ValueError),
        (math.inf, TimeUnit.SECOND, ValueError),
        (math.nan, TimeUnit.EPOCH, ValueError),
        (1.5, TimeUnit.BATCH, ValueError),
        (True, TimeUnit.BATCH, TypeError),
        ("3", TimeUnit.BATCH, TypeError),
    ],
)
def test_bad_constructor_values(value, unit, error):
    with pytest.raises(error):
        Time(value, unit)


def test_unit_accepts_its_string():
    assert Time(3, "ba") == Time(3, TimeUnit.BATCH)
    with pytest.raises(ValueError):
        Time(3, "parsecs")


# -- Timestamp --------------------------------------------------------------------------------
@FAST
@given(st.lists(st.lists(st.tuples(st.integers(0, 512), st.integers(0, 10**5)), max_size=6), max_size=5))
def test_timestamp_counters(epochs):
    ts = Timestamp()
    total_b = total_s = total_t = 0
    for batches in epochs:
        for samples, tokens in batches:
            ts = ts.after_batch(samples, tokens)
            total_b, total_s, total_t = total_b + 1, total_s + samples, total_t + tokens
        assert ts.batch_in_epoch == len(batches)
        assert ts.sample_in_epoch == sum(s for s, _ in batches)
        assert ts.token_in_epoch == sum(t for _, t in batches)
        ts = ts.after_epoch()
        assert ts.batch_in_epoch == ts.sample_in_epoch == ts.token_in_epoch == 0
    assert (ts.epoch, ts.batch, ts.sample, ts.token) == (len(epochs), total_b, total_s, total_t)
    assert ts.get("ep") == len(epochs) and ts.get(TimeUnit.BATCH) == total_b
    assert ts.get("sp") == total_s and ts.get("tok") == total_t
    assert Timestamp.from_dict(ts.to_dict()) == ts


def test_timestamp_wall_clock_and_immutability():
    ts = Timestamp()
    nxt = ts.after_batch(8)
    assert ts.batch == 0 and nxt.batch == 1 and nxt.token == 0  # the old one is unchanged
    assert nxt.wall_s == 0.0
    nxt = nxt.after_batch(8, wall_s=1.5)
    assert nxt.wall_s == 1.5 and nxt.get("s") == 1.5
    assert nxt.after_batch(8).wall_s == 1.5  # None keeps the clock
    assert nxt.with_wall(3.0).wall_s == 3.0 and nxt.with_wall(3.0).batch == nxt.batch
    with pytest.raises(ValueError, match="fraction_done"):
        nxt.get("dur")
    with pytest.raises(Exception):
        nxt.batch = 5  # frozen


@FAST
@given(
    st.builds(
        Timestamp,
        epoch=st.integers(0, 10**6), batch=st.integers(0, 10**9), sample=st.integers(0, 10**12),
        token=st.integers(0, 10**15), batch_in_epoch=st.integers(0, 10**6), sample_in_epoch=st.integers(0, 10**9),
        token_in_epoch=st.integers(0, 10**12), wall_s=st.floats(0, 1e9, allow_nan=False),
    )
)
def test_timestamp_dict_round_trip(ts):
    d = ts.to_dict()
    assert Timestamp.from_dict(d) == ts
    assert Timestamp.from_dict({**d, "unknown_key": 1}) == ts  # extra keys ignored


def test_a_scaled_budget_stays_in_its_unit_whole_where_it_counts_and_never_zero():
    from speedkit.core.time import scaled_duration

    assert scaled_duration("36ep", 0.1) == "3.6ep"  # a bench profile's or a trial's share of an epoch budget
    assert scaled_duration("36ep", 0.1, whole=True) == "4ep"  # a rehearsal of a budget published in whole epochs
    assert scaled_duration("90ep", 0.1, whole=True) == "9ep"
    assert scaled_duration("250ba", 0.001) == "1ba"  # at least one batch
    assert scaled_duration("14000ba", 0.05, whole=True) == "700ba"
    assert scaled_duration("3ep", 1 / 3) == "1ep"  # three significant digits, not 0.9999999999999999
    assert scaled_duration("0.5ep", 0.001, whole=True) == "1ep"
