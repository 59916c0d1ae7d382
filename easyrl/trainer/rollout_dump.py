"""Rollout dumps (``trainer.rollout_data_dir``, verl's name): every step's scored batch, written after its update in
an open format, for inspection (``easyrl rollouts``) and for a replay that trains on it without any engine
(``trainer.load_rollout_data_dir``, ``easyrl.trainer.batch_source.ReplayBatches``). The format, what a replay takes
from a dump and what it recomputes: docs/replay.md.

A dump folder holds::

    dump.json                              the run that wrote it: folder, identity (ranks, optimizer, LoRA rank,
                                           critic, model shape), the settings that shape its samples, its steps, its
                                           whole config; written when the run starts
    step_000002.parquet                    step 2's batch, one row per sample in generation order (pandas, pyarrow,
                                           datasets.load_dataset("parquet", data_files=...))
    step_000002.multi_modal.safetensors    step 2's processor outputs (pixel_values, image_grid_thw, ...), each
                                           distinct tensor once; the parquet's multi_modal_inputs column references them

Every tensor of the batch ``(bsz, *shape)`` is one column (a fixed-size list of ``prod(shape)`` values per row, the
padding included, flattened in C order; a ``(bsz,)`` tensor a plain column), its torch dtype and row shape in the
file's schema metadata (key ``easyrl``): :func:`read_step` gives them back bit for bit. Per-sample Python values are
plain columns (str, int, float, bool), or JSON strings; images and videos (vLLM's inputs) are not written.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.errors import RunStateError

logger = logging.getLogger("easyrl.rollout_dump")

FORMAT = "easyrl-rollout-dump"
VERSION = 1
MANIFEST = "dump.json"
METADATA_KEY = b"easyrl"
_STEP_FILE = re.compile(r"^step_(\d+)\.parquet$")

RECOMPUTED = ("old_log_probs", "ref_log_probs", "teacher_log_probs", "teacher_index", "values", "token_level_rewards",
              "advantages", "returns")
"""The tensors a replayed step computes again (its log-prob, value and advantage passes) and so does not take from the
dump: :func:`replay_inputs` drops them."""

NOT_WRITTEN = ("images", "videos")
"""Extras never written: the raw media vLLM generated from (the update reads the processor outputs,
``multi_modal_inputs``, which are written)."""

SAMPLE_KEYS = ("data.rollout_batch_size", "worker.rollout.n", "data.max_prompt_length", "data.max_response_length",
               "trainer.rollout_mode", "worker.rollout.calculate_log_probs")
"""The settings a replay must share with the dumped run: they shape the samples (how many, how long, from which
weights, with vLLM's log-probs or not)."""

_DERIVED = ("step", "index", "weight_version")  # columns of every file besides the batch's own
_BFLOAT16_AS = torch.int16  # arrow has no bfloat16: its bits are stored as int16


def step_file(folder: str, step: int) -> str:
    """``<folder>/step_<step:06d>.parquet``: the file of training step ``step`` (1-based)."""
    return os.path.join(folder, f"step_{step:06d}.parquet")


def multi_modal_file(folder: str, step: int) -> str:
    """``<folder>/step_<step:06d>.multi_modal.safetensors``: the processor outputs of step ``step``'s samples."""
    return os.path.join(folder, f"step_{step:06d}.multi_modal.safetensors")


def dumped_steps(folder: str) -> list[int]:
    """The steps whose file is in ``folder``, ascending (``[]`` for a folder without any, or no folder)."""
    if not os.path.isdir(folder):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := _STEP_FILE.match(name)))


def describe_steps(steps: list[int]) -> str:
    """``1-3, 5`` for ``[1, 2, 3, 5]``; ``none`` for ``[]``."""
    if not steps:
        return "none"
    runs = [[steps[0], steps[0]]]
    for step in steps[1:]:
        if step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# -- one step: write and read ------------------------------------------------------------------------------------


