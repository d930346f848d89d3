# easyr1 on NVIDIA GPUs: the CUDA 13 wheels of pyproject.toml's `gpu` extra (vllm 0.32.0, torch 2.13.0) on Python 3.12.
#   docker build -t easyr1:latest .
#   docker run --gpus all --ipc=host -v "$PWD/checkpoints:/opt/easyr1/checkpoints" easyr1:latest \
#       python -m easyr1.main config=examples/config.yaml ...
# docs/gpu.md has the details: mounts, Apptainer, several nodes.
# The devel image brings nvcc, which flashinfer and Triton need to compile kernels on first use.
ARG BASE_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PYTHONUNBUFFERED=1 \
    VENV=/opt/easyr1/.venv
WORKDIR /opt/easyr1

# What the install reads, then the install itself (scripts/check_image_chroot.sh runs the same script on CPU).
COPY pyproject.toml README.md ./
COPY scripts/ scripts/
COPY easyr1/ easyr1/
RUN bash scripts/image_setup.sh gpu

# The rest of the project: recipes, prompts, reward functions, tests, docs.
COPY . .
ENV PATH=/opt/easyr1/.venv/bin:$PATH

# No fixed entrypoint: a container runs `python -m easyr1.main config=... key=value ...` on the head node and
# `ray start ...` on the others (docs/gpu.md).
CMD ["bash"]
