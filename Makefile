# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The legacy Spark 3.5 + Petastorm environment is cached outside the checkout, keyed by its requirements.
LEGACY_REQUIREMENTS := .ci/legacy-requirements.txt
LEGACY ?= $(HOME)/.cache/hora/legacy-$(shell sha256sum $(LEGACY_REQUIREMENTS) | cut -c1-12)

.PHONY: demo test test-legacy legacy-env lint bench clean

$(STAMP): pyproject.toml setup.py $(wildcard native/*.cc native/*.h)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: any other spec pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet pybind11 setuptools
	$(BIN)/pip install --quiet --no-build-isolation -e '.[torch,spark,tensorflow,ray,test]'
	touch $(STAMP)

demo: $(STAMP)
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(BIN)/python examples/spark/digits_estimator.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest
	$(MAKE) test-legacy

$(LEGACY)/.installed: $(LEGACY_REQUIREMENTS)
	test -x $(LEGACY)/bin/python || $(PYTHON) -m venv $(LEGACY)
	$(LEGACY)/bin/python -m pip install --quiet --upgrade pip
	$(LEGACY)/bin/python -m pip install --quiet torch==2.13.0
	$(LEGACY)/bin/python -m pip install --quiet -r $(LEGACY_REQUIREMENTS)
	touch $@

# Hora in the legacy environment comes from this checkout, through the editable install's finder
# copied from .venv (the same Python).
legacy-env: $(STAMP) $(LEGACY)/.installed
	cp $(VENV)/lib/python3*/site-packages/__editable__*hora* \
	   "$$($(LEGACY)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# The Spark and data tests again on pyspark 3.5 / pyarrow 14 / numpy 1.26, with Petastorm.
# pyspark 3.5 leaves a socket of its own unclosed in collect(): its ResourceWarning is not ours.
test-legacy: legacy-env
	$(LEGACY)/bin/python -m pytest -p no:cacheprovider -W ignore::ResourceWarning \
	   -W ignore::pytest.PytestUnraisableExceptionWarning tests/spark

bench: $(STAMP)
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/fusion.py
	$(BIN)/python bench/hosts.py
	$(BIN)/python bench/torch_training.py
	$(BIN)/python bench/spark_overhead.py
	$(BIN)/python bench/estimator.py
	$(BIN)/python bench/ray_overhead.py
	$(MAKE) legacy-env
	$(LEGACY)/bin/python bench/spark_overhead.py --skip-startup

clean:
	rm -rf build $(VENV) core/_native*.so *.egg-info
