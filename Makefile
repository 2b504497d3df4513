# Every target bootstraps .venv from nothing, so a fresh clone needs only python3 and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test test-cgroup check lint bench chaos clean install-user-service uninstall-user-service

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Stamps re-run the install whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/agentsd

# The official ACP TypeScript SDK drives `agentsctl acp` in tests/clients/test_acp.py.
ACP_CLIENT := tests/clients/acp_client
$(ACP_CLIENT)/node_modules/.package-lock.json: $(ACP_CLIENT)/package-lock.json
	npm ci --prefix $(ACP_CLIENT) --no-audit --no-fund --loglevel=error

# The agent CLI releases of the version matrix (tests/peers/agents.py), pinned by
# the lockfile: npm runs their install scripts (Claude Code's links its native
# binary), so never --ignore-scripts.
AGENTS := tests/agents
$(AGENTS)/node_modules/.package-lock.json: $(AGENTS)/package-lock.json
	npm ci --prefix $(AGENTS) --no-audit --no-fund --loglevel=error

test: $(VENV)/.installed-test $(ACP_CLIENT)/node_modules/.package-lock.json $(AGENTS)/node_modules/.package-lock.json
	$(BIN)/pytest

lint: $(VENV)/.installed-test
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# The second pass: the e2e session tests again with every test daemon in cgroup
# mode (tests/cgroup_root.py; needs a writable cgroup v2 directory, by default
# /sys/fs/cgroup/unified, or AGENTSD_TEST_CGROUP_PARENT).
CGROUP_SUBSET := tests/e2e/test_sessions.py tests/e2e/test_security.py tests/e2e/test_cgroup.py tests/e2e/test_agent_callers.py tests/e2e/test_resources.py tests/daemon/test_cgroup.py tests/daemon/test_limits.py
test-cgroup: $(VENV)/.installed-test
	AGENTSD_TEST_CGROUP=1 $(BIN)/pytest $(CGROUP_SUBSET)

check: lint test

bench: $(VENV)/.installed-test
	$(BIN)/python -m tests.bench

# Crash chaos, the long form (CI runs a short seeded one): ROUNDS=200 SEED=1 by default.
ROUNDS ?= 200
SEED ?= 1
chaos: $(VENV)/.installed-test
	$(BIN)/python -m tests.e2e.chaos --rounds $(ROUNDS) --seed $(SEED) --verbose

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis dist build $(ACP_CLIENT)/node_modules $(AGENTS)/node_modules

# The user service. Debian 12's python3 refuses `pip install --user` (PEP 668), so
# agentsd goes into a private virtualenv and its console scripts are linked into
# ~/.local/bin, where agentsd.service's ExecStart=%h/.local/bin/agentsd looks (that
# path is fixed by the unit; the virtualenv follows XDG_DATA_HOME). Recipe variables
# are shell text, so they honour XDG_* as set when make runs. A virtualenv without a
# working pip (python3-venv was missing on Debian, a removed interpreter) is rebuilt.
USER_BIN       = $$HOME/.local/bin
USER_VENV      = $${XDG_DATA_HOME:-$$HOME/.local/share}/agentsd/venv
USER_UNIT_DIR  = $${XDG_CONFIG_HOME:-$$HOME/.config}/systemd/user
USER_STATE_DIR = $${XDG_STATE_HOME:-$$HOME/.local/state}/agentsd
USER_SCRIPTS   = agentsd agentsctl

install-user-service:
	@set -eu; : "$${HOME:?HOME is not set}"; \
	venv="$(USER_VENV)"; bin="$(USER_BIN)"; units="$(USER_UNIT_DIR)"; \
	for exe in $(USER_SCRIPTS); do \
	  if [ -e "$$bin/$$exe" ] && [ ! -L "$$bin/$$exe" ]; then \
	    echo "error: $$bin/$$exe exists and is not a symlink (an earlier pip --user install?); remove it first" >&2; \
	    exit 1; \
	  fi; \
	done; \
	echo "installing agentsd into $$venv"; \
	"$$venv/bin/python" -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear "$$venv"; \
	"$$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade "$(CURDIR)"; \
	mkdir -p "$$bin" "$$units"; \
	for exe in $(USER_SCRIPTS); do ln -sfn "$$venv/bin/$$exe" "$$bin/$$exe"; done; \
	install -m 0644 systemd/agentsd.socket systemd/agentsd.service systemd/agentsd-notify.service "$$units/"; \
	echo "installed agentsd.socket, agentsd.service and agentsd-notify.service in $$units"; \
	echo "desktop notifications: systemctl --user enable --now agentsd-notify.service"; \
	systemctl --user daemon-reload; \
	systemctl --user enable --now agentsd.socket; \
	if systemctl --user --quiet is-active agentsd.service; then \
	  echo "note: the running daemon keeps its old code until 'systemctl --user restart agentsd.service'"; \
	  echo "      (a restart ends the running agents; their sessions resume on the next send)"; \
	fi; \
	user="$${USER:-$$(id -un)}"; \
	if [ "$$(loginctl show-user "$$user" -p Linger 2>/dev/null)" = "Linger=no" ]; then \
	  echo "warning: lingering is off for $$user: systemd stops agentsd, and every agent it runs, when you log out."; \
	  echo "         to keep sessions running after logout: loginctl enable-linger $$user"; \
	fi

uninstall-user-service:
	@set -eu; : "$${HOME:?HOME is not set}"; \
	venv="$(USER_VENV)"; bin="$(USER_BIN)"; units="$(USER_UNIT_DIR)"; \
	if [ -e "$$units/agentsd-notify.service" ]; then \
	  systemctl --user disable --now agentsd-notify.service; \
	  rm -f "$$units/agentsd-notify.service"; \
	  echo "removed agentsd-notify.service from $$units"; \
	fi; \
	if [ -e "$$units/agentsd.socket" ] || [ -e "$$units/agentsd.service" ]; then \
	  systemctl --user disable --now agentsd.socket agentsd.service; \
	  rm -f "$$units/agentsd.socket" "$$units/agentsd.service"; \
	  echo "removed agentsd.socket and agentsd.service from $$units"; \
	fi; \
	systemctl --user daemon-reload; \
	systemctl --user reset-failed agentsd.socket agentsd.service agentsd-notify.service 2>/dev/null || true; \
	for exe in $(USER_SCRIPTS); do \
	  if [ "$$(readlink "$$bin/$$exe" 2>/dev/null)" = "$$venv/bin/$$exe" ]; then rm -f "$$bin/$$exe"; fi; \
	done; \
	rm -rf "$$venv"; \
	rmdir "$$(dirname "$$venv")" 2>/dev/null || true; \
	echo "uninstalled agentsd; its state (sessions and journals) is kept in $(USER_STATE_DIR)"
