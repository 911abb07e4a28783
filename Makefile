# agentq: every target installs what it needs on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The demo needs the runtime and moto only, not CDK, cfn-lint or mypy (≈1 GB less).
DEMO_STAMP := $(VENV)/.installed-demo
CDK_STAMP := node_modules/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install lint format docs test test-cpu test-fast demo bench synth deploy clean browser image-lock console-screenshots

$(STAMP): requirements.txt requirements-local.txt requirements-cdk.txt requirements-dev.txt requirements-lambdas.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): requirements.txt requirements-local.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-local.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(DEMO_STAMP)

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

# The docs' generated parts: the settings table and the map of the code.
docs: $(STAMP)
	$(PY) -m agentq.config.doc
	$(PY) -m tools.package_map

# Debian's chromium (and its driver) for the console's browser tests and screenshots;
# apt-get runs only when it is missing. Playwright drives it: never `playwright install`.
browser:
	@test -x /usr/bin/chromium || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# docs/console.md's pictures, taken again from the real console in chromium: a local
# stack runs the demo's job and a few more, then each page is drawn and captured.
console-screenshots: $(STAMP) browser
	$(PY) -m bench.console --screenshots docs/images

# The whole suite: lint, types, unit, functional (moto), integration (local stack), infra (CDK),
# on TEST_WORKERS processes (most tests wait on workers, leases and moto, not on the CPU),
# with the slowest tests listed at the end. The processes start together: the bytecode they
# all read (agentq's, and pytest's rewritten test modules) is written for them first
# (tools/warm_caches.py). mypy checks the types beside the tests (its minute on a fresh
# clone is otherwise added to the suite's); its report is printed when it fails, and
# either failing fails the target.
# tmux draws `agentq watch` for the tests that read its screen (CI runs as root).
TEST_WORKERS ?= 8
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist worksteal
# The tests start about a thousand Python processes (workers, children, CLIs, Lambdas):
# with bytecode caching off (a shell may set PYTHONDONTWRITEBYTECODE), each compiles
# agentq anew, about 0.4 s of CPU a process, which doubled the suite's CPU time.
test test-fast: export PYTHONDONTWRITEBYTECODE :=
test: $(STAMP) browser $(CDK_STAMP)
	@command -v tmux >/dev/null || { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; }
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m tools.warm_caches
	@echo "mypy runs beside the tests (its report: $(VENV)/mypy.log)"
	@$(VENV)/bin/mypy > $(VENV)/mypy.log 2>&1 & types=$$!; \
	$(PY) -m pytest $(PYTEST_PARALLEL) --durations=30; tests=$$?; \
	if ! wait $$types; then cat $(VENV)/mypy.log; echo "mypy failed"; exit 1; fi; \
	exit $$tests

# Where the suite's CPU goes: the suite as `make test` runs it, each test charged with its
# own CPU and its reaped children's (tools/suite_cpu.py), then the costliest directories
# and files. It rewrites tests/module_durations.json, the wall times by which the long
# modules start the test processes' shares (tools/suite_order.py): commit it when it moved.
test-cpu: export PYTHONDONTWRITEBYTECODE :=
test-cpu: $(STAMP) browser $(CDK_STAMP)
	@command -v tmux >/dev/null || { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; }
	rm -f $(VENV)/test-cpu.jsonl
	$(PY) -m tools.warm_caches
	$(PY) -m pytest $(PYTEST_PARALLEL) -p tools.suite_cpu --cpu-profile $(VENV)/test-cpu.jsonl; \
	tests=$$?; $(PY) -m tools.suite_cpu $(VENV)/test-cpu.jsonl --durations tests/module_durations.json; \
	exit $$tests

# Unit and stack tests only (tests/conftest.py marks each test's kind): no process, no e2e.
test-fast: $(STAMP)
	$(PY) -m tools.warm_caches
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "unit or stack"

# Offline (the local model server) unless DEMO_REAL_CLAUDE=1: then the real Anthropic
# API with ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN, which costs money.
demo: $(DEMO_STAMP)
	$(PY) -m agentq.demo $(if $(filter 1 yes true,$(DEMO_REAL_CLAUDE)),--real-claude) $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) -m bench