def _tensor_column(tensor: torch.Tensor) -> tuple[Any, dict[str, Any]]:
    """The arrow column of a ``(bsz, *shape)`` tensor and its ``{"dtype", "shape"}`` entry."""
    import pyarrow as pa

    info = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape[1:])}
    values = tensor.detach().cpu().contiguous()
    if values.dtype == torch.bfloat16:
        values = values.view(_BFLOAT16_AS)
    array = values.numpy()
    if not info["shape"]:
        return pa.array(array), info
    width, flat = math.prod(info["shape"]), pa.array(array.reshape(-1))
    if width == 0:  # arrow's fixed-size lists are at least 1 long: empty lists
        return pa.ListArray.from_arrays(pa.array([0] * (len(array) + 1), pa.int32()), flat), info
    return pa.FixedSizeListArray.from_arrays(flat, width), info


def _column_tensor(column: Any, info: dict[str, Any], rows: int) -> torch.Tensor:
    """The tensor ``(rows, *info["shape"])`` of a column written by :func:`_tensor_column`."""
    column = column.combine_chunks()
    flat = column.flatten() if info["shape"] else column
    array = np.array(flat.to_numpy(zero_copy_only=False)).reshape(rows, *info["shape"])
    dtype = getattr(torch, info["dtype"])
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.astype(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array).to(dtype)


def _native(values: list[Any]) -> Optional[Any]:
    """``values`` as a plain arrow column when each is None, a bool, int, float or str and they come back unchanged
    (same value and type), else None."""
    import pyarrow as pa

    if not all(v is None or type(v) in (bool, int, float, str) for v in values):
        return None
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None
    back = array.to_pylist()
    same = all(a == b and type(a) is type(b) for a, b in zip(back, values) if b is not None)
    return array if same else None


