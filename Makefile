# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv when missing and installs the pinned versions.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-facts test-fast test-fuzz test-torch20 test-matrix test-runtimes runtimes native bench bench-all clean

$(STAMP): setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m onnx_compat.demo

test: $(STAMP)
	$(PY) -m pytest -n 2 -q tests

# A few files that touch every layer a little (patches, specs, report, files, inspect, errors and the CLI's usage
# errors, the runtime layer, the docs' blocks, the benchmark index): the lane to run while working; `make test`
# before landing. The tests that start fresh interpreters are left to `make test`.
FAST := tests/test_padding.py tests/test_registry.py tests/test_spec.py tests/test_report.py tests/test_files.py \
	tests/test_repair_inspect.py tests/test_testing.py tests/test_errors.py tests/test_runtime_layer.py \
	tests/test_docs.py tests/test_benchmarks.py::test_the_benchmark_index_is_current
FRESH := does_not_load_the_dynamo_exporter or seeds_do_not_depend_on_the_process or never_shadows_a_public_function
test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -q $(FAST) -k "not ($(FRESH))"

# What unpatched torch's dynamo exporter does with each model whose failure a patch answers (the dynamo rows of
# test_vanilla_* and *_fails_as_recorded, marker torch_facts; tests/conftest.py): facts of the pinned torch,
# run here and by test-matrix, not by `make test` (not in CI; ~3 min of dynamo exports).
test-facts: $(STAMP)
	$(PY) -m pytest -n 2 -q -m torch_facts tests

# The larger property-based run of the conv patch (not in CI).
test-fuzz: $(STAMP)
	$(PY) -m pytest -q -m fuzz tests

# The torch versions users run (issue #18): one venv each under .venv-matrix/, with the onnx /
# onnxruntime / onnxscript / numpy of its time (constraints/torch-<version>.txt) and the same test
# tools (constraints/tools.txt); the pinned 2.13.0 is .venv. Not in CI: ~2.5 GB download per version.
MATRIX := 2.0.1 2.1.2 2.4.1 2.6.0 2.8.0 2.15.0
MVENV := .venv-matrix
$(MVENV)/%/.installed: constraints/torch-%.txt constraints/tools.txt setup.py
	test -x $(MVENV)/$*/bin/python || $(PYTHON) -m venv $(MVENV)/$*
	$(MVENV)/$*/bin/python -m pip install -q --upgrade pip
	PIP_CONSTRAINT="constraints/torch-$*.txt constraints/tools.txt" $(MVENV)/$*/bin/python -m pip install -q -e ".[test]"
	touch $@

# The whole suite on every version, then the bundled Conformer and BLSTM through export(exporter="auto");
# prints the support table (MATRIX_ARGS="--write docs/compatibility.md" replaces it there).
test-matrix: $(STAMP) $(MATRIX:%=$(MVENV)/%/.installed)
	$(PY) benchmarks/support_matrix.py $(MATRIX_ARGS) .venv $(MATRIX:%=$(MVENV)/%)

# torch 2.0.1 alone, the fast subset (conv, registry, ops, spectral).
test-torch20: $(MVENV)/2.0.1/.installed
	$(MVENV)/2.0.1/bin/python -m pytest -q tests/test_padding.py tests/test_registry.py tests/test_conv_export.py tests/test_ops.py tests/test_spectral.py

# Runtimes users deploy, for tests/test_targets.py (not in CI; make test skips those checks and says why):
# ONNX Runtime 1.16.3 in a venv of its own, and onnxruntime-node 1.30.0 (its install script downloads from a
# host this machine cannot reach; the linux-x64 library ships in the package, so --ignore-scripts works).
VENVORT := .venv-ort116
NODEORT := .node-ort
$(VENVORT)/.installed:
	test -x $(VENVORT)/bin/python || $(PYTHON) -m venv $(VENVORT)
	$(VENVORT)/bin/python -m pip install -q "onnxruntime==1.16.3" "numpy<2"
	touch $@

$(NODEORT)/.installed:
	npm install --ignore-scripts --no-audit --no-fund --prefix $(NODEORT) onnxruntime-node@1.30.0
	touch $@

runtimes: $(VENVORT)/.installed $(NODEORT)/.installed

# The C++ consumer of tests/test_native.py (not in CI, which skips it and says why): ONNX Runtime's headers
# from Debian trixie's libonnxruntime-dev (downloaded, unpacked under deploy/cpp/build, never installed),
# the library from the onnxruntime and the sherpa-onnx wheels.
native: $(STAMP)
	$(MAKE) -C deploy/cpp PY=$(abspath $(PY))
	$(MAKE) -C deploy/cpp PY=$(abspath $(PY)) ORT_LIB=sherpa-onnx

test-runtimes: $(STAMP) runtimes
	$(PY) -m pytest -q tests/test_targets.py

# The benchmarks by cost class, from the one index (benchmarks/README.md, made by benchmarks/index.py from each
# script's BENCHMARK header); each writes its table in place. Run them alone: they are timings.
bench: $(STAMP)
	$(PY) benchmarks/index.py --run fast

bench-all: $(STAMP)
	$(PY) benchmarks/index.py --run all

clean:
	$(MAKE) -C deploy/cpp clean
	rm -rf $(VENV) $(MVENV) $(VENVORT) $(NODEORT) *.egg-info .pytest_cache .hypothesis
