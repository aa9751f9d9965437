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


def records_plain_dynamo(item) -> bool:
    """A row that records what the unpatched dynamo exporter does (``test_vanilla_*``, ``*_fails_as_recorded``,
    exporter "dynamo"): a fact of the pinned torch that only a new torch can change, at ~2-30 s of dynamo
    export each (the zoo's whole models most). ``make test-facts`` and ``make test-matrix`` run them; ``make
    test`` does not (issue #45's 8 minutes: 363 s of the suite's 1,622 s of test time were these rows). The
    TorchScript rows cost 0.1 s and stay; the patched exports they stand beside stay with both exporters. (test_patterns' never-fewer check under dynamo,
    which exports plainly too, carries the marker itself.)"""
    name = getattr(item, "originalname", item.name)
    params = getattr(getattr(item, "callspec", None), "params", {})
    return (name.startswith("test_vanilla_") or name.endswith("_fails_as_recorded")) and params.get("exporter") == "dynamo"


@pytest.hookimpl(tryfirst=True)  # before pytest's own deselection by marker reads the marks
def pytest_collection_modifyitems(config, items):
    """Longest files first (``HEAVY_FIRST``); a stable sort, the same on every worker as xdist requires.
    The rows of ``records_plain_dynamo`` get the marker ``torch_facts``."""
    for item in items:
        if records_plain_dynamo(item):
            item.add_marker(pytest.mark.torch_facts)
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))
