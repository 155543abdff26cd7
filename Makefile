# `make test` and `make bench` do all set-up. Where python3 already has torch
# (the GPU machine) they use it; otherwise they make .venv with torch and
# pytest from the local wheel mirror.
PYTHON := $(shell python3 -c 'import torch' 2>/dev/null && echo python3 || echo .venv/bin/python)
TORCH_VERSION ?= 2.14.1

.PHONY: install test bench clean

.venv/bin/python:
	python3 -m venv .venv
	.venv/bin/pip install -q torch==$(TORCH_VERSION) pytest numpy setuptools wheel

install: $(if $(filter .venv/bin/python,$(PYTHON)),.venv/bin/python)
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .

test: install
	$(PYTHON) -m pytest -q tests

bench: install
	for b in reduce ladder norms; do $(PYTHON) bench/$$b.py || exit 1; done
	$(PYTHON) scripts/update_readme.py

clean:
	rm -rf build *.egg-info fastreduce_torch/*.so
