"""What every test file shares: ``helpers`` and ``models`` importable by name, and the exporter list."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `from helpers import ...` in any test file

from onnx_compat import testing  # noqa: E402


@pytest.fixture(params=testing.EXPORTERS)
def exporter(request):
    """Each exporter this torch has; a test that takes ``exporter`` without parametrizing it runs under each."""
    return request.param