def _plain(value: Any) -> Any:
    """``json.dumps``' fallback: numpy scalars and arrays, tensors as Python numbers and lists; else ``TypeError``."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-able")


def _json(values: list[Any]) -> Optional[list[str]]:
    """Each value as a JSON string, or None when one is not JSON-able."""
    try:
        return [json.dumps(v, default=_plain) for v in values]
    except (TypeError, ValueError):
        return None


def _multi_modal_references(values: list[Any], uids: list[Any]) -> tuple[list[str], dict[str, torch.Tensor]]:
    """Per sample, its processor outputs as ``{name: key}`` JSON, and the tensors ``{key: tensor}`` to write once
    each: a sample whose tensor equals one already kept for its group (its ``uid``) references that one. Values
    that are not tensors are left out (logged)."""
    kept: dict[str, torch.Tensor] = {}
    by_group: dict[Any, list[tuple[str, str]]] = {}  # uid -> [(name, key)] kept for it
    references = []
    for index, (inputs, uid) in enumerate(zip(values, uids)):
        reference = {}
        for name, tensor in (inputs or {}).items():
            if not isinstance(tensor, torch.Tensor):
                logger.warning("multi_modal_inputs[%r] of sample %d is a %s, not a tensor: not written", name,
                               index, type(tensor).__name__)
                continue
            same = next((key for kept_name, key in by_group.get(uid, ()) if kept_name == name
                         and (kept[key] is tensor or (kept[key].dtype == tensor.dtype
                                                      and kept[key].shape == tensor.shape
                                                      and torch.equal(kept[key], tensor.cpu())))), None)
            if same is None:
                same = f"{index}/{name}"
                kept[same] = tensor.detach().cpu().contiguous().clone()
                by_group.setdefault(uid, []).append((name, same))
            reference[name] = same
        references.append(json.dumps(reference))
    return references, kept


def write_step(folder: str, step: int, batch: Batch, metrics: Optional[dict[str, float]] = None,
               prompt_position: Optional[dict[str, Any]] = None) -> str:
    """Write ``batch`` (the scored batch of training step ``step``, ``bsz`` samples in generation order) as
    :func:`step_file` (and its processor outputs as :func:`multi_modal_file`), each written under a temporary name and
    renamed when complete; returns the parquet file's path.

    Columns: ``step``, ``index`` (0..bsz-1), ``weight_version`` (the batch's, else ``step - 1``: the weights a
    colocated step generates with), one per tensor (``(bsz, *shape)``, any dtype), one per extra (plain or JSON;
    ``multi_modal_inputs`` as references; :data:`NOT_WRITTEN` and values neither plain nor JSON-able are left out,
    listed under ``dropped``). ``metrics`` (the step's, JSON) and ``prompt_position`` (the prompt stream's state after
    the step, JSON; None: unknown) go into the schema metadata. Raises ``ValueError`` for a tensor or extra named
    like a derived column, or a tensor of a dtype numpy lacks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    n = len(batch)
    clash = [name for name in ("step", "index") if name in batch]
    if clash:
        raise ValueError(f"the batch has entries named {clash}, which the dump's own columns use")
    columns: dict[str, Any] = {"step": pa.array([step] * n, pa.int64()), "index": pa.array(range(n), pa.int64())}
    if "weight_version" not in batch.extras:
        columns["weight_version"] = pa.array([step - 1] * n, pa.int64())
    tensors = {}
    for name in batch.tensors.keys():
        columns[name], tensors[name] = _tensor_column(batch.tensors[name])
    extras, dropped, mm_name = {}, {}, None
    for name, values in batch.extras.items():
        if name in NOT_WRITTEN:
            dropped[name] = "raw media: the training data holds them; the update reads multi_modal_inputs"
            continue
        if name == "multi_modal_inputs":
            references, kept = _multi_modal_references(values, batch.extras.get("uid", list(range(n))))
            if kept:
                from safetensors.torch import save_file

                path = multi_modal_file(folder, step)
                save_file(kept, path + ".tmp")
                os.replace(path + ".tmp", path)
                mm_name = os.path.basename(path)
            columns[name], extras[name] = pa.array(references, pa.string()), "multi_modal"
            continue
        native = _native(values)
        if native is not None:
            columns[name], extras[name] = native, "plain"
            continue
        encoded = _json(values)
        if encoded is not None:
            columns[name], extras[name] = pa.array(encoded, pa.string()), "json"
        else:
            dropped[name] = f"not JSON-able ({type(next(v for v in values if v is not None)).__name__})"
    meta = {"format": FORMAT, "version": VERSION, "step": step, "samples": n, "tensors": tensors, "extras": extras,
            "dropped": dropped, "multi_modal_file": mm_name,
            "metrics": {k: v for k, v in (metrics or {}).items() if _jsonable(v) is not None},
            "prompt_position": _jsonable(prompt_position)}
    table = pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(meta, default=_plain).encode()})
    path = step_file(folder, step)
    pq.write_table(table, path + ".tmp", compression="zstd")
    os.replace(path + ".tmp", path)
    return path


def _jsonable(value: Any) -> Any:
    """``value`` when JSON can hold it (numpy and tensor numbers included, :func:`_plain`), else None."""
    try:
        json.dumps(value, default=_plain)
        return value
    except (TypeError, ValueError):
        return None


def _missing_step(folder: str, step: int) -> RunStateError:
    return RunStateError(f"the rollout dump {folder} has no step {step} ({os.path.basename(step_file(folder, step))}"
                         f"); it holds steps {describe_steps(dumped_steps(folder))}.")


def _check_folder(folder: str) -> None:
    """``RunStateError`` when ``folder`` is not a folder."""
    if not os.path.isdir(folder):
        raise RunStateError(f"the rollout dump {folder} does not exist: give the folder a run's "
                            "trainer.rollout_data_dir wrote (it holds dump.json and step_NNNNNN.parquet files).")


def step_info(folder: str, step: int) -> dict[str, Any]:
    """The metadata of step ``step``'s file (schema metadata only, no rows read): ``step``, ``samples``, ``tensors``
    (name -> dtype and row shape), ``extras`` (name -> ``plain`` | ``json`` | ``multi_modal``), ``dropped``,
    ``multi_modal_file``, ``metrics``, ``prompt_position``. Raises ``RunStateError`` when the folder or the step is
    missing, or the file is no easyrl dump."""
    import pyarrow.parquet as pq

    _check_folder(folder)
    path = step_file(folder, step)
    if not os.path.isfile(path):
        raise _missing_step(folder, step)
    metadata = pq.read_schema(path).metadata or {}
    if METADATA_KEY not in metadata:
        raise RunStateError(f"{path} is a parquet file without easyrl's metadata: not a step of a rollout dump.")
    return json.loads(metadata[METADATA_KEY])


