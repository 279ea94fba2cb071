# make demo : create .venv, install (CPU torch pinned), and run autotune on a bundled tiny model
# make test : run the test suite (what CI runs), the client tier included (tests/README.md: the tiers and their cost)
# make test-fast : the edit-run loop: no Ray, no DeepSpeed, no real probe, no client tier
# make test-clients : only the client tier (LLaMA-Factory, Axolotl in venvs of their own, cached)
# make test-gpu-rehearsal : the GPU benchmark scripts end to end on the CPU (before a GPU session)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch 2.13.0 lies on this machine's disk; an unpinned torch pulls a CUDA build.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast test-clients test-gpu-rehearsal clients lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,deepspeed,trl]" "$(TORCH_SPEC)"
	$(PY) tests/_build_ops.py 2>&1 | grep '^build-ops:'
	touch $@

demo: setup
	$(VENV)/bin/autotune run --model tiny-llama --device cpu --gpu-budget 3GB --seq-len 256 \
		--effective-batch 16 --space cpu --max-trials 12 --out results

# Two phases. 1: every test that shares the machine well, on 2 pytest-xdist workers (the tests that share a
# module fixture or the two-rank probes stay on one worker: tests/conftest.py; the missing client venvs start
# building meanwhile). 2: alone, what measures time or speed (marked serial), then the client tier.
# Both phases always run; make fails if either failed (exit 5, no test selected, is not a failure).
test: setup
	@status=0; \
	AUTOTUNE_CLIENTS_BUILD_EARLY=1 TORCH_SPEC="$(TORCH_SPEC)" $(PY) -m pytest -q -n 2 --dist loadgroup --durations=25 \
		-m "not serial and not clients and not gpu_rehearsal" $(PYTEST_ARGS) || [ $$? -eq 5 ] || status=1; \
	TORCH_SPEC="$(TORCH_SPEC)" $(PY) -m pytest -q --durations=25 \
		-m "(serial or clients) and not gpu_rehearsal" $(PYTEST_ARGS) || [ $$? -eq 5 ] || status=1; \
	exit $$status

test-fast: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow and not ray and not clients and not serial and not gpu_rehearsal" \
		$(PYTEST_ARGS)

# one venv per client, pinned, next to $(TORCH_SPEC); cached in ~/.cache/autotune-clients (AUTOTUNE_CLIENTS_CACHE)
clients: setup
	TORCH_SPEC="$(TORCH_SPEC)" $(PY) tests/_clients.py build llamafactory axolotl

test-clients: setup
	TORCH_SPEC="$(TORCH_SPEC)" $(PY) -m pytest -q -m clients tests/test_clients.py $(PYTEST_ARGS)

test-gpu-rehearsal: setup
	$(PY) -m pytest -q -m gpu_rehearsal $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check autotune tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
