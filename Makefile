# The two commands of the README: `make run` and `make test`. Both install what they need.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export PYSPARK_PYTHON := $(abspath $(PY))

.PHONY: run test check bench bench-quick lint system-deps browser deploy-tools neuroglancer venv clean lambda-package

run: system-deps venv neuroglancer
	$(VENV)/bin/ndstore up --demo

# The suite runs in TEST_WORKERS processes, a test file to each (most of its time is spent waiting
# on the servers it starts); the schema fuzzer runs apart, in one process: under pytest-xdist
# schemathesis collects its operations as one test each that runs no case.
TEST_WORKERS ?= 2
FUZZ_SCHEMA := tests/fuzz/test_openapi_fuzz.py

test: system-deps browser deploy-tools venv neuroglancer
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --ignore=$(FUZZ_SCHEMA)
	$(VENV)/bin/pytest -q $(FUZZ_SCHEMA)

# The fast lane, while working (and the pre-commit hook): the linters, the type checks, and the
# tests that need no whole stack: pure units, every storage port's contract suite on each of its
# implementations (tests/contracts/: real redis-servers, moto, SQLite, files, in-memory fakes)
# and what each adapter promises beyond its port (tests/storage/).
check: system-deps venv
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) -m "not servers" tests/unit tests/contracts
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) -m "not servers" -k "memory or local or levels" tests/engine

bench: system-deps venv
	$(PY) -m benchmarks.bench_direct
	$(PY) -m benchmarks.bench_cache
	$(PY) -m benchmarks.bench_blaze
	$(PY) -m benchmarks.bench_ingest
	$(PY) -m benchmarks.bench_downsample
	$(PY) -m benchmarks.bench_viewer
	$(PY) -m benchmarks.bench_load
	$(PY) -m benchmarks.bench_reliability
	$(PY) -m benchmarks.bench_memory
	$(PY) -m benchmarks.bench_label_index
	$(PY) -m benchmarks.bench_segmentation
	$(PY) -m benchmarks.bench_views
	$(PY) -m benchmarks.summary

bench-quick: system-deps venv
	$(PY) -m benchmarks.bench_direct --quick
	$(PY) -m benchmarks.bench_cache --quick
	$(PY) -m benchmarks.bench_blaze --quick
	$(PY) -m benchmarks.bench_ingest --quick
	$(PY) -m benchmarks.bench_downsample --quick
	$(PY) -m benchmarks.bench_viewer --quick
	$(PY) -m benchmarks.bench_reliability --quick
	$(PY) -m benchmarks.bench_label_index --quick
	$(PY) -m benchmarks.bench_segmentation --quick
	$(PY) -m benchmarks.bench_memory --quick
	$(PY) -m benchmarks.bench_views --quick
	$(PY) -m benchmarks.summary

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# redis-server, a JRE (for pyspark) and nginx with its stream module (the web service's front;
# the stream module counts connections per address) come from apt when the machine lacks them.
# A policy-rc.d keeps apt from starting nginx as a service (it would listen on
# 0.0.0.0:80); one already there is left alone.
system-deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	if command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then \
		{ $$(command -v nginx || echo /usr/sbin/nginx) -V 2>&1 | grep -q -- '--with-stream=dynamic' && [ ! -e /usr/lib/nginx/modules/ngx_stream_module.so ]; } \
			&& missing="$$missing libnginx-mod-stream"; \
	else missing="$$missing nginx-light libnginx-mod-stream"; fi; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		guard=""; [ -e /usr/sbin/policy-rc.d ] || { guard=1; printf '#!/bin/sh\nexit 101\n' | $(SUDO) tee /usr/sbin/policy-rc.d >/dev/null; $(SUDO) chmod +x /usr/sbin/policy-rc.d; }; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
		status=$$?; [ -z "$$guard" ] || $(SUDO) rm -f /usr/sbin/policy-rc.d; exit $$status; \
	fi

# Debian's Chromium, for the headless end-to-end test of the landing page and Neuroglancer.
browser:
	@command -v chromium >/dev/null || { echo "installing: chromium"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
		--no-install-recommends chromium; }

