"""Pre-flight checks of every model a run reads, before Ray starts: folder or hub id, weight-file headers, config,
tokenizer, processor, chat template, and each teacher's tokenizer against the student's. Each failure names the config
key (docs/errors.md, M and T rows)."""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Callable, Optional

from easyrl.errors import ConfigError, ModelError
from easyrl.models.hub_snapshot import looks_local

logger = logging.getLogger("easyrl")


def check_model_source(key: str, path: str, timeout_s: float = 10.0) -> None:
    """A local model folder must exist and hold ``config.json``; a hub id must be cached or known to the hub, asked
    once with a ``timeout_s`` second timeout (never under ``HF_HUB_OFFLINE=1``). Raises ``ModelError`` naming ``key``
    and ``path``: a missing folder, a file, no ``config.json``, a hub id not cached and unreachable, or unknown."""
    if looks_local(path):
        folder = os.path.expanduser(path)
        if not os.path.exists(folder):
            raise ModelError(f"{key}={path!r} does not exist; give an existing local model folder or a hub id org/name")
        if not os.path.isdir(folder):
            raise ModelError(f"{key}={path!r} is a file; give the model's folder (the one holding config.json)")
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise ModelError(f"{key}={path!r} holds no config.json: is it a Hugging Face model folder?"
                             + _not_a_model_hint(folder))
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


def _not_a_model_hint(folder: str) -> str:
    """What a folder without ``config.json`` holds instead, when easyrl can tell: a LoRA adapter, an easyrl run or
    checkpoint folder."""
    if os.path.isfile(os.path.join(folder, "adapter_config.json")):
        return (" It holds a LoRA adapter (adapter_config.json), not a whole model: merge it into its base model "
                "(peft's merge_and_unload, then save_pretrained) and give that folder")
    names = os.listdir(folder)
    if "checkpoint_tracker.json" in names or any(name.startswith("global_step_") for name in names) or os.path.isdir(
            os.path.join(folder, "actor")):
        export = os.path.join(folder, "huggingface")
        where = f"give its export {export}" if os.path.isfile(os.path.join(export, "config.json")) else (
            "export it first (easyrl export CHECKPOINT OUT) and give OUT")
        return f" It is an easyrl run or checkpoint folder, not a model: {where}"
    return ""


def check_model_sources(model_cfg: Any, prefix: str = "worker.actor.model") -> None:
    """:func:`check_model_source` of ``<prefix>.model_path`` and, if set, ``<prefix>.tokenizer_path``."""
    check_model_source(f"{prefix}.model_path", model_cfg.model_path)
    if model_cfg.tokenizer_path:
        check_model_source(f"{prefix}.tokenizer_path", model_cfg.tokenizer_path)


def load_model_parts(model_cfg: Any, sources_checked: bool = False,
                     chat_template: Optional[str] = None) -> tuple[Any, Any, Any]:
    """``(tokenizer, hf_config, processor or None)`` of ``worker.actor.model``, after :func:`check_model_sources`
    (unless ``sources_checked``); ``chat_template`` (a Jinja file) replaces their chat template. Raises
    ``ModelError`` (a folder that cannot be loaded, no chat template) or ``ConfigError`` (an unreadable template)."""
    if not sources_checked:
        check_model_sources(model_cfg)
    model_key = "worker.actor.model.model_path"
    tok_key = "worker.actor.model.tokenizer_path" if model_cfg.tokenizer_path else model_key
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer  # after the checks: a slow import

    tok_path = model_cfg.tokenizer_path or model_cfg.model_path
    remote = model_cfg.trust_remote_code
    hf_config = load_part(model_key, model_cfg.model_path, "model config", AutoConfig.from_pretrained, remote)
    tokenizer = load_part(tok_key, tok_path, "tokenizer", AutoTokenizer.from_pretrained, remote)
    processor = None
    if getattr(hf_config, "vision_config", None) is not None:
        processor = load_part(tok_key, tok_path, "processor", AutoProcessor.from_pretrained, remote)
    if chat_template is not None:
        override_chat_template(tokenizer, processor, chat_template)
    where = f"data.override_chat_template={chat_template!r}" if chat_template is not None else f"{tok_key}={tok_path!r}"
    check_chat_template(tokenizer, processor, where)
    return tokenizer, hf_config, processor


def override_chat_template(tokenizer: Any, processor: Any, path: str) -> None:
    """Replace the chat template of ``tokenizer`` (and ``processor``) by the Jinja file ``path``; raises
    ``ConfigError`` as :func:`read_chat_template`."""
    template = read_chat_template(path)
    tokenizer.chat_template = template
    if processor is not None:
        processor.chat_template = template
    logger.info("chat template replaced by %s (data.override_chat_template)", path)


