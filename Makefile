# Tributary — set-up, tests and the demo. Every target works alone on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
APT_PACKAGES = postgresql-15 postgresql-contrib redis-server openjdk-17-jdk-headless chromium fonts-dejavu-core
PYTEST_ARGS ?=
# The distribution's top-level packages (spark_streaming/shipping.py's PACKAGES).
PROJECT_PACKAGES = cdc connectors event_store examples infra projections spark_streaming tributary views
# The suite runs in two processes (pytest-xdist), each with its own local stack; every test that
# starts Spark runs in one of them, one after another (tests/scheduling.py).
TEST_WORKERS ?= 2
# Spark drivers map their classes from this archive (spark_streaming/class_archive.py): each
# starts about 5 s sooner. Written once per venv (about a minute), again when pyspark changes.
SPARK_ARCHIVE = $(VENV)/share/tributary/spark-classes.jsa
# The CDC part's Debezium JVM likewise (cdc/class_archive.py): less CPU at each start.
CDC_ARCHIVE = $(VENV)/share/tributary/cdc-classes.jsa

.PHONY: setup setup-steps test-setup bytecode test-bytecode cdc-classes system-packages test unit integration lint demo bench chaos takeover clean \
	podman-setup podman-stop images test-containers test-byo

# The steps two at a time (a fresh machine: apt beside the Python environment, then the Spark
# archive beside the CDC one and the CDC classes), each step's output kept together.
setup:
	@$(MAKE) --no-print-directory -j2 --output-sync=target setup-steps

setup-steps: system-packages $(VENV)/.installed $(SPARK_ARCHIVE) $(CDC_ARCHIVE) cdc-classes bytecode

# The same, and the test modules as pytest rewrites them, beside the archives.
test-setup:
	@$(MAKE) --no-print-directory -j2 --output-sync=target setup-steps test-bytecode

# The project's own modules compiled to bytecode (only what changed since: about a second when
# nothing did). Where PYTHONDONTWRITEBYTECODE is set (this machine class sets it) Python never
# caches them, and every process the suite and the demo start (CLI calls, `tributary run` parts,
# the Python processes Spark starts) compiled them again: 0.12-0.15 CPU-s each. Python reads
# these caches whatever that variable says.
bytecode: $(VENV)/.installed
	@$(BIN)/python -m compileall -q -j0 $(PROJECT_PACKAGES) tests bench

# The test modules and conftests as pytest's assertion rewriting makes them, cached beside
# them (`__pycache__/*-pytest-*.pyc`; pytest checks each against its source's hash). pytest writes
# that cache only where PYTHONDONTWRITEBYTECODE is unset, and reads it either way: without it
# each worker of `make test` rewrote every test module it collected (`pytest --collect-only
# tests`: 24 CPU-s without the cache, 11 with it).
# Again only when a test module changed.
TEST_SOURCES := $(shell find tests -name '*.py' -not -path '*/__pycache__/*' 2>/dev/null)
test-bytecode: $(VENV)/.test-bytecode
$(VENV)/.test-bytecode: $(VENV)/.installed pyproject.toml $(TEST_SOURCES) | bytecode
	@if PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider tests > /dev/null; \
	then touch $@; \
	else echo "warning: the test modules were not collected; pytest rewrites them again in each worker"; fi

# The CDC part's Java producer (cdc/java), compiled once per source into the venv (a few seconds;
# nothing when up to date). The first connector would otherwise compile it.
cdc-classes: $(VENV)/.installed | system-packages
	@$(BIN)/python -c "from cdc.jvm_publisher import compiled_classes; print('cdc classes:', compiled_classes())"

# Debian packages, installed only when missing (idempotent).
system-packages:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@# Debian starts a system redis and postgres on their default ports; Tributary uses its own.

