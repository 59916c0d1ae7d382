"""Pre-flight checks of the reward side before Ray starts: the reward function (file, function, keyword arguments,
declared type, one call on a sample), the online-filtering key, the reward model and the LLM judge (docs/errors.md,
K, R and J rows)."""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import traceback
from typing import Any, Optional

from easyrl.errors import ConfigError, ModelError, RewardError, UserError
from easyrl.rewards.judge import load_judge
from easyrl.trainer.model_checks import check_head, check_model_source, check_model_sources, load_part, weight_headers

logger = logging.getLogger("easyrl")


def load_reward(reward_cfg: Any):
    """The ``RewardFunction`` of ``worker.reward``, imported, its keyword arguments bound to its signature. Raises
    ``RewardError``: no function configured, a malformed spec, a missing file or function, a failing import (names the
    line), keyword arguments the function does not take or required ones not given."""
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
    check_reward_kwargs(reward_fn)
    logger.info("%s: %s-style, reward_type=%s", reward_fn.where, reward_fn.style, reward_fn.reward_type)
    return reward_fn


def _line_in(err: BaseException, path: str) -> Optional[int]:
    """The last line of ``path`` in ``err``'s traceback (where the user's file failed)."""
    target = os.path.abspath(path)
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.abspath(f.filename) == target]
    return frames[-1].lineno if frames else None


def check_reward_kwargs(reward_fn: Any) -> None:
    """The function binds to what it is called with plus ``worker.reward.reward_function_kwargs``: an easyrl-style
    ``fn(reward_input(s), **kwargs)``, or a verl- or TRL-style function (``easyrl.rewards.styles``) the arguments its
    library passes (those it takes). Else ``RewardError`` naming the key, the function, its signature (and style)."""
    from easyrl.rewards.styles import VERL_ARGS

    fn, kwargs = reward_fn.fn, reward_fn.kwargs
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    shown = f"{reward_fn.where} with signature {fn.__name__}{signature}"
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params)
    if reward_fn.style != "easyrl":
        passed = VERL_ARGS if reward_fn.style == "verl" else ("prompts", "completions")
        try:
            signature.bind(**{name: None for name in passed if takes_any or name in signature.parameters}, **kwargs)
        except TypeError as err:
            library = "verl's compute_score(data_source, solution_str, ground_truth, extra_info)" \
                if reward_fn.style == "verl" else "TRL's fn(prompts=..., completions=..., **dataset_columns)"
            raise RewardError(f"{shown} is called as {library} with worker.reward.reward_function_kwargs={kwargs}, "
                              f"which does not bind: {err}") from None
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if not positional:
        raise RewardError(f"{shown} takes no positional argument for the reward input(s)")
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
    """Call the reward function once on ``sample`` (one reward input) with its output checks; returns the names of
    its scores. Raises ``RewardError``, with a hint at the other ``reward_type``."""
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


def check_filter_key(config: Any, score_names: list[str], where: str) -> None:
    """With online filtering, ``algorithm.filter_key`` must be a score the reward returns. Raises ``ConfigError``."""
    algo = config.algorithm
    if algo.online_filtering and algo.filter_key not in score_names:
        raise ConfigError(f"algorithm.filter_key={algo.filter_key!r} is not a score of {where}; it returns "
                          f"{score_names}")


