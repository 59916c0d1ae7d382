"""The self-check of a model family: the parity checks of ``easyrl.trainer.parity`` on a tiny random twin of a config
(``easyrl.models.twin``), with a verdict that names the failing check, its max gap and what usually causes it.

A ``model_type`` outside the registry (``easyrl.models.families``) runs with the registry's generic entry (default
traits and hooks); a registered one with its entry. :func:`self_check` runs it in this process (it starts and ends a
one-rank gloo group and an in-process vLLM engine); :func:`cached_self_check` returns the cached result, or runs the
check in a child process (``python -m easyrl.trainer.selfcheck``) and caches it, under
``$EASYRL_CACHE/selfcheck/`` keyed by (model_type, transformers, vLLM, config fingerprint): :func:`cache_key`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from easyrl.envvars import cache_dir
from easyrl.trainer.parity import ENGINE_ATOL
from easyrl.trainer.parity import PACKED_ATOL as PACKED
from easyrl.trainer.parity import VLLM_ATOL as VLLM

__all__ = ["Check", "SelfCheck", "CHECKS", "self_check", "cached_self_check", "read_cached", "store", "cache_key",
           "cache_path", "VERSION", "load_config", "admit", "served_architecture", "main"]

logger = logging.getLogger("easyrl")

VERSION = 3  # bump when the twin's rules or the checks change: cached verdicts are then re-run
CHILD_TIMEOUT_S = 600


@dataclass(frozen=True)
class Check:
    """One check of the self-check: its name, bound (nats), the parity stages it covers, the usual causes."""

    name: str
    bound: Optional[float]
    stages: tuple[str, ...]
    hint: str
    above: bool = False
    """The gap must exceed the bound (``stale``: the sync had something to do) instead of stay under it."""
    engine: bool = False
    """A vLLM-against-actor gap: its bound is the engine dtype's (``parity.ENGINE_ATOL``), ``bound`` the fp32 one."""

    def bound_for(self, engine_dtype: str) -> Optional[float]:
        """The bound (nats) with the parity engine in ``engine_dtype`` (``"fp32"``/``"bf16"``)."""
        return ENGINE_ATOL[engine_dtype] if self.engine else self.bound


CHECKS: tuple[Check, ...] = (
    Check("twin", None, ("twin",), "the config cannot be shrunk into a model transformers builds (a width the "
          "twin's rules do not know, a package the model class needs): easyrl.models.twin"),
    Check("packed_vs_padded", PACKED, ("actor",), "positions (the family's positions hook), a window, chunked "
          "attention or a linear-attention/state layer that crosses packed sequences, the fused head's logit scale or "
          "soft-cap (logit_scale hook); an error: a model transformers runs only with its eager attention (no SDPA), "
          "or a head or tower easyrl's hooks do not know"),
    Check("transformers_export", PACKED, ("export",), "the export's names or layout (tied weights, "
          "checkpoint_renames, expert layout), or an easyrl hook (positions, logit scale) transformers' own forward "
          "does not share"),
    Check("vllm_export", VLLM, ("vllm engine", "vllm score"), "vLLM computes the family otherwise: windows, logit "
          "scale or soft-cap, rotary variant (interleaved, partial, per-layer), attention sinks, expert layout "
          "(transposed, per expert), a config field vLLM ignores; or vLLM cannot build it", engine=True),
    Check("actor_beside_engine", None, ("actor again",), "the actor's forward once the engine runs in its process: "
          "vLLM serves the family through its Transformers backend, which patches transformers' classes in the "
          "process (the colocated actor's model no longer runs)"),
    Check("weight_names", None, ("vllm sync",), "a weight the sync did not write: experts vLLM takes "
          "per expert or transposed (per_expert_names, transposed_experts), a renamed module (checkpoint_renames), "
          "tied weights"),
    Check("vllm_synced", VLLM, ("vllm score again",), "the in-place reload: an expert layout or a weight vLLM "
          "repacks on load, tied embeddings", engine=True),
    Check("stale", 10 * VLLM, (), "the sync wrote nothing (the engine kept the exported weights)", above=True),
)


@dataclass
class Row:
    """One check's outcome: ``gap`` its max |log-prob difference| (nats; None where it has none or did not run)."""

    check: str
    passed: Optional[bool]
    """None: not run (an earlier check raised)."""
    gap: Optional[float] = None
    seconds: float = 0.0


