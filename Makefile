# The two commands of the README: `make demo` and `make test`. Both do all set-up on a fresh machine (uv, .venv).
UV := $(shell command -v uv 2>/dev/null || echo "python3 -m uv")
PY := .venv/bin/python
TINY := .cache/tiny_models/qwen2_5_vl
# the dashboards' libraries: the logger tests write real wandb/SwanLab/MLflow files (offline)
LOGGER_EXTRAS := --extra wandb --extra swanlab --extra mlflow

.PHONY: setup demo demo-learn test test-fast test-gpu
setup:
	@command -v uv >/dev/null 2>&1 || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	$(UV) sync --locked --extra cpu --extra dev --extra bench $(LOGGER_EXTRAS)

# GRPO on the ten bundled Geometry3K problems with a tiny Qwen2.5-VL, 2 CPU workers, 2 steps (~4 minutes).
demo: setup
	$(PY) -m easyrl.testing.tiny qwen2_5_vl --output $(TINY)
	$(PY) -m easyrl.trainer config=examples/configs/cpu_demo.yaml worker.actor.model.model_path=$(TINY) $(ARGS)

# GRPO that visibly learns: SmolLM2-135M-Instruct on single-digit addition, 1 CPU worker x 2 threads, validation on
# held-out prompts before, during and after; ends with runs/easyrl/smollm2_learn/learning.png (~12 minutes on 2 cores).
demo-learn: setup
	$(PY) -m easyrl.trainer config=examples/configs/smollm2_learn.yaml \
		worker.actor.model.model_path=$$($(PY) -m easyrl.testing.smollm2) $(ARGS)
	$(PY) bench/plots.py runs/easyrl/smollm2_learn/metrics.jsonl --labels easyrl \
		--title "make demo-learn: GRPO on SmolLM2-135M-Instruct, single-digit addition"

# The whole suite: unit tests plus the real end-to-end runs (Ray + vLLM + FSDP2 on the CPU).
test: setup
	$(PY) -m pytest -q -m "not slow"

# Unit tests only (seconds to a minute).
test-fast: setup
	$(PY) -m pytest -q -m "not e2e and not slow"

# `easyrl simulate` on every recipe in examples/ (minutes each on 2 cores: docs/simulate.md).
test-slow: setup
	$(PY) -m pytest -q -m slow

# On a machine with a CUDA GPU: 1-GPU smoke tests of the actor path (no vLLM/Ray needed) and, where vLLM (CUDA build)
# and Ray are installed (`uv sync --extra gpu --extra dev`), 2 GRPO steps with sleep mode on.
test-gpu:
	$(PY) -m pytest -q -m gpu tests/gpu