# The packages go in with uv, compiled to bytecode as pip does (without it every process the
# suite starts compiles pyspark, pandas and pyarrow again: the suite took 1.5x as long); pip
# does it where uv cannot be had. pip's find-links (PIP_FIND_LINKS) are passed on to uv.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -m pip install -q uv 2>/dev/null && \
	  $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python \
	    $(foreach l,$(PIP_FIND_LINKS),--find-links $(l)) -e ".[dev]"; then \
	  echo "installed with uv"; \
	else \
	  echo "uv failed: installing with pip"; \
	  $(BIN)/python -m pip install -q --upgrade pip && $(BIN)/python -m pip install -q -e ".[dev]"; \
	fi
	touch $@

$(SPARK_ARCHIVE): $(VENV)/.installed | system-packages
	TRIBUTARY_SPARK_JAVA_OPTIONS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" $(BIN)/tributary spark-archive --force || echo "warning: no Spark class archive; drivers start without it"

$(CDC_ARCHIVE): $(VENV)/.installed cdc/java/engine.classlist | system-packages
	$(BIN)/tributary cdc-archive --force || echo "warning: no CDC class archive; connectors start without it"

# The take-over test (kill -9 of the command processor, then of the views process, under load;
# then a user forgotten on the same world) runs in `make test`; `make takeover` runs it alone,
# with its output.
TAKEOVER_TEST = tests/integration/social/test_takeover.py

test: test-setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist load $(PYTEST_ARGS)

takeover: setup
	$(BIN)/python -m pytest -p no:xdist -s $(TAKEOVER_TEST) $(PYTEST_ARGS)

unit: test-setup
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: test-setup
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

demo: setup
	$(BIN)/tributary demo

# Not part of the tests: each prints its figures as ratios to a baseline measured in the same run.
bench: setup
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	@# the scripts (the other modules are what they share)
	@for b in $$(grep -l '__name__ == "__main__"' bench/*.py); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Not part of the tests: kill -9 of every part under load, N trials each (tests/chaos).
# e.g. make chaos CHAOS_ARGS="--trials 2 --parts broker,views"
CHAOS_ARGS ?=
chaos: setup
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

# Containers (docs/containers.md): none of these is needed by `make test`, which runs processes.
# Podman here (its API service, its settings, the variables testcontainers reads; idempotent);
# with Docker (a laptop) nothing needs setting up.
podman-setup:
	infra/containers/podman-setup.sh

podman-stop:
	infra/containers/podman-setup.sh stop

# The stack's images, built with podman or Docker; an image whose inputs did not change is kept.
images: $(VENV)/.installed
	PYTHON=$(BIN)/python infra/containers/build

# The integration tests marked for containers mode, against the services as containers.
CONTAINERS_TESTS = -m "containers or containers_subset" tests/integration
test-containers: setup
	@docker info >/dev/null 2>&1 || infra/containers/podman-setup.sh
	PYTHON=$(BIN)/python infra/containers/build
	$(BIN)/python -m pip install -q -e ".[dev,containers]"
	TRIBUTARY_TEST_STACK=containers $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist load \
	  $(CONTAINERS_TESTS) $(PYTEST_ARGS)

# The integration suite on a Kafka and PostgreSQL it did not start ("bring your own",
# docs/settings.md): a second stack of only those two in $(BYO_HOME) on its own ports
# (tests/brought_stack.py), the suite pointed at them through TRIBUTARY_TEST_* only, then a check
# that the sessions left nothing there, and the second stack stopped. Not part of `make test`.
BYO_HOME ?= $(CURDIR)/.byo
test-byo: setup
	$(BIN)/python -m tests.brought_stack up $(BYO_HOME)
	@rc=0; . $(BYO_HOME)/env; \
	TRIBUTARY_TEST_BROUGHT_LOG=$(BYO_HOME)/sessions.log $(BIN)/python -m pytest \
	  -n $(TEST_WORKERS) --dist load tests/integration $(PYTEST_ARGS) || rc=$$?; \
	cat $(BYO_HOME)/sessions.log 2>/dev/null; \
	$(BIN)/python -m tests.brought_stack check $(BYO_HOME) || { [ $$rc -ne 0 ] || rc=1; }; \
	$(BIN)/python -m tests.brought_stack down $(BYO_HOME); exit $$rc

clean:
	-$(BIN)/tributary down --purge
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
