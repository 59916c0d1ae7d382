# syntax=docker/dockerfile:1
#
# easyrl for NVIDIA GPUs: the locked environment (uv.lock) with the extras `gpu` (vLLM), `wandb` and `dev` (pytest).
#
#   docker build --platform linux/amd64 -t easyrl:gpu .
#   docker run --gpus all --ipc=host -it -e WANDB_API_KEY -v $HOME/.cache/huggingface:/root/.cache/huggingface \
#       easyrl:gpu bash examples/qwen2_5_vl_7b_geo3k_grpo.sh
#
# Notes
# * uv.lock covers linux/x86_64 only (pyproject.toml: [tool.uv] environments), so build for linux/amd64; on another
#   platform `uv sync --locked` refuses to install. Re-locking for another platform is `uv lock` after editing
#   `environments` in pyproject.toml.
# * The locked torch 2.13.0 and vLLM wheels bring their own CUDA 13 runtime, cuDNN and NCCL as Python packages; the
#   base image only supplies the compilers that Triton and vLLM's JIT kernels call at run time (gcc, nvcc). The host
#   needs an NVIDIA driver recent enough for CUDA 13 (580 or newer).
# * `--locked` installs exactly the versions in uv.lock and fails if pyproject.toml and uv.lock disagree (run `uv lock`
#   and commit the result). Ray's shared-memory object store wants a large /dev/shm: run with --ipc=host or --shm-size.
#
# Ascend NPUs (Atlas 800 A2/A3, aarch64 hosts): this file does not apply. Start from the vllm-ascend image, which
# already holds CANN, torch_npu, vLLM and vllm-ascend for the NPU, and install easyrl into its Python without the lock:
#
#   FROM quay.io/ascend/vllm-ascend:<version>     # a release whose vLLM supports the models you train
#   RUN pip install uv
#   WORKDIR /workspace/easyrl
#   COPY pyproject.toml README.md config.yaml ./
#   COPY easyrl ./easyrl
#   COPY examples ./examples
#   RUN uv pip install --system -e ".[npu,wandb]"  # torch-npu and vllm-ascend are already satisfied by the image
#
# then check with `pip list` that the image's torch / torch-npu / vllm were not replaced, and run
# `bash examples/qwen2_5_vl_7b_geo3k_grpo_npu.sh` (trainer.device=npu).

ARG BASE_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu22.04
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    UV_PYTHON=3.11 \
    UV_PYTHON_INSTALL_DIR=/opt/uv-python \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential ca-certificates git \
    && rm -rf /var/lib/apt/lists/*

# uv: the version that wrote uv.lock (older releases may not read a newer lock)
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /uvx /usr/local/bin/

WORKDIR /workspace/easyrl

# 1) the dependencies alone, so that editing easyrl's code does not reinstall them (uv fetches Python 3.11 itself)
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --locked --extra gpu --extra wandb --extra dev --no-install-project

# 2) the project (the files a run needs; a .venv or runs/ folder of the build context is not copied)
COPY easyrl ./easyrl
COPY examples ./examples
COPY docs ./docs
COPY tests ./tests
COPY config.yaml ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --locked --extra gpu --extra wandb --extra dev

ENV PATH=/workspace/easyrl/.venv/bin:${PATH}

CMD ["python3", "-m", "easyrl.trainer", "config=config.yaml"]