def read_step(folder: str, step: int) -> Batch:
    """The batch :func:`write_step` wrote for step ``step``: every tensor ``(bsz, *shape)`` with its dtype and values
    bit for bit, every written extra (plain values as written, JSON values as JSON gives them back: tuples as lists),
    ``multi_modal_inputs`` loaded from their file (samples that shared a tensor share it again), in generation
    order. The derived columns (``step``, ``index``, a ``weight_version`` the batch did not have) are not part of
    it. Raises ``RunStateError`` as :func:`step_info`."""
    import pyarrow.parquet as pq

    info = step_info(folder, step)
    table = pq.read_table(step_file(folder, step))
    n = table.num_rows
    tensors = {name: _column_tensor(table.column(name), spec, n) for name, spec in info["tensors"].items()}
    extras: dict[str, list[Any]] = {}
    for name, kind in info["extras"].items():
        values = table.column(name).to_pylist()
        if kind == "json":
            values = [json.loads(v) for v in values]
        elif kind == "multi_modal":
            values = _load_multi_modal(folder, info["multi_modal_file"], values)
        extras[name] = values
    return Batch(TensorDict(tensors, batch_size=[n]), extras)


def _load_multi_modal(folder: str, name: Optional[str], references: list[str]) -> list[dict[str, torch.Tensor]]:
    """Each sample's processor outputs from the references of the ``multi_modal_inputs`` column."""
    parsed = [json.loads(r) for r in references]
    if name is None:
        return [{} for _ in parsed]
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, name))
    return [{key: tensors[ref] for key, ref in sample.items()} for sample in parsed]


def replay_inputs(batch: Batch) -> Batch:
    """``batch`` (a dumped step, :func:`read_step`) less what the replayed step computes again (:data:`RECOMPUTED`)."""
    keep = [name for name in batch.tensors.keys() if name not in RECOMPUTED]
    return Batch(batch.tensors.select(*keep), dict(batch.extras))


def prune(folder: str, keep: int) -> list[int]:
    """Remove all but the newest ``keep`` steps' files of ``folder`` (``keep`` <= 0: none removed); returns the
    removed steps."""
    if keep <= 0:
        return []
    doomed = dumped_steps(folder)[:-keep]
    for step in doomed:
        for path in (step_file(folder, step), multi_modal_file(folder, step)):
            if os.path.exists(path):
                os.remove(path)
    return doomed


# -- the folder: the run that wrote it -----------------------------------------------------------------------------


def sample_settings(config) -> dict[str, Any]:
    """The :data:`SAMPLE_KEYS` of ``config`` (a ``PPOConfig``), dotted key -> value."""
    from functools import reduce

    return {key: reduce(getattr, key.split("."), config) for key in SAMPLE_KEYS}


def manifest_of(config, training_steps: int) -> dict[str, Any]:
    """What :data:`MANIFEST` records of the run of ``config`` (a ``PPOConfig``) with ``training_steps`` steps."""
    from easyrl.config import to_dict
    from easyrl.trainer.checkpoint import run_identity

    trainer = config.trainer
    return {"format": FORMAT, "version": VERSION, "run_dir": os.path.abspath(trainer.run_dir),
            "checkpoint_dir": os.path.abspath(trainer.save_checkpoint_path), "identity": run_identity(config),
            "samples": sample_settings(config), "training_steps": training_steps,
            "config": json.loads(json.dumps(to_dict(config), default=str))}


