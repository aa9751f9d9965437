"""The native C++ consumer (deploy/cpp): built here from registry packages, it runs our exports like RASR.

The program is compiled into a temporary folder against ONNX Runtime's
headers (Debian trixie's libonnxruntime-dev, fetched by ``make -C deploy/cpp
headers``) and linked twice: with the onnxruntime wheel's library and with
the sherpa-onnx wheel's. Outputs and lengths are compared with the unpatched
eager model at B=3 with unequal lengths and at B=1. Skipped, with the reason,
when the compiler or the headers are missing.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import onnx
import pytest

from onnx_compat import export
from onnx_compat.contracts import apply_contract
from onnx_compat.contracts.native import ROOT, NativeRasrConsumer
from onnx_compat.models import blstm, conformer

CPP = os.path.join(ROOT, "deploy", "cpp")
HEADER_DIRS = [os.environ.get("ONNX_COMPAT_ORT_INCLUDE", ""), os.path.join(CPP, "build", "root", "usr", "include", "onnxruntime"),
               "/usr/include/onnxruntime"]
LIBRARIES = [pkg for pkg, module in (("onnxruntime", "onnxruntime"), ("sherpa-onnx", "sherpa_onnx"))
             if importlib.util.find_spec(module)]


def _headers():
    return next((d for d in HEADER_DIRS if d and os.path.exists(os.path.join(d, "onnxruntime_cxx_api.h"))), None)


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    """One build per ONNX Runtime library the registry packages here ship."""
    compiler, headers = shutil.which(os.environ.get("CXX", "g++")), _headers()
    if compiler is None:
        pytest.skip("no C++ compiler (g++) on this machine")
    if headers is None:
        pytest.skip("ONNX Runtime's C++ headers are missing: make -C deploy/cpp headers (Debian trixie's "
                    "libonnxruntime-dev), or set ONNX_COMPAT_ORT_INCLUDE")
    folder = tmp_path_factory.mktemp("native")
    obj = folder / "rasr_consumer.o"
    subprocess.run([compiler, "-O1", "-std=c++17", "-I", headers, "-c", os.path.join(CPP, "rasr_consumer.cc"), "-o",
                    str(obj)], check=True)
    built = {}
    for package in LIBRARIES:
        lib = folder / f"lib-{package}"
        lib.mkdir()
        subprocess.run([sys.executable, os.path.join(CPP, "find_ort_library.py"), package, str(lib)], check=True,
                       capture_output=True)
        built[package] = str(folder / f"rasr_consumer-{package}")
        subprocess.run([compiler, str(obj), "-o", built[package], f"-L{lib}", "-lonnxruntime",
                        f"-Wl,-rpath,{lib}"], check=True)
    return built


@pytest.mark.parametrize("bundled", ["blstm", "conformer"])
def test_native_consumer_matches_eager(bundled, binaries, tmp_path):
    """Both libraries, the packed BLSTM (T' = T) and the subsampling Conformer (T' = (T - 3) // 4)."""
    job = blstm.build(features=20, classes=10, hidden=16) if bundled == "blstm" else conformer.tiny()
    path = os.path.join(tmp_path, "model.onnx")
    export(job["model"], path, job["inputs"], job["outputs"], exporter="torchscript")
    proto = onnx.load(path)
    applied = apply_contract("rasr", proto, job["inputs"], job["outputs"])
    assert binaries, "no registry package with an ONNX Runtime library is installed"
    for package, binary in binaries.items():
        check = NativeRasrConsumer(binary).verify(str(tmp_path), path, job["model"], job["inputs"], applied)
        assert check["ok"] and check["max_abs_err"] < 1e-4, (package, check)


def test_rasr_contract_verifies_in_the_built_consumer_or_says_why_not(tmp_path):
    job = blstm.build(features=20, classes=10, hidden=16)
    path = os.path.join(tmp_path, "model.onnx")
    export(job["model"], path, job["inputs"], job["outputs"], exporter="torchscript", verify=False)
    proto = onnx.load(path)
    checks = apply_contract("rasr", proto, job["inputs"], job["outputs"]).verify_in_consumer(proto, job["model"], job["inputs"])
    (check,) = checks
    if NativeRasrConsumer().available():
        assert check["ok"] is None and "make -C deploy/cpp" in check["skipped"], check
    else:
        assert check["ok"] and check["max_abs_err"] < 1e-4, check
