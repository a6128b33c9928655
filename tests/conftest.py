import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests import helpers.py


import pytest  # noqa: E402
import torch  # noqa: E402


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