@dataclass
class SelfCheck:
    """The verdict of one config's self-check."""

    model_type: str
    passed: bool
    rows: list[Row]
    failed: Optional[str] = None
    """The first failing check's name (None when passed)."""
    error: Optional[str] = None
    """The exception a stage raised (its last line), if one did."""
    key: str = ""
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    engine_dtype: str = "fp32"
    """The parity engine's dtype (``parity.engine_dtype``): bf16 where vLLM-CPU takes no other."""

    def reason(self) -> str:
        """One line: the failing check, its gap against its bound, the error if any, and the usual cause."""
        if self.passed:
            return f"{self.model_type}: passed"
        check = next(c for c in CHECKS if c.name == self.failed)
        row = next(r for r in self.rows if r.check == self.failed)
        bound = check.bound_for(self.engine_dtype)
        gap = (f" gap {row.gap:.3g} {'<=' if check.above else '>'} {bound:g}"
               if row.gap is not None and bound is not None else "")
        error = f" ({self.error})" if self.error else ""
        return f"{self.model_type}: {check.name} failed{gap}{error}; usual cause: {check.hint}"

    def table(self) -> str:
        """The rows as a text table: check, gap, bound, pass/fail, seconds."""
        bounds = {c.name: c for c in CHECKS}
        lines = [f"{'check':<20} {'gap (nats)':>11} {'bound':>10} {'result':>7} {'seconds':>8}"]
        for row in self.rows:
            check = bounds[row.check]
            gap = "" if row.gap is None else f"{row.gap:.3g}"
            value = check.bound_for(self.engine_dtype)
            bound = "" if value is None else f"{'>' if check.above else '<='} {value:g}"
            result = {True: "pass", False: "FAIL", None: "-"}[row.passed]
            lines.append(f"{row.check:<20} {gap:>11} {bound:>10} {result:>7} {row.seconds:>8.1f}")
        if self.engine_dtype != "fp32":
            lines.append(f"(the vLLM engine in {self.engine_dtype}, the only dtype vLLM-CPU runs this model in; the "
                         "actor in fp32 on the same rounded weights)")
        lines.append(f"{self.model_type}: {'PASS' if self.passed else 'FAIL'} in {self.seconds:.0f} s"
                     + ("" if self.passed else f" -- {self.reason()}"))
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "SelfCheck":
        """The verdict :meth:`to_json` wrote; ValueError/KeyError/TypeError for another text."""
        data = json.loads(text)
        data["rows"] = [Row(**row) for row in data["rows"]]
        return cls(**data)


def versions() -> dict[str, str]:
    """The versions a verdict depends on: transformers, vLLM, the self-check's own (:data:`VERSION`)."""
    import transformers
    import vllm

    return {"transformers": transformers.__version__, "vllm": vllm.__version__, "selfcheck": str(VERSION)}


_VOLATILE = ("_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype", "name_or_path")


