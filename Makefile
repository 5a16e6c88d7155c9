# loadwatch: `make demo` runs the main job on a bundled default, `make test` runs every check.
PYTHON ?= python3
BIN := .venv/bin
PYTEST_ARGS ?=
# Test processes (pytest-xdist; tests/conftest.py hands each a whole module, the real-vLLM files
# to one of them first). Two compute; the last of three takes the files marked `waits` first (a
# demo played in real time, a soak, real Prometheus scrapes: minutes of waiting, seconds of CPU),
# so no computing process stands idle while they wait; the two computing ones run niced, so the
# waiting one's tests are woken on time. TEST_WORKERS=0 runs every test in this process, one
# after another.
TEST_WORKERS ?= 3

.PHONY: venv tools vllm lint test test-fast demo bench fuzz soak clean

venv:
	@PYTHON=$(PYTHON) ./scripts/ensure-venv.sh

tools:
	@./scripts/ensure-tools.sh

vllm:
	@./scripts/ensure-vllm.sh

lint: venv
	$(BIN)/ruff check daemon parsers exporters tests bench
	$(BIN)/ruff format --check -q daemon parsers exporters tests bench
	$(BIN)/mypy daemon parsers exporters

# Everything: lint, unit and property tests, real Prometheus/promtool/mtail, real vLLM on the CPU.
test: venv tools vllm lint
	$(BIN)/pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The quick loop: no real vLLM, no real Prometheus, no soak.
test-fast: venv lint
	$(BIN)/pytest -n $(TEST_WORKERS) -m "not slow and not realvllm and not prometheus" $(PYTEST_ARGS)

# The long runs of what `make test` runs bounded: the fuzzers for FUZZ_S seconds (atheris, when
# installed) and their hypothesis examples; the vLLM start/crash soak for SOAK_S seconds.
FUZZ_S ?= 600
SOAK_S ?= 600

fuzz: venv
	LOADWATCH_FUZZ_S=$(FUZZ_S) LOADWATCH_FUZZ_EXAMPLES=20000 \
		$(BIN)/pytest tests/reliability/test_fuzz.py -s -p no:cacheprovider --timeout=0 $(PYTEST_ARGS)

soak: venv
	LOADWATCH_SOAK_S=$(SOAK_S) \
		$(BIN)/pytest tests/reliability/test_soak.py -s -p no:cacheprovider --timeout=0 $(PYTEST_ARGS)

# Every benchmark, each printing figures measured side by side in one run (several minutes;
# QUICK=1 for a smoke run of the ones that take --quick).
BENCH_QUICK := $(if $(QUICK),--quick,)
bench: venv
	@./scripts/ensure-tools.sh
	$(BIN)/python bench/throughput_vs_mtail.py $(BENCH_QUICK)
	$(BIN)/python bench/load_breakdown.py $(if $(QUICK),--lines 20000,)
	$(BIN)/python bench/scaling.py $(BENCH_QUICK)
	$(BIN)/python bench/daemon_bench.py $(BENCH_QUICK)
	$(BIN)/python bench/daemon_catchup.py $(BENCH_QUICK)
	$(BIN)/python bench/follower_bench.py $(BENCH_QUICK)
	$(BIN)/python bench/state_fold.py
	$(BIN)/python bench/capture.py
	$(BIN)/python bench/gpu_poll.py
	$(BIN)/python bench/forecast_eval.py
	$(BIN)/python bench/systemd_security.py
	$(BIN)/python bench/adversarial.py

clean:
	rm -rf .venv .venv-run build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The main job on an embedded default: a simulated Kimi-K2.5 load, supervised, two starts (the
# second one with the ETA to ready the first taught), about two minutes.
# DEMO_ARGS="--scenario oom" (success, stall, oom, crash-loop, fp8-kv-on-sm120), "--real" for vLLM.
# The demo runs from the runtime install alone (.venv-run: no test tools), as an operator's would.
demo:
	@VENV=.venv-run EXTRAS= PYTHON=$(PYTHON) ./scripts/ensure-venv.sh
	.venv-run/bin/loadwatch demo $(DEMO_ARGS)