# Alarm subscribers: ALARM_EMAILS="a@x b@y", ALARM_SLACK="WORKSPACE_ID/CHANNEL_ID". prod
# refuses to synthesize without one; `make synth` checks it with an example address.
ALARM_EMAILS ?=
ALARM_SLACK ?=
ALARM_CONTEXT = $(if $(strip $(ALARM_EMAILS)),-c alarm_emails="$(strip $(ALARM_EMAILS))") \
	$(if $(strip $(ALARM_SLACK)),-c alarm_slack="$(strip $(ALARM_SLACK))")

# Templates, cdk-nag, cfn-lint, then the deploy rehearsal (infra/rehearsal.py): the rules
# CloudFormation and ECS enforce at deploy time that cfn-lint does not check.
synth: $(STAMP) $(CDK_STAMP)
	npx cdk synth --quiet -c stage=dev $(ALARM_CONTEXT) --output cdk.out/dev
	npx cdk synth --quiet -c stage=prod -c alarm_emails="$(or $(strip $(ALARM_EMAILS)),alarms@example.com)" --output cdk.out/prod
	$(VENV)/bin/cfn-lint cdk.out/dev/*.template.json cdk.out/prod/*.template.json
	$(PY) -m infra.rehearsal --unsubscribed-alarms report cdk.out/dev
	$(PY) -m infra.rehearsal cdk.out/prod

# One stage, end to end: the stacks (which load the task definitions: the bundled
# samples and DEFINITIONS="dir ...", validated at synth), then the stage's variables.
# Rerunning is an upgrade. `agentq definitions sync` stays for quick updates.
STAGE ?= dev
DEFINITIONS ?=
DEPLOY_CONTEXT = -c stage=$(STAGE) $(ALARM_CONTEXT) \
	$(if $(strip $(DEFINITIONS)),-c definitions="$(strip $(DEFINITIONS))")
# The secrets stack first; infra.secrets_ready stops here (naming the command that sets
# it) until the Anthropic key is no longer the placeholder, so the worker never starts
# on a placeholder and rolls the stage back (docs/deploy.md, "First deploy").
deploy: $(STAMP) $(CDK_STAMP)
	npx cdk deploy agentq-$(STAGE)-secrets $(DEPLOY_CONTEXT)
	$(PY) -m infra.secrets_ready --stage $(STAGE)
	npx cdk deploy --all $(DEPLOY_CONTEXT)
	$(VENV)/bin/agentq env --stage $(STAGE) --output .agentq/$(STAGE).env

# The worker image's hashed lock, from requirements.txt, resolved by uv (in a venv of its
# own) for the image's Python, read from the Dockerfile's FROM line, whatever Python runs
# here; the amd64 and arm64 resolutions must agree. Keeps the lock's header comment.
IMAGE_PYTHON = $(shell sed -n 's/^FROM python:\([0-9]*\.[0-9]*\)-.*/\1/p' Dockerfile)
LOCK_COMPILE = .venv-lock/bin/uv pip compile --quiet --python-version $(IMAGE_PYTHON) \
	--generate-hashes --strip-extras --no-emit-index-url --no-header
image-lock:
	test -n "$(IMAGE_PYTHON)" || { echo "no python:X.Y base in the Dockerfile" >&2; exit 1; }
	test -x .venv-lock/bin/uv || { $(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install -q uv; }
	$(LOCK_COMPILE) --python-platform x86_64-unknown-linux-gnu \
		--output-file requirements-image.lock.new requirements.txt
	$(LOCK_COMPILE) --python-platform aarch64-unknown-linux-gnu --no-annotate \
		--output-file requirements-image.lock.arm64 requirements.txt
	cmp <(grep -v '^ *#' requirements-image.lock.new) requirements-image.lock.arm64 \
		|| { echo "the amd64 and arm64 resolutions differ" >&2; exit 1; }
	{ grep '^# ' requirements-image.lock | sed -n '1,5p'; \
	  echo "# Resolved for Python $(IMAGE_PYTHON) on Linux (amd64 and arm64), the image's base."; \
	  cat requirements-image.lock.new; } > requirements-image.lock.tmp
	mv requirements-image.lock.tmp requirements-image.lock
	rm requirements-image.lock.new requirements-image.lock.arm64

clean:
	rm -rf $(VENV) .venv-lock node_modules cdk.out .mypy_cache .ruff_cache .pytest_cache
