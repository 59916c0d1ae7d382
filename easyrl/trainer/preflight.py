"""Everything that can be checked about a run before Ray and the workers start: the model folder (or hub id), the
tokenizer and processor, the datasets, the reward function with its keyword arguments and declared type.

``prepare(config)`` runs the checks in the order a user would fix them and returns what the trainer needs. Each
failure is an :class:`easyrl.errors.UserError` naming the config key (and file, row, column, function) and what to do;
``docs/errors.md`` lists them with their tests.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import re
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional

from easyrl.errors import ConfigError, DataError, ModelError, RewardError, UserError
from easyrl.models.hub_snapshot import looks_local
from easyrl.rewards.judge import load_judge

logger = logging.getLogger("easyrl")

HUB_TIMEOUT_S = 10.0


# ---------------------------------------------------------------------------------------------------------------------
# Model


def check_model_source(key: str, path: str, timeout_s: float = HUB_TIMEOUT_S) -> None:
    """A local model folder must exist and hold ``config.json``; a hub id must be in the local cache or reachable.

    The hub is asked once, with a ``timeout_s`` second timeout, and not at all under ``HF_HUB_OFFLINE=1`` (then only
    the cache counts), so an unreachable hub answers in seconds instead of a minute of retries.

    Raises:
        ModelError: naming ``key`` and ``path``: a missing folder, a file, a folder without ``config.json``, a hub id
            that is not cached and cannot be reached, or that the hub does not know.
    """
    if looks_local(path):
        folder = os.path.expanduser(path)
        if not os.path.exists(folder):
            raise ModelError(f"{key}={path!r} does not exist; give an existing local model folder or a hub id org/name")
        if not os.path.isdir(folder):
            raise ModelError(f"{key}={path!r} is a file; give the model's folder (the one holding config.json)")
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise ModelError(f"{key}={path!r} holds no config.json: is it a Hugging Face model folder?")
        return
    import huggingface_hub
    from huggingface_hub import constants

    cached = huggingface_hub.try_to_load_from_cache(path, "config.json")
    if isinstance(cached, str):
        return
    if constants.HF_HUB_OFFLINE:
        raise ModelError(
            f"{key}={path!r} is not a local folder and not in the hub cache ({constants.HF_HUB_CACHE}), and "
            "HF_HUB_OFFLINE is set; download the model to a folder and give its path"
        )
    try:
        huggingface_hub.HfApi().model_info(path, timeout=timeout_s)
    except (huggingface_hub.errors.RepositoryNotFoundError, huggingface_hub.errors.GatedRepoError) as err:
        reason = str(err).strip().splitlines()[0]
        raise ModelError(f"{key}={path!r}: the hub has no such model, or it needs a login ({reason})") from None
    except Exception as err:  # network: DNS, connection refused, timeout, proxy
        raise ModelError(
            f"{key}={path!r} is not a local folder, and the Hugging Face hub cannot be reached to find it "
            f"({type(err).__name__}: {str(err).strip()[:200]}); download the model to a folder and give its path, "
            "or check the network"
        ) from None


def check_model_sources(model_cfg: Any) -> None:
    """:func:`check_model_source` of ``worker.actor.model.model_path`` and, if set, ``tokenizer_path``."""
    check_model_source("worker.actor.model.model_path", model_cfg.model_path)
    if model_cfg.tokenizer_path:
        check_model_source("worker.actor.model.tokenizer_path", model_cfg.tokenizer_path)


def load_model_parts(model_cfg: Any, sources_checked: bool = False,
                     chat_template: Optional[str] = None) -> tuple[Any, Any, Any]:
    """``(tokenizer, hf_config, processor or None)`` of ``worker.actor.model``, after :func:`check_model_sources`
    (unless ``sources_checked``); with ``chat_template`` (``data.override_chat_template``, a Jinja file) the
    tokenizer's and processor's chat template is replaced by the file's text (EasyR1's behaviour).

    Raises:
        ModelError: naming the key whose folder cannot be loaded, or a tokenizer without a chat template.
        ConfigError: the ``data.override_chat_template`` file cannot be read.
    """
    if not sources_checked:
        check_model_sources(model_cfg)
    model_key = "worker.actor.model.model_path"
    tok_key = "worker.actor.model.tokenizer_path" if model_cfg.tokenizer_path else model_key
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer  # after the checks: a slow import

    tok_path = model_cfg.tokenizer_path or model_cfg.model_path
    remote = model_cfg.trust_remote_code
    hf_config = _load(model_key, model_cfg.model_path, "model config", AutoConfig.from_pretrained, remote)
    tokenizer = _load(tok_key, tok_path, "tokenizer", AutoTokenizer.from_pretrained, remote)
    processor = None
    if getattr(hf_config, "vision_config", None) is not None:
        processor = _load(tok_key, tok_path, "processor", AutoProcessor.from_pretrained, remote)
    if chat_template is not None:
        override_chat_template(tokenizer, processor, chat_template)
    check_chat_template(tokenizer, processor, f"{tok_key}={tok_path!r}")
    return tokenizer, hf_config, processor


def override_chat_template(tokenizer: Any, processor: Any, path: str) -> None:
    """Replace the chat template of ``tokenizer`` (and ``processor``, if any) by the text of the Jinja file ``path``.

    Raises:
        ConfigError: ``path`` is not a readable file (naming ``data.override_chat_template``).
    """
    try:
        with open(path, encoding="utf-8") as f:
            template = f.read()
    except OSError as err:
        raise ConfigError(f"data.override_chat_template={path!r} cannot be read ({err.strerror or err}); give the "
                          "path of a Jinja chat template file, or null to keep the model's") from None
    tokenizer.chat_template = template
    if processor is not None:
        processor.chat_template = template
    logger.info("chat template replaced by %s (data.override_chat_template)", path)


def check_chat_template(tokenizer: Any, processor: Any, where: str) -> None:
    """Prompts are built with the chat template of the processor or the tokenizer: one must have it.

    Raises:
        ModelError: neither has one (``where`` names the key and path).
    """
    if not getattr(tokenizer, "chat_template", None) and not getattr(processor, "chat_template", None):
        raise ModelError(
            f"the tokenizer of {where} has no chat template, which builds the prompts; use an instruct/chat model, "
            "or set worker.actor.model.tokenizer_path to one"
        )


def _load(key: str, path: str, what: str, loader: Callable, trust_remote_code: bool) -> Any:
    try:
        return loader(path, trust_remote_code=trust_remote_code)
    except Exception as err:
        reason = " ".join(str(err).strip().split())[:300]
        hint = " (set worker.actor.model.trust_remote_code=true if you trust it)" * ("trust_remote_code" in reason)
        broken_config = _load_hint(key, path, str(err))
        if broken_config:  # the library's first sentence, then what to write
            reason, hint = reason.split(". ")[0].rstrip("."), broken_config
        raise ModelError(f"cannot load the {what} of {key}={path!r}: {type(err).__name__}: {reason}{hint}") from None


def _load_hint(key: str, path: str, reason: str) -> str:
    """What to write instead, for the two broken ``config.json`` files a loader names (not JSON, unknown type)."""
    if "not a valid JSON file" in reason:
        return (f"; write {os.path.join(path, 'config.json')} as one JSON object (the file save_pretrained writes, "
                f"e.g. {{\"model_type\": \"qwen2\", ...}}), or set {key} to a model folder or hub id that has one")
    found = re.search(r"model type `([^`]*)`", reason)
    if found:
        import transformers

        return (f"; set \"model_type\" in {os.path.join(path, 'config.json')} to a type transformers "
                f"{transformers.__version__} knows (e.g. qwen2, qwen2_5_vl, qwen3_vl; not {found.group(1)!r}), "
                "upgrade transformers, or set worker.actor.model.trust_remote_code=true for a model that ships its "
                "own code")
    return ""


# ---------------------------------------------------------------------------------------------------------------------
# Reward


def load_reward(reward_cfg: Any):
    """The ``RewardFunction`` of ``worker.reward``, its file imported and its keyword arguments checked against the
    function's signature (not yet called: see :func:`check_reward_on_sample`).

    Raises:
        RewardError: no function configured, a malformed spec, a missing file or function, an import that fails
            (names the line), keyword arguments the function does not take or required ones not given.
    """
    from easyrl.rewards.function import RewardFunction

    key = "worker.reward.reward_function"
    spec = reward_cfg.reward_function
    if not spec and reward_cfg.reward_model.enabled:  # the reward model scores alone: a rule reward of 0
        from easyrl.rewards.zero import SPEC as spec
    if not spec:
        raise RewardError(f"{key} is not set: give path/to/file.py:function_name")
    try:
        reward_fn = RewardFunction(spec, reward_cfg.reward_function_kwargs, reward_cfg.reward_type)
    except UserError:
        raise
    except (FileNotFoundError, AttributeError, ValueError) as err:
        raise RewardError(str(err) if key in str(err) else f"{key}={spec!r}: {err}") from None
    except BaseException as err:  # the user's module failed to import
        path = spec.rsplit(":", 1)[0]
        line = getattr(err, "lineno", None) if isinstance(err, SyntaxError) else _line_in(err, path)
        where = f" line {line}" if line else ""
        raise RewardError(
            f"{key}={spec!r}: importing {path}{where} failed: {type(err).__name__}: {err}"
        ) from None
    if reward_fn.style == "easyrl":
        check_reward_kwargs(reward_fn.fn, reward_fn.kwargs, reward_fn.where)
    else:
        check_styled_reward_kwargs(reward_fn)
    logger.info("%s: %s-style, reward_type=%s", reward_fn.where, reward_fn.style, reward_fn.reward_type)
    return reward_fn


def check_styled_reward_kwargs(reward_fn: Any) -> None:
    """A verl- or TRL-style function (``easyrl.rewards.styles``) must bind to the arguments its library passes (those
    it takes) plus ``worker.reward.reward_function_kwargs``.

    Raises:
        RewardError: naming the function, its signature, the style and the binding error.
    """
    from easyrl.rewards.styles import VERL_ARGS

    fn, kwargs = reward_fn.fn, reward_fn.kwargs
    signature = inspect.signature(fn)
    params = signature.parameters.values()
    passed = VERL_ARGS if reward_fn.style == "verl" else ("prompts", "completions")
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        passed = [name for name in passed if name in signature.parameters]
    try:
        signature.bind(**{name: None for name in passed}, **kwargs)
    except TypeError as err:
        library = "verl's compute_score(data_source, solution_str, ground_truth, extra_info)" \
            if reward_fn.style == "verl" else "TRL's fn(prompts=..., completions=..., **dataset_columns)"
        raise RewardError(
            f"{reward_fn.where} with signature {fn.__name__}{signature} is called as {library} with "
            f"worker.reward.reward_function_kwargs={kwargs}, which does not bind: {err}"
        ) from None


def _line_in(err: BaseException, path: str) -> Optional[int]:
    """The last line of ``path`` in ``err``'s traceback (where the user's file failed)."""
    target = os.path.abspath(path)
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.abspath(f.filename) == target]
    return frames[-1].lineno if frames else None


def check_reward_kwargs(fn: Callable, kwargs: dict, where: str) -> None:
    """``fn(reward_input(s), **kwargs)`` must bind: every key a parameter (unless ``fn`` takes ``**kwargs``), every
    required parameter after the first given.

    Raises:
        RewardError: naming the key of ``worker.reward.reward_function_kwargs``, the function and its signature.
    """
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    shown = f"{where} with signature {fn.__name__}{signature}"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if not positional:
        raise RewardError(f"{shown} takes no positional argument for the reward input(s)")
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params)
    names = [p.name for p in params[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in kwargs:
        if not takes_any and name not in names:
            close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
            raise RewardError(
                f"worker.reward.reward_function_kwargs has {name!r}, which {shown} does not take"
                + (f"; did you mean {close[0]!r}?" if close else f"; it takes {names}")
            )
    try:
        signature.bind(None, **kwargs)
    except TypeError as err:
        raise RewardError(
            f"{shown} cannot be called with worker.reward.reward_function_kwargs={kwargs}: {err}"
        ) from None


def check_reward_on_sample(reward_fn: Any, sample: dict) -> list[str]:
    """Call the reward function once on ``sample`` (one reward input) as its declared ``reward_type`` says, and apply
    the output checks of ``RewardFunction``; a mismatch is reported now instead of at step 1 on the workers.

    Returns:
        The names of the scores it returned (``overall``, ``accuracy``, ...).

    Raises:
        RewardError: the call or its output failed, with a hint at the other ``reward_type`` when it fits.
    """
    try:
        return list(reward_fn([sample]))
    except Exception as err:
        declared = reward_fn.reward_type
        if declared == "batch":
            hint = ("a batch function takes the list of all reward inputs and returns a list of score dicts; if yours "
                    "scores one input (a dict), set worker.reward.reward_type=sequential")
        else:
            hint = ("a sequential function takes one reward input (a dict) and returns one score dict; if yours "
                    "takes the list, set worker.reward.reward_type=batch")
        reason = " ".join(str(err).split())[:300]
        raise RewardError(
            f"{reward_fn.where} failed on one sample as worker.reward.reward_type={declared}: "
            f"{type(err).__name__}: {reason}. {hint}"
        ) from None


# ---------------------------------------------------------------------------------------------------------------------
# Data and the whole pre-flight


@dataclass
class Prepared:
    """What ``build_trainer`` needs, all checked: tokenizer, processor (None for text-only models), datasets, reward."""

    tokenizer: Any
    processor: Any
    train_dataset: Any
    val_dataset: Any
    reward_fn: Any


def tool_schemas(multi_turn: Any) -> Optional[list[dict]]:
    """The JSON schemas of ``worker.rollout.multi_turn.tools`` for the chat template (None when multi-turn is off or
    has no tools). Raises ``ConfigError`` for a tool that cannot be loaded (``easyrl.agents.tools``)."""
    if not multi_turn.enable or not multi_turn.tools:
        return None
    from easyrl.agents.tools import load_tools

    return [tool.schema for tool in load_tools(multi_turn.tools).values()]


def load_dataset_for(key: str, path: str, config: Any, tokenizer: Any, processor: Any):
    """``RLDataset`` of the data path ``path`` given by config key ``key``; data errors are prefixed with the key."""
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
            tools=tool_schemas(config.worker.rollout.multi_turn),
        )
    except DataError as err:  # the message names the file; say which setting gave it
        raise DataError(f"{key}: {err}") from None
    raise_video_limit(config.worker.rollout, dataset.max_videos, key)
    return dataset


def raise_video_limit(rollout: Any, max_videos: int, key: str) -> None:
    """vLLM refuses a prompt with more videos than ``limit_mm_per_prompt`` allows, and profiles a video at start-up
    only when the limit is above 0: ``worker.rollout.limit_videos`` is raised to the most videos a row of the data
    has (logged), so EasyR1 configs, which have no such key, run on video data unchanged."""
    if max_videos > rollout.limit_videos:
        logger.info("%s has up to %d video(s) per prompt: worker.rollout.limit_videos raised from %d to %d", key,
                    max_videos, rollout.limit_videos, max_videos)
        rollout.limit_videos = max_videos


def prepare(config: Any, train: bool = True) -> Prepared:
    """All pre-flight checks of a finalized config, in order: model paths, reward function and keyword arguments (both
    cheap), model config and tokenizer, datasets, then the reward function called on one sample of the data.

    Args:
        config: the finalized ``PPOConfig``.
        train: False for ``easyrl eval``: no training set is loaded (``data.train_files`` may be null; the
            ``train_dataset`` returned is None) and the reward is tried on a validation sample.

    Raises:
        UserError: ``ModelError``, ``DataError``, ``RewardError`` or ``ConfigError``; see ``docs/errors.md``.
    """
    if train and not config.data.train_files:
        raise ConfigError("data.train_files is not set: training needs a training set (only `easyrl eval` runs "
                          "without one).")
    check_model_sources(config.worker.actor.model)
    reward_fn = load_reward(config.worker.reward)
    check_judge_files(config.worker.reward.judge)
    tokenizer, hf_config, processor = load_model_parts(config.worker.actor.model, sources_checked=True,
                                                       chat_template=config.data.override_chat_template)
    check_rollout_split(hf_config, config.worker.rollout.tensor_parallel_size)
    if config.algorithm.needs_teacher:  # on-policy distillation: the teacher must read the student's token ids
        from easyrl.trainer.teacher_check import check_teacher

        teacher = config.worker.teacher.model
        check_model_source("worker.teacher.model.model_path", teacher.model_path)
        if teacher.tokenizer_path:
            check_model_source("worker.teacher.model.tokenizer_path", teacher.tokenizer_path)
        check_teacher(config, tokenizer)
    train_set = None
    if train:
        train_set = load_dataset_for("data.train_files", config.data.train_files, config, tokenizer, processor)
    val = None
    if config.data.val_files:
        val = load_dataset_for("data.val_files", config.data.val_files, config, tokenizer, processor)
    if train_set is not None:
        check_enough_prompts(config, len(train_set))
    source = train_set if train_set is not None else val
    first = source.dataset[0]
    ground_truth = str(first[config.data.answer_key])
    response = f"<think>a sample</think> \\boxed{{{ground_truth}}}"
    sample = {"response": response, "response_length": len(tokenizer.encode(response)), "ground_truth": ground_truth,
              "columns": source.reward_columns(first)}
    if config.worker.rollout.multi_turn.enable:  # what a multi-turn rollout adds (easyrl.trainer.multi_turn)
        sample.update(messages=[{"role": "assistant", "content": response}], tool_calls=[])
    check_filter_key(config, check_reward_on_sample(reward_fn, sample), reward_fn.where)
    check_reward_model(config.worker.reward.reward_model)
    return Prepared(tokenizer, processor, train_set, val, reward_fn)


def check_judge_files(judge_cfg: Any) -> None:
    """With ``worker.reward.judge`` on: its model source exists, its prompt template renders and its parser loads.
    Raises ``ModelError`` / ``ConfigError`` naming the key (docs/errors.md, J rows)."""
    if judge_cfg.model_path is not None:
        check_model_source("worker.reward.judge.model_path", judge_cfg.model_path)
        load_judge(judge_cfg)


def check_rollout_split(hf_config: Any, tensor_parallel_size: int) -> None:
    """vLLM can split the model over ``worker.rollout.tensor_parallel_size`` ranks (its heads divide evenly;
    ``easyrl.workers.rollout_layout.check_heads_split``). Raises ``ConfigError`` naming the key and the config field."""
    from easyrl.workers.rollout_layout import check_heads_split

    try:
        check_heads_split(hf_config, tensor_parallel_size)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_enough_prompts(config: Any, n_prompts: int) -> None:
    """The training set must fill one rollout batch. Raises ``DataError`` naming both keys."""
    if n_prompts < config.data.rollout_batch_size:
        raise DataError(
            f"data.train_files={config.data.train_files!r} has {n_prompts} prompts (after dropping overlong ones), "
            f"fewer than data.rollout_batch_size={config.data.rollout_batch_size}: lower the batch size or add data"
        )


def check_filter_key(config: Any, score_names: list[str], where: str) -> None:
    """With online filtering, ``algorithm.filter_key`` must be a score the reward returns. Raises ``ConfigError``."""
    algo = config.algorithm
    if algo.online_filtering and algo.filter_key not in score_names:
        raise ConfigError(f"algorithm.filter_key={algo.filter_key!r} is not a score of {where}; it returns "
                          f"{score_names}")


def check_reward_model(rm: Any) -> None:
    """``worker.reward.reward_model`` (when its ``model_path`` is set): the checkpoint exists and is a sequence
    classifier with one output, its tokenizer loads, and the chat template renders a (prompt, response) pair.

    Raises:
        ModelError: a missing folder or hub id, a config or tokenizer that cannot be loaded, ``num_labels`` other
            than 1, a tokenizer without a chat template when ``chat_template`` is not set.
        ConfigError: ``chat_template`` fails to render.
    """
    if not rm.enabled:
        return
    from easyrl.config.reward_model import read_chat_template
    from easyrl.rewards.reward_model_inputs import encode_conversations, load_tokenizer

    key = "worker.reward.reward_model.model_path"
    tok_key = "worker.reward.reward_model.tokenizer_path" if rm.tokenizer_path else key
    check_model_source(key, rm.model_path)
    if rm.tokenizer_path:
        check_model_source(tok_key, rm.tokenizer_path)
    from transformers import AutoConfig

    hf_config = _load(key, rm.model_path, "model config", AutoConfig.from_pretrained, rm.trust_remote_code)
    if getattr(hf_config, "num_labels", 1) != 1:
        raise ModelError(f"{key}={rm.model_path!r} has num_labels={hf_config.num_labels}: a reward model is a sequence "
                         "classifier with one output (a scalar score), e.g. Skywork/Skywork-Reward-V2-Qwen3-0.6B")
    tokenizer = _load(tok_key, rm.tokenizer_path or rm.model_path, "tokenizer", lambda _, **kw: load_tokenizer(rm),
                      rm.trust_remote_code)
    template = read_chat_template(rm.chat_template)
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise ModelError(f"the tokenizer of {tok_key}={rm.tokenizer_path or rm.model_path!r} has no chat template: set "
                         "worker.reward.reward_model.chat_template to the template the reward model was trained with")
    try:
        encode_conversations(tokenizer, ["a prompt"], ["a response"], template)
    except Exception as err:
        reason = " ".join(str(err).split())[:200]
        raise ConfigError(f"worker.reward.reward_model.chat_template does not render a (prompt, response) pair: "
                          f"{type(err).__name__}: {reason}") from None
