# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The legacy Spark 3.5 + Petastorm environment is cached outside the checkout, keyed by its requirements.
LEGACY_REQUIREMENTS := .ci/legacy-requirements.txt
LEGACY ?= $(HOME)/.cache/hora/legacy-$(shell sha256sum $(LEGACY_REQUIREMENTS) | cut -c1-12)

.PHONY: demo test docs test-asan test-legacy legacy-env lint bench clean

$(STAMP): pyproject.toml setup.py $(wildcard native/*.cc native/*.h)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: any other spec pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet pybind11 setuptools
	$(BIN)/pip install --quiet --no-build-isolation -e '.[torch,spark,tensorflow,jax,ray,mpi,mlflow,notebooks,docs,test]'
	touch $(STAMP)

demo: $(STAMP)
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(BIN)/python examples/spark/digits_estimator.py
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} TF_CPP_MIN_LOG_LEVEL=$${TF_CPP_MIN_LOG_LEVEL:-3} \
	   $(BIN)/python examples/spark/keras_estimator.py

# The main suite leaves about a fifth of the two cores idle (ranks waiting out timeouts, JVMs and workers starting),
# so what the later steps need and one core does (the docs, the sanitized build, the legacy environment) runs beside
# it at the lowest priority, and is waited for after it; its output is in build/test-prep.log.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	mkdir -p build
	nice -n 19 $(MAKE) --no-print-directory docs $(ASAN)/.built legacy-env > build/test-prep.log 2>&1 & prep=$$!; \
	$(BIN)/python -m pytest; suite=$$?; \
	if ! wait $$prep; then cat build/test-prep.log; echo "make test: the docs, the sanitized build or the legacy \
	environment failed (above)." >&2; exit 1; fi; \
	exit $$suite
	$(MAKE) test-asan
	$(MAKE) test-legacy

# The documentation site (docs/_build/html), its API reference generated from the docstrings; a warning fails it.
docs: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=$${TF_CPP_MIN_LOG_LEVEL:-3} $(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html

# The native core built with AddressSanitizer and UBSan, under the native, core and torch tests. It lives in
# its own tree ($(ASAN)/hora: links to the package's sources beside the sanitized _native), found first through
# PYTHONPATH by the tests and by every worker process they start. Leaks are not checked: CPython keeps its own.
ASAN := build/asan
SANITIZER_RUNTIME = $$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)
$(ASAN)/.built: $(STAMP) setup.py $(wildcard native/*.cc native/*.h)
	rm -rf $(ASAN) && mkdir -p $(ASAN)/hora
	HORA_SANITIZE=address,undefined $(BIN)/python setup.py -q build_ext -j 2 --force --build-lib $(ASAN) \
	   --build-temp build/asan-objects
	touch $@

SANITIZED = PYTHONPATH=$(ASAN) LD_PRELOAD=$(SANITIZER_RUNTIME) \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The package's sources are linked afresh on every run, so the tree never misses a module added since the build.
test-asan: $(ASAN)/.built
	find $(ASAN)/hora -maxdepth 1 -type l -delete
	for entry in core/*; do case $$entry in *.so) ;; *) ln -s ../../../$$entry $(ASAN)/hora/;; esac; done
	ln -s ../../../spark_backend $(ASAN)/hora/spark
	ln -s ../../../ray_backend $(ASAN)/hora/ray
	ln -s ../../../estimators $(ASAN)/hora/estimators
	$(SANITIZED) $(BIN)/python -c "import sys, hora._native as n; sys.exit(0 if '/$(ASAN)/' in n.__file__ \
	   else 'the tests would not run on the sanitized core: ' + n.__file__)"
	$(SANITIZED) $(BIN)/python -m pytest -p no:cacheprovider tests/native tests/core tests/torch

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
	$(BIN)/python bench/stability.py
	$(BIN)/python bench/fusion.py
	$(BIN)/python bench/autotune.py
	$(BIN)/python bench/hosts.py
	$(BIN)/python bench/torch_training.py
	$(BIN)/python bench/tf_training.py
	$(BIN)/python bench/keras_training.py
	$(BIN)/python bench/elastic_recovery.py
	$(BIN)/python bench/spark_overhead.py
	$(BIN)/python bench/estimator.py
	$(BIN)/python bench/ray_overhead.py
	$(MAKE) legacy-env
	$(LEGACY)/bin/python bench/spark_overhead.py --skip-startup

clean:
	rm -rf build $(VENV) core/_native*.so *.egg-info docs/_build docs/api
