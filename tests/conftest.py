"""What every test file shares: ``helpers`` and ``models`` importable by name, and the exporter list."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `from helpers import ...` in any test file


def _cores_shared_by_workers():
    """Under ``pytest -n N`` each worker gets its share of the cores as torch (OpenMP) threads, and so do the
    interpreters its tests start (through the environment). torch's default, one thread per core in every
    worker, oversubscribes the cores: its threads spin waiting for each other, and the suite spent about
    twice the CPU on the eager runs and exports for the same work (test_recurrent's TorchScript tests: 15.9 s
    of CPU with 2 threads per worker, 8.1 s with 1). Set before torch is imported, so OpenMP's pool is sized
    once; a value the user exported is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


_cores_shared_by_workers()

import torch  # noqa: E402

from onnx_compat import testing  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and os.environ.get("OMP_NUM_THREADS", "").isdigit():
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # in case torch was imported before this file


@pytest.fixture(params=testing.EXPORTERS)
def exporter(request):
    """Each exporter this torch has; a test that takes ``exporter`` without parametrizing it runs under each."""
    return request.param


# The files whose tests take longest (CPU seconds measured with `make test`, issue #45), sent to the workers
# first: `pytest -n 2` hands tests out in collection order, so a long file collected last (the zoo, by name)
# kept one worker busy for minutes after the other had run out of tests. Files keep their own order inside,
# so a module's fixtures are still built once per worker; files not listed follow in their usual order.
HEAVY_FIRST = ("test_zoo.py", "test_spectral.py", "test_patterns.py", "test_recurrent.py", "test_attention.py",
               "test_benchmarks.py", "test_ops.py", "test_export.py", "test_contracts.py", "test_docs.py",
               "test_huggingface.py", "test_sherpa_transducers.py", "test_sherpa_streaming.py", "test_streaming.py",
               "test_targets.py", "test_refusals.py", "test_sizes.py", "test_quantize.py")


def pytest_collection_modifyitems(config, items):
    """Longest files first (``HEAVY_FIRST``); a stable sort, the same on every worker as xdist requires."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))