def read_manifest(folder: str) -> dict[str, Any]:
    """The :data:`MANIFEST` of dump ``folder``. Raises ``RunStateError`` when the folder does not exist, has none,
    or it is not an easyrl dump's."""
    _check_folder(folder)
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise RunStateError(f"{folder} is not a rollout dump (no {MANIFEST}): give the folder a run's "
                            f"trainer.rollout_data_dir wrote; it holds steps {describe_steps(dumped_steps(folder))}.")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunStateError(f"{path} is not valid JSON ({err}): the dump's manifest was cut or edited.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise RunStateError(f"{path} is not the manifest of an easyrl rollout dump (format {FORMAT!r}).")
    return manifest


def _differences(saved: dict[str, Any], config) -> list[str]:
    """What the dump's manifest ``saved`` and ``config`` differ in, of the model and :data:`SAMPLE_KEYS`."""
    from easyrl.trainer.checkpoint import mismatches, run_identity

    found = [phrase for phrase in mismatches({"model": saved.get("identity", {}).get("model", {})},
                                             {"model": run_identity(config)["model"]})]
    now = sample_settings(config)
    found += [f"{key}: {saved['samples'][key]!r} (dumped) -> {now[key]!r}"
              for key in SAMPLE_KEYS if key in saved.get("samples", {}) and saved["samples"][key] != now[key]]
    return found


def check_dump_folder(config) -> None:
    """Before a run with ``trainer.rollout_data_dir`` starts: the folder holds no other run's dump.
    ``RunStateError`` naming the run that wrote it."""
    folder = config.trainer.rollout_data_dir
    if folder is None or not os.path.isfile(os.path.join(folder, MANIFEST)):
        return
    saved = read_manifest(folder)
    if saved.get("run_dir") != os.path.abspath(config.trainer.run_dir):
        raise RunStateError(
            f"trainer.rollout_data_dir={folder} holds the rollout dump of another run ({saved.get('run_dir')}): a "
            f"dump is never mixed with another's. Give this run its own folder (e.g. "
            f"{os.path.join(config.trainer.run_dir, 'rollouts')}), or move the old one away.")


def check_replay(config, start_step: int, training_steps: int) -> None:
    """Before a replay (``trainer.load_rollout_data_dir``) starts: the dump exists, was made by this model with the
    same :data:`SAMPLE_KEYS`, holds every step the run trains (``start_step + 1 .. training_steps``; ``start_step``:
    the checkpoint's, 0 for none), and the replay does not write into the dumped run's checkpoint folder. Other
    differences of training settings are logged (a replay is meant to change the update). Raises ``RunStateError``
    naming the keys or steps and what to set."""
    from easyrl.config import PPOConfig, to_dict, valid_keys
    from easyrl.config.rerun import training_changes

    folder = config.trainer.load_rollout_data_dir
    key = f"trainer.load_rollout_data_dir={folder}"
    if not os.path.isdir(folder):
        raise RunStateError(f"{key} does not exist: give the folder the dumped run's trainer.rollout_data_dir wrote "
                            "(it holds dump.json and step_NNNNNN.parquet files).")
    saved = read_manifest(folder)
    different = _differences(saved, config)
    if different:
        raise RunStateError(
            f"{key} holds samples of another model or other settings ({os.path.join(folder, MANIFEST)}): "
            f"{'; '.join(different)}. A replay trains the dumped samples as they are: give the settings the dump "
            "was made with (its config is in dump.json), or dump a run of these.")
    wanted = list(range(start_step + 1, training_steps + 1))
    held = dumped_steps(folder)
    missing = [step for step in wanted if step not in held]
    if missing:
        first = next((s for s in held if s > start_step), held[0] if held else None)
        if first is None:
            hint = "dump a run first (trainer.rollout_data_dir)"
        else:
            checkpoint = os.path.join(saved.get("checkpoint_dir", "<run>"), f"global_step_{first - 1}")
            start = (f"resume the dumped run's checkpoint of step {first - 1} (trainer.load_checkpoint_path="
                     f"{checkpoint})" if first > 1 else "start from the model (no trainer.load_checkpoint_path)")
            hint = f"{start} to replay from step {first}, and set trainer.max_steps to at most {max(held)}"
        raise RunStateError(
            f"{key} holds steps {describe_steps(held)}, but this run would replay steps {describe_steps(wanted)} "
            f"(from {'its checkpoint at step ' + str(start_step) if start_step else 'the model, step 0'} to step "
            f"{training_steps}): {'step' if len(missing) == 1 else 'steps'} {describe_steps(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not in the dump. To replay, {hint}.")
    r3 = config.worker.actor.router_replay.replays_rollout
    if r3 and wanted and "routed_experts" not in step_info(folder, wanted[0])["tensors"]:
        raise RunStateError(
            f"{key} holds no routed_experts (its run sampled without worker.actor.router_replay.mode=R3), which "
            "worker.actor.router_replay.mode=R3 replays: set worker.actor.router_replay.mode=R2 or disabled, or "
            "replay a dump of an R3 run.")
    if (os.path.abspath(config.trainer.run_dir) == saved.get("run_dir")
            or os.path.abspath(config.trainer.save_checkpoint_path) == saved.get("checkpoint_dir")):
        raise RunStateError(
            f"{key} was dumped by the run in {saved.get('run_dir')} (checkpoints in {saved.get('checkpoint_dir')}), "
            "where this replay would write its own metrics, checkpoints and export over the dumped run's: give the "
            "replay its own trainer.experiment_name (and trainer.save_checkpoint_path, if set).")
    free_dicts = tuple(k for k, is_dict in valid_keys(PPOConfig).items() if is_dict)
    changes = training_changes(saved.get("config", {}), json.loads(json.dumps(to_dict(config), default=str)),
                               free_dicts)
    changes = [c for c in changes if c[0] != "trainer.load_rollout_data_dir"]
    if changes:
        logger.warning("replaying %s with other training settings than the dumped run's: %s (the update differs "
                       "from the original's by them)", folder,
                       "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in changes))
    if saved.get("training_steps") not in (None, training_steps):
        logger.warning("replaying %s over %d steps where the dumped run had %d: learning-rate schedules over the "
                       "run's steps differ (set trainer.max_steps / trainer.total_epochs as the dumped run had them "
                       "for the same update)", folder, training_steps, saved["training_steps"])


def check_dumps(config, start_step: int, training_steps: int) -> None:
    """Before Ray: :func:`check_dump_folder` with ``trainer.rollout_data_dir``, :func:`check_replay` with
    ``trainer.load_rollout_data_dir`` (``start_step``: the checkpoint the run resumes, 0 for none)."""
    if config.trainer.rollout_data_dir is not None:
        check_dump_folder(config)
    if config.trainer.load_rollout_data_dir is not None:
        check_replay(config, start_step, training_steps)


# -- the writer the trainer holds ----------------------------------------------------------------------------------


class RolloutDump:
    """Writes each trained step's batch into ``folder`` (``trainer.rollout_data_dir``), keeping the newest ``limit``
    steps (``trainer.rollout_data_limit``; -1: all); ``position()`` is the prompt stream's state after the step."""

    def __init__(self, folder: str, limit: int, position: Callable[[], Any]):
        self.folder, self.limit, self.position = folder, limit, position

    @classmethod
    def create(cls, config, training_steps: int, position: Callable[[], Any]) -> Optional["RolloutDump"]:
        """The writer of ``config.trainer.rollout_data_dir`` with its manifest written (None when the key is null)."""
        trainer = config.trainer
        if trainer.rollout_data_dir is None:
            return None
        os.makedirs(trainer.rollout_data_dir, exist_ok=True)
        path = os.path.join(trainer.rollout_data_dir, MANIFEST)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(manifest_of(config, training_steps), f, indent=1)
        os.replace(path + ".tmp", path)
        return cls(trainer.rollout_data_dir, trainer.rollout_data_limit, position)

    def write(self, step: int, batch: Batch, metrics: dict[str, float]) -> None:
        """Write step ``step``'s trained ``batch`` with its ``metrics`` (:func:`write_step`), then drop the steps past
        the limit; adds ``timing_s/rollout_dump`` (seconds) to ``metrics``."""
        start = time.perf_counter()
        write_step(self.folder, step, batch, dict(metrics), self.position())
        prune(self.folder, self.limit)
        metrics["timing_s/rollout_dump"] = time.perf_counter() - start