# For tests/deploy/test_static.py: docker-compose validates docker-compose.yml (`config` needs no
# engine); nginx (from system-deps) checks deploy/nginx.conf (`nginx -t`).
deploy-tools: system-deps
	@command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || { \
		echo "installing: docker-compose"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
		--no-install-recommends docker-compose; }

# Neuroglancer's static build in .neuroglancer/, served at /neuroglancer/ (built from npm with
# Vite once; installs nodejs/npm from apt when missing). See deploy/neuroglancer/.
neuroglancer:
	bash deploy/neuroglancer/install.sh

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt requirements-dev-nodeps.txt pyproject.toml
	[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -r requirements-dev-nodeps.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .neuroglancer

# AWS SAM builds each function of deploy/aws/ingest.yaml with `make build-<LogicalId>` here
# (BuildMethod: makefile) into $(ARTIFACTS_DIR): lambdas/requirements.txt as wheels for Lambda's
# Python and CPU, and the code the handlers reach (lambdas/, ndstore/ and blaze/ without the web
# app and its image encoders, the CLI and the Spark jobs). SegmentsFunction installs
# lambdas/requirements-segments.txt (the mesh and skeleton builders too): past Lambda's 250 MB for
# a zip, it is a container image whose Dockerfile (deploy/aws/segments.Dockerfile) runs its target.
# `make lambda-package [LAMBDA_PACKAGE=<LogicalId>]` builds one into build/lambda/.
LAMBDA_FUNCTIONS := TileUploadedFunction SupercuboidFunction CleanupFunction DownsampleFunction SegmentsFunction
LAMBDA_REQUIREMENTS = lambdas/requirements.txt
build-SegmentsFunction: LAMBDA_REQUIREMENTS = lambdas/requirements-segments.txt
LAMBDA_PACKAGE ?= SupercuboidFunction
LAMBDA_PYTHON ?= 3.12
# Lambda's python3.12 runs on Amazon Linux 2023 (glibc 2.34, x86_64): wheels of any manylinux up to 2.34
LAMBDA_PLATFORMS ?= manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux2014_x86_64
LAMBDA_PIP ?= python3 -m pip
LAMBDA_EXCLUDES := --exclude=__pycache__ --exclude=ndstore/api --exclude=ndstore/client --exclude=ndstore/ops \
	--exclude=ndstore/testing \
	--exclude=ndstore/cli.py \
	--exclude='ndstore/engine/spark*' --exclude=ndstore/core/slices.py --exclude=ndstore/core/precomputed.py \
	--exclude=ndstore/core/sharded.py --exclude=ndstore/core/zarr_view.py \
	--exclude='blaze/spark*' --exclude=blaze/daemon.py --exclude=lambdas/runner.py --exclude=lambdas/requirements.txt \
	--exclude=lambdas/requirements-segments.txt
.PHONY: $(addprefix build-,$(LAMBDA_FUNCTIONS))
$(addprefix build-,$(LAMBDA_FUNCTIONS)):
	@test -n "$(ARTIFACTS_DIR)" || { echo "ARTIFACTS_DIR must name the output folder (sam build sets it)"; exit 2; }
	$(LAMBDA_PIP) install --quiet --target "$(ARTIFACTS_DIR)" $(addprefix --platform ,$(LAMBDA_PLATFORMS)) \
		--python-version $(LAMBDA_PYTHON) --implementation cp --only-binary=:all: -r $(LAMBDA_REQUIREMENTS)
	tar -c $(LAMBDA_EXCLUDES) lambdas ndstore blaze | tar -x -C "$(ARTIFACTS_DIR)"

lambda-package: venv
	rm -rf build/lambda
	$(MAKE) build-$(LAMBDA_PACKAGE) ARTIFACTS_DIR=$(abspath build/lambda) LAMBDA_PIP="$(PY) -m pip"
	@du -sm build/lambda | awk '{print "build/lambda: " $$1 " MB unzipped (Lambda allows 250 for a zip)"}'
