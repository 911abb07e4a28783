# agentq: every target installs what it needs on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CDK_STAMP := node_modules/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install lint format test test-fast demo bench synth clean browser

$(STAMP): requirements.txt requirements-dev.txt requirements-lambdas.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

$(CDK_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(CDK_STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Debian's chromium (and its driver) for the console's browser tests and screenshots;
# apt-get runs only when it is missing. Playwright drives it: never `playwright install`.
browser:
	@test -x /usr/bin/chromium || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# The whole suite: lint, types, unit, functional (moto), integration (local stack), infra (CDK).
test: lint browser $(CDK_STAMP)
	$(PY) -m pytest

test-fast: $(STAMP) browser
	$(PY) -m pytest -m "not slow"

demo: $(STAMP)
	$(PY) -m agentq.demo $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) -m bench

synth: $(STAMP) $(CDK_STAMP)
	npx cdk synth --quiet -c stage=dev --output cdk.out/dev
	npx cdk synth --quiet -c stage=prod --output cdk.out/prod
	$(VENV)/bin/cfn-lint cdk.out/dev/*.template.json cdk.out/prod/*.template.json

clean:
	rm -rf $(VENV) node_modules cdk.out .mypy_cache .ruff_cache .pytest_cache
