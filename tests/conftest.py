import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "support"))  # tests import helpers.py and the other support modules


import prerequisites  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_configure(config):
    # The prerequisite(name) marker, CI=true failures for what is missing, and skips counted by reason.
    if not config.pluginmanager.has_plugin("prerequisites"):
        config.pluginmanager.register(prerequisites, "prerequisites")


# The files that take minutes each, longest first. With two workers, a long file started last leaves one worker
# alone with it while the other idles (the suite's wall clock, not its work, grows), so they start first and the
# short files fill in around them. `make test` passes --no-loadscope-reorder, without which pytest-xdist orders
# files by their number of tests instead.
STARTED_FIRST = ("cli/test_tutorials.py", "tasks/test_seed_scale_step.py", "train/test_step_kernels.py",
                 "cli/test_notebooks.py", "cli/test_fault_matrix.py", "experiments/test_tune.py",
                 "data/test_streaming.py")


def pytest_collection_modifyitems(config, items):
    gone = [name for name in STARTED_FIRST if not (Path(__file__).parent / name).exists()]
    if gone:
        raise pytest.UsageError(f"tests/conftest.py's STARTED_FIRST names {gone}, which tests/ no longer has; "
                                f"rename or remove them there")

    def rank(item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return STARTED_FIRST.index(path) if path in STARTED_FIRST else len(STARTED_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def one_thread_for_small_tests(request):
    """Tiny models run faster on one thread (and much faster on a busy machine); real-data runs keep all."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def torch_determinism_as_found():
    """A test that asks torch for deterministic kernels (Lightning's ``Trainer(deterministic=True)`` sets them for the
    process) leaves the next test on its worker as it found it: deterministic mode fills every new tensor, which a
    kernel count sees."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.fixture(autouse=True)
def forget_registered_tasks_and_methods():
    """Tasks and methods a test registers (a user's, a folder's) are gone afterwards, so tests do not see
    each other's."""
    from speedkit.methods import REGISTRY
    from speedkit.tasks import TASKS

    before, methods_before = set(TASKS), dict(REGISTRY)
    yield
    for name in set(TASKS) - before:
        TASKS.pop(name)  # its recipes and baselines go with it
    REGISTRY.clear()
    REGISTRY.update(methods_before)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The fuzz tests' counts: tests/train/test_fuzz.py fills ``config.speedkit_fuzz_counts`` (test -> [tried, accepted])."""
    counts = getattr(config, "speedkit_fuzz_counts", None)
    if not counts:
        return
    failed = [r for r in terminalreporter.stats.get("failed", []) if "test_fuzz.py" in r.nodeid]
    outcome = (f"{len(failed)} fuzz test(s) FAILED" if failed
               else "all refused with ValueError/TypeError or accepted")
    tried, accepted = (sum(c[i] for c in counts.values()) for i in (0, 1))
    terminalreporter.write_line(f"fuzz: {tried} configurations tried ({accepted} accepted, {tried - accepted} "
                                f"refused), {outcome}")
    if config.option.verbose > 0:
        for name, (n, ok) in sorted(counts.items()):
            terminalreporter.write_line(f"  {name}: {n} tried, {ok} accepted")
