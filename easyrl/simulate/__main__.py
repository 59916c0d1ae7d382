"""``python -m easyrl.simulate config=... [key=value ...] [--device h100|h200|a100-40|a100-80|910b] [--json]
[--estimate-only]``: simulate one training step's memory and device placement before renting devices; exits 1 when
the run cannot fit (naming every phase that does not and the settings to change) or a host tensor reaches a device
op or collective."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from easyrl.sizing.devices import DEFAULT_DEVICE, DEVICES, SIMULATED


def main(argv: Optional[list[str]] = None, prog: str = "python -m easyrl.simulate") -> int:
    """Run the simulation; returns the exit status (0 fits, 1 does not fit or a device check failed, 2 usage or a
    user error, printed as one ``easyrl: <kind> error:`` line)."""
    from easyrl.errors import run_cli

    argv = sys.argv[1:] if argv is None else argv
    return run_cli(lambda: _simulate(argv, prog))


def _simulate(argv: list[str], prog: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.replace("``", ""))
    parser.add_argument("--device", choices=SIMULATED, default=None,
                        help="accelerator to simulate (default: from trainer.device: cuda -> h100, npu -> 910b)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--estimate-only", action="store_true", help="only the pre-flight estimate (no simulation)")
    args, overrides = parser.parse_known_args(argv)  # --help exits above: nothing heavy is imported before
    from transformers import AutoConfig

    from easyrl.config import load_config
    from easyrl.errors import ConfigError, ModelError
    from easyrl.models.families import DOCS
    from easyrl.simulate import report
    from easyrl.simulate.fake_device import DeviceCheckError
    from easyrl.simulate.phases import model_folder, simulate
    from easyrl.sizing.anatomy import vision_shape
    from easyrl.sizing.estimate import check_memory, estimate_run

    config = load_config(overrides)
    model = config.worker.actor.model
    hf_config = AutoConfig.from_pretrained(model_folder(model.model_path), trust_remote_code=model.trust_remote_code)
    if getattr(hf_config, "vision_config", None) is not None and vision_shape(hf_config) is None:  # not modelled
        raise ModelError(f"model_type {hf_config.model_type!r}: easyrl simulate models only the patch-grid vision "
                         f"towers of the mRoPE families (Qwen-VL), not this one's; see {DOCS}")
    name = args.device or DEFAULT_DEVICE.get(config.trainer.device, "h100")
    spec = DEVICES[name]
    estimate = estimate_run(config, spec.memory_gib, model_folder)
    problems = {}
    for side in ("trainer", "rollout") if estimate.rollout_devices else ("trainer",):
        try:
            check_memory(estimate, side)
            problems[side] = None
        except ConfigError as exc:  # every phase that does not fit, named (vLLM's weights vs its claim: the rollout's)
            problems[side] = ("rollout phase: " if str(exc).startswith("vLLM") else "") + str(exc)
    sim = None
    if not args.estimate_only and problems["trainer"] is None:  # the simulation runs the trainer's phases
        try:
            sim = simulate(config, spec, log=(lambda _: None) if args.json else print)
        except DeviceCheckError as exc:
            print(f"easyrl: device error: {exc}", file=sys.stderr)
            return 1
    problems["trainer"] = report.verdict(sim, estimate, problems["trainer"])
    if args.json:
        print(json.dumps(report.as_dict(sim, estimate, problems, name, config.world_size), indent=2))
    else:
        print(report.table(sim, estimate, problems, name, config.world_size))
    problem = report.overall(problems)
    return 0 if problem is None else 1


if __name__ == "__main__":
    sys.exit(main())
