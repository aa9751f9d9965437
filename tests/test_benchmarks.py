"""Each benchmark runs at a tiny size, so none can rot. Not timed."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import eager_overhead  # noqa: E402
import padding_paths  # noqa: E402

from helpers import HAS_DYNAMO  # noqa: E402
import pytest  # noqa: E402


@pytest.mark.skipif(not HAS_DYNAMO, reason="the benchmark compares with the dynamo exporter")
def test_padding_paths_smoke(capsys):
    rows = padding_paths.main(["--tiny", "--runs", "1"])
    assert len(rows) == 16
    by = {(r[0], r[1]): r for r in rows}
    assert by[("dilated k=3 d=2", "torchscript native")][2].startswith("ORT fails")
    assert by[("even k=32", "torchscript + patch (asymmetric) + cleanup")][3] == by[("even k=32", "dynamo native")][3]
    assert "| stack |" in capsys.readouterr().out


def test_eager_overhead_smoke():
    assert eager_overhead.main(["--tiny"]) > 0
