"""Log-probs of a fixed continuation under an exported Hugging Face folder, in transformers and in vLLM.

Usage: ``python score_exported.py MODEL_DIR PROMPT_IDS_JSON RESPONSE_IDS_JSON``; prints one JSON line
``{"transformers": [...], "vllm": [...]}`` with the log-prob of each response token given everything before it.
Runs in its own process so that vLLM's in-process engine does not share the test process.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    path, prompt, response = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    ids = prompt + response
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, len(prompt) - 1:-1].float()
    hf = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=512, seed=0)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
    out = llm.generate([{"prompt_token_ids": ids}], sampling_params=params, use_tqdm=False)[0]
    steps = out.prompt_logprobs[len(prompt):]
    vllm = [step[tok].logprob for step, tok in zip(steps, response)]
    print(json.dumps({"transformers": hf, "vllm": vllm}))


if __name__ == "__main__":
    main()
