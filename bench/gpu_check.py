"""`make gpu-check`: easyrl's actor half on one accelerator at world size 1, measured beside `easyrl simulate` and the
pre-flight estimate (issue #36). No vLLM, no Ray: `FSDPPolicy` and what it calls, on the 3B geo3k recipe
(config.yaml + Qwen2.5-VL-3B-Instruct from easyrl/model_configs, random weights, one image per prompt at the
largest size a prompt holds, the recipe's token budgets).

Why the 3B: at world size 1 the 7B's fp32 weights, gradients and AdamW states take 124 GiB (the estimate); offloaded,
they, the offloaded reference (15 GiB) and rank 0's fp32 checkpoint read (31 GiB) would need ~170 GiB of host memory
(the accelerator machine has 128 GiB), while the 3B's update fits an 80 GB card as configured (estimate 66.0 GiB:
`easyrl simulate --estimate-only config=config.yaml worker.actor.model.model_path=Qwen/Qwen2.5-VL-3B-Instruct
trainer.n_gpus_per_node=1`). Its rollout phase does not fit beside vLLM's claim at world size 1, so the CLI stops
before simulating: the simulation runs here by calling `easyrl.simulate.phases.simulate` (the CLI's own function) in
a CPU-only subprocess, in parallel.

What it measures (one table printed, all of it in <out>/gpu_check.json, rewritten after each section):
- per phase (`torch.cuda.max_memory_allocated` / `max_memory_reserved`, cache emptied before each): load actor, load
  reference, old log-probs and reference forwards, weight-sync gather, checkpoint state dict, export gather, the
  update (its second step: AdamW states resident, two micro-batches), beside the simulated peak and the estimate;
- the update's tokens/s and MFU (bf16 peak of the card by its name: easyrl/sizing/devices.py);
- packed (padding-free) vs padded log-probs in bf16 on the same weights (tolerance PARITY_TOL nats, max |diff|);
- the fused head (`easyrl.models.fused_head`) vs a plain head (matmul + `log_probs_from_logits`) on HEAD_TOKENS
  tokens x the model's vocabulary (values, time, peak), and the weight-gradient GEMM as written (fp32 `addmm_`) vs
  in bf16 (review S3-A);
- a DCP save + load round trip of the actor's model and AdamW shards (`easyrl.workers.checkpoint`; every tensor's
  fingerprint equal after the shards were zeroed and loaded back);
- the parameter-offload path (`worker.actor.offload.offload_params=true`: FSDP2's CPUOffloadPolicy, pinned host
  shards, AdamW on the host): one update's device peak beside its estimate.

It passes (prints "ok", exits 0) when no section raised, the packed and padded log-probs agree within PARITY_TOL, the
fused head within HEAD_TOL, the DCP round trip restores every tensor, and (on CUDA) every simulated phase's allocated
peak is within MEMORY_TOL + MEMORY_SLACK_GIB of the simulation's (:func:`memory_verdict`); the MFU is printed, not
gated.

On the accelerator machine (its python3 has torch 2.11, transformers 5.17, peft, numpy, pyarrow, jinja2,
safetensors, tqdm, pillow, pyyaml; nothing can be downloaded there), one call of the device tool, after
`make gpu-wheels` here (about 4 MiB):

    run(command="set -o pipefail; make gpu-check 2>&1 | tee $OUT/log.txt", carry=[".cache/gpu-wheels"],
        timeout_s=540)

It should take about 5 minutes on an H100 (an estimate, never run there: random checkpoint ~1 min, the phases ~2,
DCP ~1, offload ~1.5; the simulation runs beside them, ~2 min of one core); a section that fails is recorded
(`errors` in the JSON) and the rest still run. On the CPU, the toy run (tests/test_gpu_check.py, `make test-slow`, gloo, a
tiny Qwen2.5-VL): `python bench/gpu_check.py --device cpu --tiny --out DIR`.

The wheels (WHEELS: what the actor path and the recipe's config loading import beyond that machine's image; all pure
Python but pydantic-core, cp312 manylinux x86_64), downloaded here by `make gpu-wheels`:

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .cache/gpu-wheels omegaconf==2.4.0 tensordict==0.15.3 ...   (every WHEELS entry as name==version)

and installed there by `make gpu-check`: `pip install --no-index --no-deps --target /tmp/easyrl-gpu-site`.
tensordict 0.15.3 is pure Python (no torch-bound binary) and needs torch >= 2.11, the line compat/vllm-0.23 tests
it with; omegaconf 2.4 needs only PyYAML.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
WHEELS = {  # name: (version, bytes of its wheel: tests/test_gpu_check.py adds them to the working tree's size)
    "omegaconf": ("2.4.0", 254152), "tensordict": ("0.15.3", 852373), "pyvers": ("0.2.3", 11757),
    "pydantic": ("2.14.3", 494071), "pydantic-core": ("2.50.4", 2261727), "annotated-types": ("0.8.0", 13427),
    "typing-inspection": ("0.4.5", 14874), "typing-extensions": ("4.16.0", 45571)}
"""The wheels carried to the accelerator machine (typing-extensions: pydantic 2.14 needs >= 4.16)."""
DEVICE_IMAGE = ("torch", "torchvision", "transformers", "peft", "accelerate", "numpy", "pyarrow", "jinja2",
                "safetensors", "tqdm", "pillow", "pyyaml", "psutil", "cloudpickle", "packaging", "sympy")
"""What easyrl's actor path takes from the accelerator machine's image (/work/.library/device/KINDS.md lists it)."""
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
MODEL = "Qwen/Qwen2.5-VL-3B-Instruct"
RECIPE = ["config=config.yaml", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.logger=[console]"]
TINY = ["data.max_prompt_length=256", "data.max_response_length=32", "data.min_pixels=3136",
        "data.max_pixels=50176", "worker.actor.micro_batch_size_per_device_for_experience=2",
        "worker.actor.micro_batch_size_per_device_for_update=1"]
"""--tiny: the suite's tiny Qwen2.5-VL (easyrl.testing.tiny) on short rows with a small image, on the CPU."""
PARITY_TOL = 0.05
"""nats: packed vs padded bf16 log-probs, max |diff| (the bf16 reference copy's tolerance in tests/gpu)."""
HEAD_TOL = 0.02
"""nats: fused vs plain head on the same bf16 inputs, max |diff| (the same bf16 logits, summed in another order)."""
MEMORY_TOL = 0.10
"""Share by which a phase's measured allocated peak may differ from ``easyrl simulate``'s (issue #48)."""
MEMORY_SLACK_GIB = 0.25
"""GiB allowed beyond ``MEMORY_TOL`` (the caching allocator's rounding: blocks of 2 MiB and up, per stream)."""
PARITY_ROWS = 4
HEAD_TOKENS = {False: 8192, True: 64}
GIB = 2**30


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny Qwen2.5-VL on short rows (the suite's run)")
    parser.add_argument("--out", default="runs/gpu_check", help="folder of gpu_check.json and the simulation's log")
    parser.add_argument("--scratch", default=None, help="where a temporary folder holds the random checkpoint and the "
                        "DCP round trip (default: /dev/shm or the system's temporary folder, whichever has more room)")
    parser.add_argument("--skip", default="", help="comma-separated sections to leave out: parity,head,dcp,offload")
    parser.add_argument("--download-wheels", metavar="DIR", help="only download WHEELS into DIR (here, not there)")
    parser.add_argument("--simulate", metavar="JSON", help=argparse.SUPPRESS)  # the simulation subprocess
    parser.add_argument("--config-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.download_wheels:
        return subprocess.call(download_command(args.download_wheels))
    if args.simulate:
        return simulate_phases(args)
    return GpuCheck(args).run()


def download_command(folder: str) -> list[str]:
    """The pip command that downloads :data:`WHEELS` for the accelerator machine (cp312, manylinux x86_64)."""
    platforms = [word for p in WHEEL_PLATFORMS for word in ("--platform", p)]
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", *platforms, "-d", folder, *(f"{n}=={v}" for n, (v, _) in WHEELS.items())]


def recipe_config(model_path: str, tiny: bool, device: str, *extra: str):
    """The recipe's finalized config at world size 1 (``load_config``: config.yaml, then these overrides)."""
    from easyrl.config import load_config

    words = RECIPE + [f"worker.actor.model.model_path={model_path}", f"trainer.device={device}"]
    with contextlib.chdir(REPO):  # config.yaml's relative paths
        return load_config(words + (TINY if tiny else []) + list(extra))


def config_dir(tiny: bool, scratch: Path) -> str:
    """A folder holding the model's config.json: the shipped 3B's, or the tiny Qwen2.5-VL's written to ``scratch``."""
    if not tiny:
        return str(REPO / "easyrl" / "model_configs" / MODEL.split("/")[-1])
    from easyrl.testing.tiny import tiny_config

    folder = scratch / "tiny_config"
    tiny_config("qwen2_5_vl").save_pretrained(folder)
    return str(folder)


def write_random_checkpoint(source: str, out: Path, device: str) -> None:
    """The model of ``source``'s config.json with transformers' random initialisation (made on ``device``), saved in
    bf16 as a Hugging Face folder: what ``FSDPPolicy`` reads in place of the released weights."""
    import torch
    from transformers import AutoConfig

    from easyrl.models.hf_folder import hf_model_class

    hf_config = AutoConfig.from_pretrained(source)
    torch.manual_seed(0)
    with torch.device(device):
        model = hf_model_class(hf_config).from_config(hf_config, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(out)
    del model


def simulate_phases(args) -> int:
    """The subprocess: ``easyrl.simulate.phases.simulate`` on the same config (no accelerator visible), its phases
    written to ``args.simulate`` as JSON."""
    from easyrl.simulate.phases import simulate
    from easyrl.sizing.devices import DEVICES

    config = recipe_config(args.config_dir, args.tiny, "cuda")
    sim = simulate(config, DEVICES["h100"], log=lambda line: print(line, flush=True))
    Path(args.simulate).write_text(json.dumps([vars(p) for p in sim.phases]))
    return 0


class GpuCheck:
    """One run: the sections in order, each recorded in ``self.result`` (an exception is kept under ``errors``)."""

    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.kind = args.device
        self.result: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"), "tiny": args.tiny, "phases": [], "errors": {}}
        self.skip = set(filter(None, args.skip.split(",")))
        self.sim: Optional[subprocess.Popen] = None

    # --- bookkeeping ---------------------------------------------------------------------------------------------
    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.result, indent=2, default=str))

    def step(self, name: str, run: Callable[[], Any]) -> None:
        """One section: ``run()``, its seconds, and the exception it raised (the next sections still run); the JSON
        is rewritten after it."""
        if name in self.skip:
            self.result["errors"][name] = "skipped (--skip)"
            return
        began = time.perf_counter()
        try:
            run()
        except Exception:
            self.result["errors"][name] = traceback.format_exc()
            print(f"gpu-check: {name} failed:\n{self.result['errors'][name]}", file=sys.stderr, flush=True)
        self.result.setdefault("section_seconds", {})[name] = round(time.perf_counter() - began, 1)
        self.save()

    def measure(self, name: str, run: Callable[[], Any], **extra: Any) -> Any:
        """``run()`` as one phase: the device's allocated and reserved peaks (GiB, cache emptied first) and seconds."""
        import torch

        from easyrl.device import empty_cache

        gc.collect()
        empty_cache(self.kind)
        cuda = self.kind == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        began = time.perf_counter()
        value = run()
        if cuda:
            torch.cuda.synchronize()
        row = {"name": name, "seconds": round(time.perf_counter() - began, 2),
               "allocated_gib": torch.cuda.max_memory_allocated() / GIB if cuda else None,
               "reserved_gib": torch.cuda.max_memory_reserved() / GIB if cuda else None, **extra}
        self.result["phases"].append(row)
        print(f"gpu-check: {name}: {row['seconds']} s, peak {row['allocated_gib']} GiB", flush=True)
        return value

    # --- the run -------------------------------------------------------------------------------------------------
    def run(self) -> int:
        import torch

        scratch = Path(tempfile.mkdtemp(prefix="easyrl-gpu-check-", dir=self.args.scratch or scratch_root()))
        try:
            self.step("setup", lambda: self.setup(scratch))
            if "setup" not in self.result["errors"]:
                self.step("phases", self.phases)
                self.step("parity", self.parity)
                self.step("head", self.head)
                self.step("dcp", lambda: self.dcp(scratch / "dcp"))
                self.step("offload", self.offload)
            return self.finish()
        finally:
            if self.sim is not None and self.sim.poll() is None:
                self.sim.kill()
            shutil.rmtree(scratch, ignore_errors=True)
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()

    def setup(self, scratch: Path) -> None:
        import torch
        import torch.distributed as dist
        import transformers
        from torch.distributed.device_mesh import init_device_mesh
        from transformers import AutoConfig

        from easyrl.device import collective_backend, set_device, torch_device
        from easyrl.simulate.phases import model_folder, vision_grid
        from easyrl.sizing.devices import DEVICES, SIMULATED
        from easyrl.sizing.estimate import estimate_run

        kind = self.kind
        set_device(kind)
        self.device = torch_device(kind)
        name = torch.cuda.get_device_name() if kind == "cuda" else "cpu"
        spec = next((DEVICES[s] for s in SIMULATED if DEVICES[s].marker.lower() in name.lower()), DEVICES["h100"])
        self.result.update(device=name, backend=collective_backend(kind), capacity_gib=spec.memory_gib,
                           versions={"python": sys.version.split()[0], "torch": torch.__version__,
                                     "transformers": transformers.__version__, "cuda": torch.version.cuda})
        source = config_dir(self.args.tiny, scratch)
        self.sim = self.start_simulation(source)
        self.hf_config = AutoConfig.from_pretrained(source)
        self.config = recipe_config(source, self.args.tiny, kind)
        self.estimate = estimate_run(self.config, spec.memory_gib, model_folder)
        self.result["estimate"] = {"training": self.estimate.training, "experience": self.estimate.experience,
                                   "host": self.estimate.host}
        began = time.perf_counter()
        self.model_path = scratch / "model"
        write_random_checkpoint(source, self.model_path, self.device.type)
        self.result["random_checkpoint_seconds"] = round(time.perf_counter() - began, 1)
        dist.init_process_group(collective_backend(kind), init_method=f"file://{scratch / 'store'}", rank=0,
                                world_size=1, device_id=self.device if kind == "cuda" else None)
        self.mesh = init_device_mesh(kind, (1,), mesh_dim_names=("dp",))
        self.grid = vision_grid(self.config, source)
        self.result["model"] = {"config": source, "image_grid_thw": self.grid and self.grid.grid_thw,
                                "dtype": self.config.worker.actor.fsdp.param_dtype}

    def start_simulation(self, source: str) -> subprocess.Popen:
        """``simulate_phases`` in a subprocess with no accelerator visible (as on the CPU where it is built)."""
        command = [sys.executable, *(["-S"] if sys.flags.no_site else []), __file__, "--simulate",
                   str(self.out / "simulated.json"), "--config-dir", source, *(["--tiny"] if self.args.tiny else [])]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        return subprocess.Popen(command, env=env, stdout=open(self.out / "simulate.log", "w"),
                                stderr=subprocess.STDOUT)

    def batch(self, tokens: int, seed: int):
        """Full-length rows up to ``tokens`` with one image per prompt (``easyrl.simulate.phases.budget_batch``, the
        simulation's batch), random pixels and advantages."""
        import torch

        from easyrl.simulate.phases import budget_batch

        torch.manual_seed(seed)
        batch = budget_batch(self.config, tokens, self.grid)
        for inputs in batch.extras.get("multi_modal_inputs", []):
            inputs["pixel_values"].normal_()
        batch["advantages"] = torch.randn(batch["response_mask"].shape)
        return batch

    def padded_rows(self, rows: int):
        """The experience batch's first ``rows`` rows with left-padded prompts and right-padded responses of
        different lengths (the image kept whole): what the two layouts must agree on."""
        sub = self.experience.select(list(range(min(rows, len(self.experience)))))
        prompt, response = self.config.data.max_prompt_length, self.config.data.max_response_length
        image_start = (prompt - self.grid.tokens - 2) // 2 if self.grid is not None else prompt // 2
        for i in range(len(sub)):
            left, right = i * (image_start - 1) // len(sub), i * response // (2 * len(sub))
            sub["input_ids"][i, :left] = 0
            sub["attention_mask"][i, :left] = 0
            if right:
                sub["input_ids"][i, prompt + response - right:] = 0
                sub["attention_mask"][i, prompt + response - right:] = 0
                sub["response_mask"][i, response - right:] = 0
        return sub

    def phases(self) -> None:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from easyrl.sizing.anatomy import model_anatomy
        from easyrl.sizing.devices import peak_flops
        from easyrl.sizing.flops import compute_mfu_metrics
        from easyrl.workers import fsdp_model
        from easyrl.workers.policy import FSDPPolicy
        from easyrl.workers.weight_sync import iter_full_weights

        cfg, config, est = self.config.worker, self.config, self.estimate
        path, kind, device = str(self.model_path), self.kind, self.device
        experience = {name: sum(items.values()) - items.get("actor Adam states", 0.0)  # AdamW states come later
                      for name, items in est.experience.items()}
        self.actor = self.measure("load actor", lambda: FSDPPolicy(path, cfg.actor, self.mesh, kind, device,
                                                                    trainable=True, offload=cfg.actor.offload))
        self.result["attention"] = self.actor.model.config._attn_implementation
        self.ref = self.measure("load reference", lambda: FSDPPolicy(path, cfg.actor, self.mesh, kind, device,
                                                                      trainable=False, offload=cfg.ref.offload,
                                                                      init_from=self.actor))
        micro = cfg.actor.micro_batch_size_per_device_for_experience
        self.experience = self.batch(config.token_budget(micro), seed=1)
        temp = cfg.actor.temperature
        name = "old log-probs (forward)"
        self.packed = self.measure(name, lambda: self.actor.compute_log_probs(self.experience, micro, temp),
                                   estimate_gib=experience.get(name))
        name = "reference forward"
        self.ref_lp = self.measure(name, lambda: self.ref.compute_log_probs(self.experience, micro, temp),
                                   estimate_gib=experience.get(name))
        dtype = fsdp_model.TORCH_DTYPES[cfg.rollout.dtype]
        bucket = cfg.rollout.update_weights_bucket_megabytes * 2**20
        self.measure("weight sync gather", lambda: [None for _ in iter_full_weights(
            self.actor.model.state_dict(), device, dtype, bucket)])
        self.measure("checkpoint state dict", lambda: get_state_dict(self.actor.model, self.actor.optimizer))
        self.measure("export gather", lambda: len(fsdp_model.gather_full_state_dict(self.actor.model)))
        update_micro = cfg.actor.micro_batch_size_per_device_for_update
        update = self.batch(2 * config.token_budget(update_micro), seed=2)  # two micro-batches, as simulated
        update["old_log_probs"] = update["ref_log_probs"] = self.actor.compute_log_probs(update, micro, temp)
        self.measure("actor update (first step)", lambda: self.actor.update_policy(update, len(update), update_micro))
        name = "actor update (fwd+bwd+AdamW)"
        self.measure(name, lambda: self.actor.update_policy(update, len(update), update_micro),
                     estimate_gib=est.training_gib)
        seconds = self.result["phases"][-1]["seconds"]
        peak = peak_flops(self.result["device"]) if kind == "cuda" else None
        shape = model_anatomy(self.hf_config)[2]
        mfu = compute_mfu_metrics(shape, update["attention_mask"], update.extras.get("multi_modal_inputs", []),
                                  {"update_actor": seconds}, 1, peak, cfg.actor.ppo_epochs).get("perf/mfu/actor")
        tokens = int(update["attention_mask"].sum())
        self.result["update"] = {"samples": len(update), "tokens": tokens, "seconds": seconds,
                                 "tokens_per_s": tokens / seconds, "mfu": mfu, "peak_tflops": peak and peak / 1e12}

    def parity(self) -> None:
        """Packed (the actor's forward) vs padded (a frozen bf16 copy with ``padding_free=false``) log-probs."""
        import copy

        from easyrl.workers.policy import FSDPPolicy

        cfg = self.config.worker
        padded_cfg = copy.copy(cfg.actor)
        padded_cfg.padding_free = False
        padded = FSDPPolicy(str(self.model_path), padded_cfg, self.mesh, self.kind, self.device, trainable=False,
                            offload=cfg.ref.offload, init_from=self.actor)
        subset = self.padded_rows(PARITY_ROWS)
        temp = cfg.actor.temperature
        packed = self.actor.compute_log_probs(subset, len(subset), temp)
        lp = self.measure(f"log-probs padded ({len(subset)} rows)",
                          lambda: padded.compute_log_probs(subset, len(subset), temp))
        diff = (lp - packed).abs()[subset["response_mask"].bool()]
        self.result["parity"] = {"rows": len(subset), "tokens": int(diff.numel()), "max_abs": diff.max().item(),
                                 "mean_abs": diff.mean().item(), "tolerance": PARITY_TOL,
                                 "ok": diff.max().item() <= PARITY_TOL,
                                 "reference_vs_actor_max_abs": (self.ref_lp - self.packed).abs().max().item(),
                                 "mean_log_prob": packed[subset["response_mask"].bool()].mean().item()}

    def head(self) -> None:
        """Fused vs plain head (values, seconds, peak) and the weight-gradient GEMM in fp32 vs bf16 (S3-A)."""
        import torch

        from easyrl.algorithms.token_ops import log_probs_from_logits
        from easyrl.models.fused_head import DEFAULT_CHUNK_TOKENS, linear_log_probs
        from easyrl.sizing.anatomy import model_shape, vocab_size

        dev, cuda = self.device, self.kind == "cuda"
        hidden_size, vocab = model_shape(self.hf_config).hidden_size, vocab_size(self.hf_config)
        tokens = HEAD_TOKENS[self.args.tiny]
        gen = torch.Generator(device=dev).manual_seed(0)
        h = torch.randn(tokens, hidden_size, device=dev, generator=gen).to(torch.bfloat16)
        w = (torch.randn(vocab, hidden_size, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
        labels = torch.randint(0, vocab, (tokens,), device=dev, generator=gen)

        def fused():
            hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
            lp, _ = linear_log_probs(hh, ww, labels, entropy_grad=False)
            lp.sum().backward()
            return lp.detach()

        def plain():
            hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
            lp = log_probs_from_logits(hh @ ww.t(), labels)
            lp.sum().backward()
            return lp.detach()

        chunk, grad = DEFAULT_CHUNK_TOKENS, torch.randn(min(DEFAULT_CHUNK_TOKENS, tokens), vocab, device=dev,
                                                        generator=gen).to(torch.bfloat16)
        acc = torch.zeros(vocab, hidden_size, device=dev)

        def dw_fp32():  # fused_head's backward as written
            for s in range(0, tokens, chunk):
                acc.addmm_(grad.t().float(), h[s:s + chunk].float())

        def dw_bf16():  # in the compute dtype (cuBLAS accumulates in fp32)
            for s in range(0, tokens, chunk):
                acc.add_(grad.t() @ h[s:s + chunk])

        report: dict[str, Any] = {"tokens": tokens, "vocab": vocab, "hidden": hidden_size, "chunk": chunk}
        values = {}
        for name, fn in (("fused", fused), ("plain", plain), ("dw_fp32", dw_fp32), ("dw_bf16", dw_bf16)):
            values[name] = fn()  # warm-up (and the values)
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(1 if self.args.tiny else 3):
                began = time.perf_counter()
                fn()
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - began)
            report[f"{name}_seconds"] = sorted(times)[len(times) // 2]
            report[f"{name}_peak_gib"] = torch.cuda.max_memory_allocated() / GIB if cuda else None
        flops = 2.0 * vocab * hidden_size * tokens
        report |= {f"{n}_tflops": flops / report[f"{n}_seconds"] / 1e12 for n in ("dw_fp32", "dw_bf16")}
        diff = (values["fused"] - values["plain"]).abs()
        report |= {"max_abs": diff.max().item(), "tolerance": HEAD_TOL, "ok": diff.max().item() <= HEAD_TOL}
        self.result["head"] = report

    def dcp(self, folder: Path) -> None:
        """``save_role``, every model and AdamW shard zeroed, ``load_role``: each tensor's fingerprint as before."""
        import torch

        from easyrl.workers.checkpoint import load_role, save_role

        tensors = self.state_tensors()
        need, free = sum(t.numel() * t.element_size() for t in tensors.values()), shutil.disk_usage(folder.parent).free
        if need * 1.05 > free:
            raise RuntimeError(f"the round trip needs ~{need / GIB:.1f} GiB in {folder.parent}, {free / GIB:.1f} free: "
                               "give --scratch a folder with room")
        before = self.fingerprints()
        began = time.perf_counter()
        save_role(self.actor, str(folder), 0)
        saved = time.perf_counter() - began
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        with torch.no_grad():
            for tensor in self.state_tensors().values():
                tensor.zero_()
        zeroed = self.fingerprints()
        began = time.perf_counter()
        load_role(self.actor, str(folder), 0)
        loaded = time.perf_counter() - began
        after = self.fingerprints()
        shutil.rmtree(folder)
        differ = sorted(k for k in before if before[k] != after.get(k))
        nonzero = sum(value != (0, 0.0) for value in before.values())
        changed = sum(before[k] != zeroed[k] for k in before)  # all: the zeroing reached the live shards
        self.result["dcp"] = {"folder": str(folder.parent), "gib": size / GIB, "save_seconds": saved,
                              "load_seconds": loaded, "tensors": len(before), "differ": differ[:10],
                              "nonzero_tensors": nonzero, "zeroing_changed": changed,
                              "ok": not differ and before.keys() == after.keys() and changed == nonzero > 0}

    def state_tensors(self) -> dict[str, Any]:
        """The local shards of the actor's model and optimizer state dicts (``get_state_dict``, as checkpoints)."""
        import torch
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.tensor import DTensor

        found = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, torch.Tensor):
                found[prefix] = value.to_local() if isinstance(value, DTensor) else value
            elif isinstance(value, dict):
                for key, item in value.items():
                    walk(f"{prefix}/{key}", item)
            elif isinstance(value, (list, tuple)):
                for index, item in enumerate(value):
                    walk(f"{prefix}/{index}", item)

        model, optim = get_state_dict(self.actor.model, self.actor.optimizer)
        walk("model", model)
        walk("optim", optim)
        return found

    def fingerprints(self) -> dict[str, tuple[int, float]]:
        """Per tensor: the int64 sum of its bits and the float64 sum of its squares."""
        import torch

        ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
        return {k: (int(t.detach().reshape(-1).view(ints[t.element_size()]).sum(dtype=torch.int64)),
                    float(t.detach().double().square().sum())) for k, t in self.state_tensors().items()}

    def offload(self) -> None:
        """A fresh actor with ``offload_params``: one update (its second step) beside the estimate for that config."""
        import psutil

        from easyrl.simulate.phases import model_folder
        from easyrl.sizing.estimate import estimate_run
        from easyrl.workers.policy import FSDPPolicy

        for name in ("actor", "ref"):
            self.__dict__.pop(name, None)
        config = recipe_config(str(self.model_path), self.args.tiny, self.kind,
                               "worker.actor.offload.offload_params=true")
        estimate = estimate_run(config, self.result["capacity_gib"], model_folder)
        cfg = config.worker.actor
        actor = self.measure("load actor (offload_params)", lambda: FSDPPolicy(
            str(self.model_path), cfg, self.mesh, self.kind, self.device, trainable=True, offload=cfg.offload))
        shard = next(actor.model.parameters()).to_local()
        micro = cfg.micro_batch_size_per_device_for_update
        update = self.batch(2 * config.token_budget(micro), seed=3)
        update["old_log_probs"] = update["ref_log_probs"] = actor.compute_log_probs(
            update, cfg.micro_batch_size_per_device_for_experience, cfg.temperature)
        actor.update_policy(update, len(update), micro)
        self.measure("actor update (offload_params)", lambda: actor.update_policy(update, len(update), micro),
                     estimate_gib=estimate.training_gib)
        self.result["offload"] = {"params_on": str(shard.device), "pinned": shard.is_pinned(),
                                  "host_estimate_gib": sum(estimate.host.values()),
                                  "host_rss_gib": psutil.Process().memory_info().rss / GIB}

    def finish(self) -> int:
        """Wait for the simulation (at most 3 more minutes), fill its column, print the table, write the JSON."""
        sim = self.sim
        if sim is not None:
            try:
                sim.wait(timeout=180)
            except subprocess.TimeoutExpired:
                sim.kill()
                self.result["errors"]["simulation"] = "did not finish within 3 minutes after the run (simulate.log)"
            simulated = self.out / "simulated.json"
            if simulated.is_file():
                peaks = {p["name"]: p["peak_gib"] for p in json.loads(simulated.read_text())}
                for row in self.result["phases"]:
                    row["simulated_gib"] = peaks.get(row["name"])
            elif "simulation" not in self.result["errors"]:
                self.result["errors"]["simulation"] = f"exit status {sim.returncode} (simulate.log)"
        memory = memory_verdict(self.result["phases"])
        if memory is not None:
            self.result["memory"] = memory
        gates = ("parity", "head", "dcp") + (("memory",) if self.kind == "cuda" else ())  # the CPU has no device peak
        self.result["ok"] = not self.result["errors"] and all(self.result.get(k, {}).get("ok") for k in gates)
        self.save()
        print(table(self.result), flush=True)
        return 0 if self.result["ok"] else 1


def memory_verdict(phases: list[dict[str, Any]], tolerance: float = MEMORY_TOL,
                   slack_gib: float = MEMORY_SLACK_GIB) -> Optional[dict[str, Any]]:
    """The memory gate: every phase with both a measured allocated peak (``allocated_gib``) and a simulated one
    (``simulated_gib``) must be within ``tolerance`` of the simulated peak plus ``slack_gib``. Returns ``compared``
    (phases), ``worst`` (the phase farthest off), ``worst_share`` (its ``measured / simulated - 1``), ``tolerance``
    and ``ok``; None when no phase has both (the CPU: no device peak)."""
    rows = [row for row in phases if row.get("allocated_gib") is not None and row.get("simulated_gib")]
    if not rows:
        return None
    worst = max(rows, key=lambda row: abs(row["allocated_gib"] - row["simulated_gib"]) / row["simulated_gib"])
    ok = all(abs(row["allocated_gib"] - row["simulated_gib"]) <= tolerance * row["simulated_gib"] + slack_gib
             for row in rows)
    return {"compared": len(rows), "worst": worst["name"], "worst_share": worst["allocated_gib"] /
            worst["simulated_gib"] - 1, "tolerance": tolerance, "slack_gib": slack_gib, "ok": ok}


def scratch_root() -> str:
    """/dev/shm or the system's temporary folder, whichever has more room (the 3B's random checkpoint and DCP round
    trip take ~50 GiB)."""
    roots = [r for r in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(r)]
    return max(roots, key=lambda r: shutil.disk_usage(r).free)


SUMMARY = {  # one line per section below the phases (its values in the JSON under the same key)
    "memory": "memory: {compared} phases' allocated peaks within {tolerance:.0%} (+ {slack_gib} GiB) of the simulated "
              "ones, farthest {worst} ({worst_share:+.1%}): {verdict}",
    "update": "update: {tokens} tokens ({samples} samples) in {seconds:.2f} s: {tokens_per_s:.0f} tokens/s, MFU "
              "{mfu_text}",
    "parity": "log-probs packed vs padded (bf16, {tokens} tokens): max |diff| {max_abs:.4f}, mean {mean_abs:.5f} "
              "nats (tolerance {tolerance}): {verdict}",
    "head": "head, {tokens} tokens x {vocab}: fused vs plain max |diff| {max_abs:.4f} ({verdict}); fwd+bwd fused "
            "{fused_seconds:.3f} s, plain {plain_seconds:.3f} s; dW GEMM fp32 {dw_fp32_seconds:.3f} s "
            "({dw_fp32_tflops:.1f} TFLOP/s) vs bf16 {dw_bf16_seconds:.3f} s ({dw_bf16_tflops:.1f} TFLOP/s)",
    "dcp": "DCP round trip: {gib:.1f} GiB ({tensors} tensors) saved in {save_seconds:.1f} s, loaded in "
           "{load_seconds:.1f} s: {verdict} (differing: {differ})",
    "offload": "offload_params: shards on {params_on} (pinned {pinned}), host RSS {host_rss_gib:.1f} GiB (estimate "
               "{host_estimate_gib:.1f} GiB of offloaded states)"}


def table(result: dict[str, Any]) -> str:
    """The printed summary of ``result`` (GiB per device)."""
    def num(value: Any, fmt: str = "7.1f") -> str:
        return format(value, fmt) if isinstance(value, (int, float)) else f"{'-':>{fmt.split('.')[0]}}"

    versions = result.get("versions", {})
    lines = [f"easyrl gpu-check: {result.get('device')} ({result.get('backend')}), torch {versions.get('torch')}, "
             f"transformers {versions.get('transformers')}, attention {result.get('attention')}, "
             f"{'tiny' if result['tiny'] else MODEL} (random weights), world size 1, {result['date']}", "",
             f"{'phase':34} {'alloc':>7} {'reserved':>8} {'simulated':>9} {'estimate':>8} {'seconds':>7}"]
    for row in result["phases"]:
        lines.append(f"{row['name']:34} {num(row['allocated_gib'])} {num(row['reserved_gib'], '8.1f')} "
                     f"{num(row.get('simulated_gib'), '9.1f')} {num(row.get('estimate_gib'), '8.1f')} "
                     f"{num(row['seconds'], '7.1f')}")
    lines.append("")
    for key, text in SUMMARY.items():
        if key in result:
            values = result[key]
            mfu = values.get("mfu")
            lines.append(text.format(**values, verdict="ok" if values.get("ok", True) else "FAILED",
                                     mfu_text=f"{mfu:.1%} of {values['peak_tflops']:.0f} TFLOP/s" if mfu else "-"))
    for name, error in result["errors"].items():
        lines.append(f"ERROR in {name}: {error.strip().splitlines()[-1]}")
    lines += ["", "ok" if result.get("ok") else "NOT OK (see errors and checks above)"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
