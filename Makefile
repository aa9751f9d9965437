# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv when missing and installs the pinned versions.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fuzz test-torch20 test-runtimes runtimes bench clean

$(STAMP): setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m onnx_compat.demo

test: $(STAMP)
	$(PY) -m pytest -n 2 -q tests

# The larger property-based run of the conv patch (not in CI).
test-fuzz: $(STAMP)
	$(PY) -m pytest -q -m fuzz tests

# torch 2.0.1's TorchScript exporter, in a venv of its own (~2.5 GB download).
VENV20 := .venv-torch20
$(VENV20)/.installed: constraints-torch20.txt setup.py
	test -x $(VENV20)/bin/python || $(PYTHON) -m venv $(VENV20)
	$(VENV20)/bin/python -m pip install -q --upgrade pip
	$(VENV20)/bin/python -m pip install -q -c constraints-torch20.txt torch onnx onnxruntime "numpy<2" wrapt pytest hypothesis
	$(VENV20)/bin/python -m pip install -q --no-deps -e .
	touch $@

test-torch20: $(VENV20)/.installed
	$(VENV20)/bin/python -m pytest -q tests/test_padding.py tests/test_registry.py tests/test_conv_export.py tests/test_ops.py tests/test_spectral.py

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

test-runtimes: $(STAMP) runtimes
	$(PY) -m pytest -q tests/test_targets.py

clean:
	rm -rf $(VENV) $(VENV20) $(VENVORT) $(NODEORT) *.egg-info .pytest_cache .hypothesis
