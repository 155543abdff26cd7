# `make test` and `make bench` do all set-up. Where python3 already has torch
# (the GPU machine) they use it; otherwise they make .venv with torch and
# pytest from the local wheel mirror. `make test` runs the Python tests, then
# the C++ ones (cpp-test: API tests, the C++ example, AOTInductor from C++).
PYTHON := $(shell python3 -c 'import torch' 2>/dev/null && echo python3 || echo .venv/bin/python)
TORCH_VERSION ?= 2.14.1

.PHONY: install test test-deps cpp-test gtest wheel bench clean

.venv/bin/python:
	python3 -m venv .venv
	.venv/bin/pip install -q torch==$(TORCH_VERSION) pytest numpy setuptools wheel

install: $(if $(filter .venv/bin/python,$(PYTHON)),.venv/bin/python)
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .

# transformers: the tests build tiny models of each supported architecture.
test-deps: install
	@$(PYTHON) -c 'import transformers' 2>/dev/null || $(PYTHON) -m pip install -q transformers

test: install test-deps
	$(PYTHON) -m pytest -q tests
	$(MAKE) cpp-test

# GoogleTest for the C++ tests: Debian's libgtest-dev, installed when it can be.
gtest:
	@test -f /usr/include/gtest/gtest.h || test -f /usr/local/include/gtest/gtest.h || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get install -y -q libgtest-dev || { apt-get update -q && apt-get install -y -q libgtest-dev; }; \
	else \
	  echo "The C++ tests need GoogleTest: run 'sudo apt-get install libgtest-dev' (or install it where CMake finds it)" >&2; \
	  exit 1; \
	fi

cpp-test: install gtest
	cmake -S tests/cpp -B build/cpp -DCMAKE_BUILD_TYPE=Release \
	  -DPython3_EXECUTABLE="$$($(PYTHON) -c 'import sys; print(sys.executable)')" \
	  -DCMAKE_PREFIX_PATH="$$($(PYTHON) -c 'import torch, fastreduce_torch as f; print(torch.utils.cmake_prefix_path + ";" + f.cmake_prefix_path)')"
	cmake --build build/cpp --parallel $${MAX_JOBS:-2}
	ctest --test-dir build/cpp --output-on-failure

wheel: install
	$(PYTHON) -m pip wheel -q --no-build-isolation --no-deps -w dist .

bench: install
	for b in reduce ladder gpt2_rows; do $(PYTHON) bench/$$b.py || exit 1; done
	$(PYTHON) scripts/update_readme.py

clean:
	rm -rf build dist *.egg-info fastreduce_torch/*.so fastreduce_torch/include fastreduce_torch/share fastreduce_torch/_build_info.py
