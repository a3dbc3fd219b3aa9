# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml setup.py $(wildcard native/*.cc native/*.h)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: any other spec pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet pybind11 setuptools
	$(BIN)/pip install --quiet --no-build-isolation -e '.[torch,spark,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/horarun -np 2 $(BIN)/python examples/torch/digits.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/fusion.py
	$(BIN)/python bench/hosts.py
	$(BIN)/python bench/torch_training.py

clean:
	rm -rf build $(VENV) core/_native*.so *.egg-info
