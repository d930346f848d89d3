# easyr1 developer commands. `make demo` and `make test` install what they need first.
PYTHON ?= .venv/bin/python
export OMP_NUM_THREADS ?= 1

.PHONY: install install-gpu demo demo-agent test test-fast quality style clean

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

# The whole suite, then tests/gpu again on the CPU with Ray and vLLM unimportable (as on the GPU test machines).
test: install
	$(PYTHON) -m pytest tests -q --durations=25
	EASYR1_GPU_TESTS_ON_CPU=1 $(PYTHON) -m pytest tests/gpu -q -p no:cacheprovider

# The tests that start no Ray, no vLLM engine and no training run (markers: pyproject.toml); a few minutes.
test-fast: install
	EASYR1_TEST_TIER=fast $(PYTHON) -m pytest tests -q -m "not ray and not vllm and not e2e"

quality: install
	$(PYTHON) -m ruff check easyr1 tests scripts bench reward_function
	$(PYTHON) -m ruff format --check easyr1 tests scripts bench reward_function

style: install
	$(PYTHON) -m ruff check --fix easyr1 tests scripts bench reward_function
	$(PYTHON) -m ruff format easyr1 tests scripts bench reward_function

clean:
	rm -rf .cache checkpoints .pytest_cache .ruff_cache