def read_chat_template(path: str) -> str:
    """The text of the chat template file ``path`` (``data.override_chat_template``); ``ConfigError`` if unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as err:
        raise ConfigError(f"data.override_chat_template={path!r} cannot be read ({err.strerror or err}); give the "
                          "path of a Jinja chat template file, or null to keep the model's") from None


def check_chat_template(tokenizer: Any, processor: Any, where: str) -> None:
    """The processor's or the tokenizer's chat template exists and shows a message's content. Raises ``ModelError``
    when neither has one (``where`` names the key and path), ``ConfigError`` when it fails to render a user message or
    drops its content."""
    if not getattr(tokenizer, "chat_template", None) and not getattr(processor, "chat_template", None):
        raise ModelError(
            f"the tokenizer of {where} has no chat template, which builds the prompts; use an instruct/chat model, "
            "or set worker.actor.model.tokenizer_path to one"
        )
    templater = tokenizer if getattr(tokenizer, "chat_template", None) else processor
    try:
        text = templater.apply_chat_template([{"role": "user", "content": "EASYRL_PROBE"}], tokenize=False,
                                             add_generation_prompt=True)
        reason = "" if "EASYRL_PROBE" in text else "it drops the message's content (no {{ message['content'] }})"
    except Exception as err:  # a template error of the user's file or the model's
        reason = f"it fails on one user message ({type(err).__name__}: {err})"
    if reason:
        raise ConfigError(f"the chat template of {where} does not render a prompt: {reason}. Give a Jinja chat "
                          "template looping over messages (data.override_chat_template=FILE.jinja, e.g. the model's "
                          "own chat_template.jinja), or null to keep the model's")


def check_model_type(prefix: str, model: Any) -> Any:
    """The model config of the role at ``prefix`` (a key of ``easyrl.trainer.preflight.model_roles``) loads: its
    ``model_type`` is one transformers builds (or the folder ships its code, with the role's ``trust_remote_code``).
    Else ``ModelError`` naming the role's key (M11's answer, for every role; was: a critic's or teacher's unknown type
    failed in its worker, after Ray). Only this part of the family admission applies to every role: the registry or
    the self-check (``easyrl.trainer.selfcheck.admit``, a subprocess scoring vLLM against transformers) admits the
    actor alone, the one role vLLM serves; the other roles run in transformers, a type outside the registry with the
    generic entry (``easyrl.models.families.family``)."""
    from transformers import AutoConfig

    load_part(f"{prefix}.model_path", model.model_path, "model config", AutoConfig.from_pretrained,
              model.trust_remote_code)


def load_part(key: str, path: str, what: str, loader: Callable, trust_remote_code: bool,
              remote_key: Optional[str] = None) -> Any:
    """``loader(path)``; any failure is a ``ModelError`` naming ``what``, ``key`` and what to write instead.
    ``remote_key``: the role's trust-remote-code switch the hint names (None: ``key``'s sibling
    ``trust_remote_code``; "": the role has none)."""
    remote_key = f"{key.rsplit('.', 1)[0]}.trust_remote_code" if remote_key is None else remote_key
    try:
        return loader(path, trust_remote_code=trust_remote_code)
    except Exception as err:
        reason = " ".join(str(err).strip().split())[:300]
        hint = f" (set {remote_key}=true if you trust it)" * ("trust_remote_code" in reason and bool(remote_key))
        broken_config = _load_hint(key, path, str(err), remote_key)
        if broken_config:  # the library's first sentence, then what to write
            reason, hint = reason.split(". ")[0].rstrip("."), broken_config
        raise ModelError(f"cannot load the {what} of {key}={path!r}: {type(err).__name__}: {reason}{hint}") from None


def _load_hint(key: str, path: str, reason: str, remote_key: str) -> str:
    """What to write instead, for a ``config.json`` that is not JSON or names an unknown type (``remote_key``: the
    role's trust-remote-code switch, "" for none)."""
    if "not a valid JSON file" in reason:
        return (f"; write {os.path.join(path, 'config.json')} as one JSON object (the file save_pretrained writes, "
                f"e.g. {{\"model_type\": \"qwen2\", ...}}), or set {key} to a model folder or hub id that has one")
    found = re.search(r"model type `([^`]*)`", reason)
    if found:
        import transformers

        return (f"; set \"model_type\" in {os.path.join(path, 'config.json')} to a type transformers "
                f"{transformers.__version__} knows (e.g. qwen2, qwen2_5_vl, qwen3_vl; not {found.group(1)!r}), "
                + ("or upgrade transformers" if not remote_key else
                   f"upgrade transformers, or set {remote_key}=true for a model that ships its own code"))
    return ""


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def weight_headers(key: str, path: str) -> Optional[dict[str, list[int]]]:
    """``{tensor name: shape}`` of the local model folder ``path`` (config key ``key``) from its ``*.safetensors``
    headers alone; None for a hub id or other formats. Raises ``ModelError`` (naming the file): no weight files, a
    file cut short or with an unreadable header, or a shard named by the index missing."""
    import json
    import struct

    folder = os.path.expanduser(path)
    if not looks_local(path) or not os.path.isdir(folder):
        return None
    names = sorted(os.listdir(folder))
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, OSError) as err:
            raise ModelError(f"{key}={path!r}: {index} is not a safetensors index ({err}); copy it again") from None
        missing = [name for name in shards if name not in names]
        if missing:
            raise ModelError(f"{key}={path!r} is missing the weight file(s) {missing} that {index} names; copy "
                             "the whole model folder (every shard)")
    if not any(name.endswith(WEIGHT_SUFFIXES) for name in names):
        raise ModelError(f"{key}={path!r} holds no weights (no *.safetensors or *.bin file beside config.json); copy "
                         "the model's weight files into it, or give the folder that has them")
    shapes: dict[str, list[int]] = {}
    for name in (n for n in names if n.endswith(".safetensors")):
        file = os.path.join(folder, name)
        size = os.path.getsize(file)
        try:
            with open(file, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length)) if length <= size - 8 else None
        except (struct.error, ValueError, UnicodeDecodeError):
            header = None
        if not isinstance(header, dict):
            raise ModelError(f"{key}={path!r}: the weight file {file} has no readable safetensors header (a cut or "
                             "corrupt copy); copy it again")
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        needed = 8 + length + max((v["data_offsets"][1] for v in tensors.values()), default=0)
        if size < needed:
            raise ModelError(f"{key}={path!r}: the weight file {file} is cut short: it holds {size} of its {needed} "
                             "bytes; copy it again")
        shapes.update((k, v["shape"]) for k, v in tensors.items())
    return shapes or None