def check_best_metric(config: Any, score_names: list[str]) -> None:
    """``trainer.best_metric``, when it names a validation metric (``val/...``), is one the validation logs:
    ``val/reward/<name>`` of each score the reward function returned on the check sample (``score_names``, ``overall``
    among them), ``val/reward/judge`` and ``val/reward/reward_model`` when those score, ``val/response_length/mean``,
    and with ``worker.rollout.multi_turn`` any ``val/multi_turn/*`` (its names follow the trajectories' counts, so
    they are not listed). A name outside ``val/`` ranks by a training-step metric, whose names are known only once
    the step runs: not checked. Raises ``ConfigError`` with a did-you-mean and the names (the best checkpoint was
    never marked: the metric is looked up at each save and was absent)."""
    metric = config.trainer.best_metric
    reward = config.worker.reward
    extra = ["judge"] * (reward.judge.model_path is not None) + ["reward_model"] * reward.reward_model.enabled
    logged = [f"val/reward/{name}" for name in dict.fromkeys([*score_names, *extra])] + ["val/response_length/mean"]
    if not metric.startswith("val/") or metric in logged:
        return
    if config.worker.rollout.multi_turn.enable and metric.startswith("val/multi_turn/"):
        return
    close = difflib.get_close_matches(metric, logged, n=1, cutoff=0.6)
    hint = f"Did you mean {close[0]!r}? " if close else ""
    raise ConfigError(f"trainer.best_metric={metric!r} is not a metric the validation logs, so no checkpoint would be "
                      f"ranked best. {hint}It logs {', '.join(logged)} (the reward function's scores as it "
                      "returned them on a sample).")


def check_reward_model(rm: Any) -> None:
    """``worker.reward.reward_model`` (when enabled): a sequence classifier with one output, a tokenizer, a chat
    template that renders a (prompt, response) pair. Raises ``ModelError`` (a missing model, a config or tokenizer
    that cannot be loaded, ``num_labels`` other than 1, no chat template) or ``ConfigError`` (``chat_template`` fails
    to render; ``max_length`` beyond the model's positions)."""
    if not rm.enabled:
        return
    from easyrl.config.worker import read_chat_template
    from easyrl.rewards.reward_model_inputs import encode_conversations, load_tokenizer

    key = "worker.reward.reward_model.model_path"
    tok_key = "worker.reward.reward_model.tokenizer_path" if rm.tokenizer_path else key
    check_model_sources(rm, "worker.reward.reward_model")
    from transformers import AutoConfig

    hf_config = load_part(key, rm.model_path, "model config", AutoConfig.from_pretrained, rm.trust_remote_code)
    if getattr(hf_config, "num_labels", 1) != 1:
        raise ModelError(f"{key}={rm.model_path!r} has num_labels={hf_config.num_labels}: a reward model is a sequence "
                         "classifier with one output (a scalar score), e.g. Skywork/Skywork-Reward-V2-Qwen3-0.6B")
    positions = getattr(hf_config.get_text_config(), "max_position_embeddings", None)
    if rm.max_length is not None and positions is not None and rm.max_length > positions:
        raise ConfigError(f"worker.reward.reward_model.max_length={rm.max_length} exceeds the reward model's "
                          f"max_position_embeddings={positions} ({key}={rm.model_path!r}): longer inputs would be "
                          f"scored at positions it never saw; set it to {positions} or less.")
    tokenizer = load_part(tok_key, rm.tokenizer_path or rm.model_path, "tokenizer",
                          lambda _, **kw: load_tokenizer(rm), rm.trust_remote_code)
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


def check_judge_files(judge_cfg: Any) -> None:
    """With ``worker.reward.judge`` on: its model and weights exist, its prompt template and parser load, its
    ``max_model_len`` fits the model's positions, it is a language model. Raises ``ModelError`` / ``ConfigError``
    naming the key."""
    key = "worker.reward.judge.model_path"
    if judge_cfg.model_path is not None:
        check_model_source(key, judge_cfg.model_path)
        load_judge(judge_cfg)
        weight_headers(key, judge_cfg.model_path)
        from transformers import AutoConfig

        text = load_part(key, judge_cfg.model_path, "model config", AutoConfig.from_pretrained, False,
                         remote_key="").get_text_config()
        positions = getattr(text, "max_position_embeddings", None)
        if positions is not None and judge_cfg.max_model_len > positions:
            raise ConfigError(f"worker.reward.judge.max_model_len={judge_cfg.max_model_len} exceeds the judge's "
                              f"max_position_embeddings={positions} ({key}={judge_cfg.model_path!r}); vLLM refuses "
                              f"such a context: set it to {positions} or less.")
    check_head(key, judge_cfg.model_path, scorer=False)