def fingerprint(hf_config: Any) -> str:
    """A hash of the config's content (sorted JSON, names/paths, dtypes and versions left out): 16 hex digits."""
    def clean(d: Any) -> Any:
        if isinstance(d, dict):
            return {str(k): clean(v) for k, v in d.items() if k not in _VOLATILE}
        if isinstance(d, list):
            return [clean(v) for v in d]
        return d

    text = json.dumps(clean(hf_config.to_dict()), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key(hf_config: Any, versions_: Optional[dict[str, str]] = None) -> str:
    """``MODEL_TYPE-HASH``: the hash of (model_type, transformers, vLLM, self-check version, config fingerprint)."""
    parts = dict(versions_ or versions(), model_type=hf_config.model_type, config=fingerprint(hf_config))
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return f"{hf_config.model_type}-{digest}"


def cache_path(key: str) -> Path:
    """Where the verdict of ``key`` is kept: ``$EASYRL_CACHE/selfcheck/KEY.json``."""
    return Path(cache_dir(os.environ)) / "selfcheck" / f"{key}.json"


def _verdict(model_type: str, progress: dict, error: Optional[BaseException], seconds: float, key: str) -> SelfCheck:
    """The rows from the parity's ``progress`` (stage seconds and gaps) and the exception a stage raised, if any."""
    rows, failed = [], None
    dtype = progress.get("engine_dtype", "fp32")
    for check in CHECKS:
        gap = progress.get(check.name) if check.bound is not None else None
        ran = all(stage in progress for stage in check.stages) and (check.bound is None or gap is not None)
        if failed is not None or (not ran and error is None):
            rows.append(Row(check.name, None))
            continue
        if not ran:  # this check's stage raised
            passed = False
        elif check.bound is None:
            passed = True
        else:
            bound = check.bound_for(dtype)
            passed = (gap > bound) if check.above else (gap <= bound)  # NaN fails
        seconds_ = sum(progress.get(stage, 0.0) for stage in check.stages)
        rows.append(Row(check.name, passed, gap, round(seconds_, 2)))
        if not passed:
            failed = check.name
    message = None
    if error is not None:
        last = str(error).strip().splitlines()
        message = f"{type(error).__name__}: {last[-1] if last else ''}"[:400]
    return SelfCheck(model_type, failed is None, rows, failed, message, key, round(seconds, 1), versions(), dtype)


def self_check(hf_config: Any, workdir: str | Path | None = None, vllm: bool = True) -> SelfCheck:
    """Run the self-check of ``hf_config`` in this process (no cache): build its twin, then the parity checks.

    Args:
        workdir: scratch folder (the twin and the export); None: a temporary one, removed after.
        vllm: False: the twin and the actor/transformers checks only (seconds; the vLLM rows not run, and
            ``passed`` says only that those checks passed: never cache such a verdict).

    Returns a :class:`SelfCheck`; a stage that raises fails its check (the exception's last line is kept), it does
    not propagate. Must run where no process group is initialized (``family_parity``); imports vLLM.
    """
    from easyrl.models.twin import write_twin
    from easyrl.trainer.parity import family_parity

    key, progress, error = cache_key(hf_config), {}, None
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="easyrl-selfcheck-") as scratch:
        work = Path(workdir) if workdir is not None else Path(scratch)
        try:
            clock = time.perf_counter()
            folder = write_twin(hf_config, work / "twin")
            progress["twin"] = round(time.perf_counter() - clock, 2)
            parity = family_parity(folder, work / "parity", vllm=vllm, progress=progress)
            progress.update(vllm_synced=parity.vllm_synced, stale=parity.stale)
        except Exception as err:  # noqa: BLE001 - any stage's failure is the verdict
            error = err
            traceback.print_exc()
    return _verdict(hf_config.model_type, progress, error, time.perf_counter() - start, key)


def load_config(source: str) -> Any:
    """The transformers config of ``source``: a model folder (its ``config.json``), or a ``model_type`` name (its
    default config, as the matrix checks it, seeded with the released values it lacks: ``easyrl.models.twin.RELEASED``).
    Raises ``ValueError`` naming ``source`` for neither."""
    from transformers import CONFIG_MAPPING, AutoConfig

    if os.path.isdir(source):
        if not os.path.isfile(os.path.join(source, "config.json")):
            raise ValueError(f"{source}: no config.json in this folder (a Hugging Face model folder has one)")
        return AutoConfig.from_pretrained(source)
    if source in CONFIG_MAPPING:  # with the released values the default config lacks (easyrl.models.twin.RELEASED)
        from easyrl.models.twin import seed_released

        return seed_released(CONFIG_MAPPING[source]())
    raise ValueError(f"{source!r} is neither a model folder nor a transformers model_type")