def check_model_fits(model_cfg: Any, hf_config: Any, tokenizer: Any, context: int) -> None:
    """The tokenizer's ids fit the embedding and ``context`` (prompt + response tokens) the model's positions. Raises
    ``ModelError`` (tokenizer larger than ``vocab_size``), ``ConfigError`` (beyond ``max_position_embeddings``)."""
    key = "worker.actor.model.model_path"
    text = hf_config.get_text_config()
    vocab = getattr(text, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        tok = model_cfg.tokenizer_path or model_cfg.model_path
        raise ModelError(f"the tokenizer of {tok!r} has {len(tokenizer)} tokens but the model {model_cfg.model_path!r} "
                         f"embeds only vocab_size={vocab}: ids beyond it would index past the embedding. Use the "
                         "model's own tokenizer (worker.actor.model.tokenizer_path=null) or a model of its family")
    positions = getattr(text, "max_position_embeddings", None)
    if positions is not None and context > positions:
        raise ConfigError(f"data.max_prompt_length + data.max_response_length = {context} tokens exceed the model's "
                          f"max_position_embeddings={positions} ({key}={model_cfg.model_path!r}); vLLM refuses such a "
                          "context: shorten them to fit")


def check_lora_targets(model_cfg: Any) -> None:
    """Every name of ``worker.actor.model.lora.target_modules`` is a module of the model (from its weight headers).
    Raises ``ConfigError`` naming the unknown targets and the model's layers with 2-D weights."""
    lora = model_cfg.lora
    if lora.rank > 0 and lora.target_modules.strip() != "all-linear":
        shapes = weight_headers("worker.actor.model.model_path", model_cfg.model_path) or {}
        linear = {name.split(".")[-2] for name, shape in shapes.items()
                  if name.endswith(".weight") and len(shape) == 2 and "embed" not in name}
        parts = {part for name in shapes for part in name.split(".")}
        from easyrl.models.lora import target_modules

        unknown = [t for t in target_modules(lora.target_modules) if shapes and t not in parts]
        if unknown:
            raise ConfigError(f"worker.actor.model.lora.target_modules names {unknown}, which the model "
                              f"{model_cfg.model_path!r} does not have; its linear layers are "
                              f"{', '.join(sorted(linear)[:12])} (or give all-linear)")


SCORE_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForRewardModel", "RewardModel")


def check_head(key: str, path: Optional[str], scorer: Optional[bool]) -> None:
    """The model at ``path`` (config key ``key``) has its role's head, read from ``architectures`` in its
    ``config.json``: a reward model (``scorer``) is a sequence classifier, the actor, a judge or teacher a language
    model (``scorer`` None: either). Raises ``ModelError`` naming the key, the architecture and the role the model
    would fit."""
    import json

    if not path or scorer is None:
        return
    file = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(file):
        import huggingface_hub

        cached = huggingface_hub.try_to_load_from_cache(path, "config.json")
        file = cached if isinstance(cached, str) else None
    try:
        with open(file, encoding="utf-8") as f:
            architectures = json.load(f).get("architectures") or []
    except (TypeError, OSError, ValueError, AttributeError):
        return  # no config.json to read here: the model's loader says what is wrong
    heads = [arch for arch in architectures if arch.endswith(SCORE_HEADS)]
    if scorer and architectures and not heads:
        raise ModelError(f"{key}={path!r} is a {architectures[0]}, a language model, not a sequence classifier: a "
                         "reward model gives one score per sequence (e.g. Skywork/Skywork-Reward-V2-Qwen3-0.6B). To "
                         "have a language model grade responses, give it as worker.reward.judge.model_path")
    if not scorer and heads:
        raise ModelError(f"{key}={path!r} is a {heads[0]}, a reward model's head (one score per sequence), not a "
                         "language model that predicts tokens: give an instruct model (...ForCausalLM), or use this "
                         "one as worker.reward.reward_model.model_path")


PROBE_MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is 3 + 4?"}]
SPECIAL_TOKENS = ("eos_token", "pad_token", "bos_token")


def check_teacher(config: Any, student_tokenizer: Any, teacher: Any) -> Any:
    """Check ``teacher`` (an ``easyrl.config.actor.Teacher`` of ``config``: ``worker.teacher`` or one of
    ``worker.teachers``) against the student's tokenizer; returns the teacher's tokenizer. Raises ``ModelError`` (it
    cannot be loaded) or ``ConfigError`` (vocabularies, special tokens or chat templates differ), naming its key."""
    from transformers import AutoTokenizer

    model = teacher.model
    teacher_tok_path = model.tokenizer_path or model.model_path
    teacher_tok = load_part(f"{teacher.key}.model.model_path", teacher_tok_path, "tokenizer",
                            AutoTokenizer.from_pretrained, model.trust_remote_code)
    actor = config.worker.actor.model
    student_path = actor.tokenizer_path or actor.model_path
    both = f"the teacher {teacher_tok_path!r} ({teacher.key}.model) and the student {student_path!r} " \
           "(worker.actor.model)"
    difference = vocabulary_difference(student_tokenizer, teacher_tok)
    if difference:
        raise ConfigError(f"{both} have different vocabularies ({difference}); on-policy distillation scores the "
                          "student's token ids with the teacher, so both need the same tokenizer: choose a teacher "
                          "of the student's model family.")
    for name in SPECIAL_TOKENS:
        mine, theirs = getattr(student_tokenizer, name, None), getattr(teacher_tok, name, None)
        if mine != theirs:
            raise ConfigError(f"{both} have different special tokens: {name} is {theirs!r} for the teacher and "
                              f"{mine!r} for the student; choose a teacher of the student's model family.")
    if config.data.override_chat_template is None:  # an override is the student's: the teacher sees its prompt ids
        mine, theirs = _render(student_tokenizer), _render(teacher_tok)
        if mine != theirs:
            raise ConfigError(f"{both} have different chat templates: a system + user prompt renders as "
                              f"{theirs!r} for the teacher and {mine!r} for the student; choose a teacher of the "
                              "student's model family, or set data.override_chat_template to the template both "
                              "were trained with.")
    return teacher_tok


def vocabulary_difference(student: Any, teacher: Any) -> str:
    """What differs between two tokenizers' vocabularies (token -> id, added tokens included), or ``""``."""
    mine, theirs = student.get_vocab(), teacher.get_vocab()
    if mine == theirs:
        return ""
    parts = [f"{len(mine)} tokens for the student, {len(theirs)} for the teacher"] if len(mine) != len(theirs) else []
    for token, index in sorted(mine.items(), key=lambda item: item[1]):
        if theirs.get(token) != index:
            where = f"id {theirs[token]}" if token in theirs else "absent"
            parts.append(f"{token!r} is id {index} for the student and {where} for the teacher")
            break
    else:
        extra = next(token for token in theirs if token not in mine)
        parts.append(f"the teacher has {extra!r} (id {theirs[extra]}), which the student lacks")
    return "; ".join(parts)


def _render(tokenizer: Any) -> str:
    """:data:`PROBE_MESSAGES` through the tokenizer's chat template, or a note that it has none."""
    if not getattr(tokenizer, "chat_template", None):
        return "<no chat template>"
    return tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False, add_generation_prompt=True)
