# Two commands do all set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install model kernels serve generate test test-fast lint format bench clean system-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

model: install
	$(BIN)/python -c "from surge.models.formats.resolve import resolve_model; print(resolve_model('smollm2-135m'))"

generate: model
	$(BIN)/surge generate

serve: model
	$(BIN)/surge serve $(ARGS)

# The compiled CPU kernels, all at once (otherwise built one by one on first use).
kernels: install
	$(BIN)/python -m surge.models.kernels
	SURGE_KERNEL_TIER=avx2 $(BIN)/python -m surge.models.kernels  # for test_kernel_tiers.py

# System packages the tests drive (Debian), installed only when missing: Prometheus and promtool
# (deploy/prometheus rules, the Grafana dashboard's queries against a real Prometheus), chromium
# (the dashboard page's browser test), tmux (surge top's terminal test),
# libnss-wrapper (the gateway's DNS discovery test resolves names from a hosts file of its own).
system-deps:
	@missing=""; \
	command -v promtool >/dev/null && command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v tmux >/dev/null || missing="$$missing tmux"; \
	test -e /usr/lib/x86_64-linux-gnu/libnss_wrapper.so || missing="$$missing libnss-wrapper"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" != 0 ]; then \
		echo "not root: not installing$$missing (the tests that drive them skip, saying why)"; \
	elif [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# In-process tests on a worker per core first (they start no server: nothing of theirs races a
# clock), then the tests that start processes, one at a time (their bounds are wall-clock ones).
test: system-deps model kernels
	$(BIN)/python -m pytest -q -n $(or $(TEST_WORKERS),2) --durations=10 -m "not extra and not long and not process"
	$(BIN)/python -m pytest -q --durations=15 -m "process and not extra and not long" \
		--ignore=tests/models/test_kernel_tiers.py  # make test-kernel-tiers runs those

# The long ones (accuracy sweeps on the real model, torch.compile checks, the soak, kill -9 under
# load): each half a minute or more. CI runs them after `make test`.
.PHONY: test-long
test-long: system-deps model kernels
	$(BIN)/python -m pytest -q --durations=10 -m "long and not extra"

# The kernel tests again on kernels built for each lower instruction-set tier (cpu_features.h):
# AVX-512 without VNNI, AVX2, plain loops (each tier's build is cached after its first run).
.PHONY: test-kernel-tiers
test-kernel-tiers: install model kernels
	SURGE_KERNEL_TIER=avx512 $(BIN)/python -m surge.models.kernels
	SURGE_KERNEL_TIER=scalar $(BIN)/python -m surge.models.kernels
	$(BIN)/python -m pytest -q tests/models/test_kernel_tiers.py  # all of it: make test leaves it here

# In-process tests only: no real SmolLM2, no second model, no server/gateway/autoscaler or other
# child process (the `process` marker, set by tests/process_marker.py), on one worker per core.
test-fast: install
	$(BIN)/python -m pytest -q -n $(or $(TEST_WORKERS),2) -m "not slow and not extra and not process"

lint: install
	$(BIN)/ruff check surge tests benchmarks
	$(BIN)/ruff format --check surge tests benchmarks
	$(BIN)/mypy surge

format: install
	$(BIN)/ruff format surge tests benchmarks
	$(BIN)/ruff check --fix surge tests benchmarks

# The docs site (mkdocs-material) into site/; --strict: a broken link or anchor fails it.
.PHONY: docs
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