def read_cached(hf_config: Any) -> Optional[SelfCheck]:
    """The cached verdict of ``hf_config`` (:func:`cache_key`), or None (a stale or unreadable file is removed)."""
    path = cache_path(cache_key(hf_config))
    if not path.is_file():
        return None
    try:
        return SelfCheck.from_json(path.read_text())
    except (ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None


def store(verdict: SelfCheck) -> Path:
    """Write ``verdict`` under its key (atomically: a concurrent reader sees the old file or the new one)."""
    path = cache_path(verdict.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(verdict.to_json())
    os.replace(tmp, path)
    return path


def cached_self_check(hf_config: Any, timeout_s: int = CHILD_TIMEOUT_S) -> SelfCheck:
    """The cached verdict of ``hf_config``, or the self-check run in a child process (``python -m
    easyrl.trainer.selfcheck``, so that its engine and process group stay out of the caller's) and cached. A child
    that dies or runs past ``timeout_s`` gives a failed verdict (``twin`` failed, with the child's last line; not
    cached)."""
    cached = read_cached(hf_config)
    if cached is not None:
        return cached
    key = cache_key(hf_config)
    with tempfile.TemporaryDirectory(prefix="easyrl-selfcheck-") as scratch:
        config_dir = Path(scratch) / "config"
        hf_config.save_pretrained(config_dir)
        out = Path(scratch) / "verdict.json"
        command = [sys.executable, "-m", "easyrl.trainer.selfcheck", str(config_dir), "--json", str(out), "--no-cache"]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        except subprocess.TimeoutExpired:
            tail = [f"the self-check ran past {timeout_s} s"]
        if not out.is_file():
            rows = [Row(CHECKS[0].name, False)] + [Row(c.name, None) for c in CHECKS[1:]]
            return SelfCheck(hf_config.model_type, False, rows, CHECKS[0].name, tail[0][:400], key,
                             round(time.perf_counter() - start, 1), versions())
        verdict = SelfCheck.from_json(out.read_text())
    verdict.key = key  # the caller's config, as it was before the round trip through the folder
    store(verdict)
    return verdict


def served_architecture(hf_config: Any) -> Optional[str]:
    """The transformers class easyrl builds for the config (``easyrl.models.twin.model_class_name``) when vLLM serves
    an architecture of that name; None otherwise."""
    from vllm import ModelRegistry

    from easyrl.models.twin import TwinError, model_class_name

    try:
        name = model_class_name(hf_config)
    except TwinError:
        return None
    return name if name in ModelRegistry.get_supported_archs() else None


def admit(key: str, hf_config: Any, images: bool = False) -> Optional[SelfCheck]:
    """The pre-flight's gate for the model at config key ``key``: a registered family passes (None); another
    ``model_type`` that transformers and vLLM both serve passes if its self-check (:func:`cached_self_check`) does,
    and its verdict is returned. ``images``: the data holds images or videos (the self-check scores text only).

    Raises:
        ModelError: the type is served by only one library, or its twin cannot be built (the registry's refusal,
            ``families.check_supported``, with the reason); a VL model outside the registry with ``images``; or the
            self-check failed (naming the check, its gap and the usual cause).
    """
    from easyrl.errors import ModelError
    from easyrl.models.families import DOCS, FAMILIES, check_supported

    if hf_config.model_type in FAMILIES:
        return None
    arch = served_architecture(hf_config)
    if arch is None:
        check_supported(key, hf_config, f"vLLM {versions()['vllm']} serves no architecture of the name transformers "
                        "builds for it, so it cannot be self-checked")
    if images and getattr(hf_config, "vision_config", None) is not None:
        raise ModelError(f"{key}: model_type {hf_config.model_type!r} is not in easyrl's registry, and its self-check "
                         "scores text prompts only, while the data holds images or videos (data.image_key, "
                         "data.video_key): train it on text (data.image_key=null data.video_key=null), or add the "
                         f"family to the registry with its image parity (see {DOCS}, \"Adding a family\")")
    verdict = cached_self_check(hf_config)
    if verdict.passed:
        logger.info("%s: model_type %r is not in easyrl's registry; admitted by its self-check (%s, %.0f s; "
                    "`easyrl check-model` prints the table)", key, hf_config.model_type, arch, verdict.seconds)
        return verdict
    if verdict.failed == "twin":
        check_supported(key, hf_config, f"its self-check could not build a tiny twin: {verdict.error}")
    raise ModelError(f"{key}: model_type {hf_config.model_type!r} is not in easyrl's registry, and its self-check "
                     f"failed: {verdict.reason()}. `easyrl check-model {key_hint(hf_config)}` prints the table; "
                     f"see {DOCS}, \"Adding a family\"")


def key_hint(hf_config: Any) -> str:
    """What to pass ``easyrl check-model`` for this config: its folder, else its model_type."""
    path = getattr(hf_config, "_name_or_path", "") or ""
    return path if os.path.isdir(path) else hf_config.model_type


def main(argv: Optional[list[str]] = None, prog: str = "python -m easyrl.trainer.selfcheck") -> int:
    """``easyrl check-model SOURCE [--no-cache] [--json OUT]``: the self-check's table (cached, else run in this
    process and cached); exit status 0 when it passed, 1 when it failed, 2 for a bad SOURCE."""
    parser = argparse.ArgumentParser(prog=prog, description="The self-check of a model family: its tiny random twin "
                                     "through easyrl's parity checks (packed == padded, transformers' forward of an "
                                     "export, vLLM before and after a weight sync, every weight name mapped).")
    parser.add_argument("source", help="a model folder (its config.json), or a transformers model_type (its default "
                        "config)")
    parser.add_argument("--no-cache", action="store_true", help="run even when a verdict is cached; do not cache it")
    parser.add_argument("--json", default=None, help="also write the verdict here (JSON)")
    args = parser.parse_args(argv)
    try:
        hf_config = load_config(args.source)
    except ValueError as err:
        parser.error(str(err))
    verdict = None if args.no_cache else read_cached(hf_config)
    if verdict is None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
        verdict = self_check(hf_config)
        if not args.no_cache:
            store(verdict)
    else:
        print(f"(cached: {cache_path(verdict.key)})")
    if args.json:
        Path(args.json).write_text(verdict.to_json())
    print(verdict.table())
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
