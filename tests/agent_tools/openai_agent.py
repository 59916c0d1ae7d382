"""The e2e test's agent (``tests/test_e2e_agent.py``), written with the official ``openai`` client as a user would:
three chat turns (the second and third a user follow-up after the model's answer), and a session that raises (the
first call in the process: counted, the run goes on). It returns what it was served, every reply's text, for the
test to compare with the trained tokens."""

import threading

import openai

_LOCK = threading.Lock()
_CALLS = [0]


def run(task: dict, base_url: str, api_key: str, model: str) -> dict:
    with _LOCK:
        _CALLS[0] += 1
        first = _CALLS[0] == 1
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    if first:
        client.models.list()  # the endpoint answers; then the agent fails: counted in agent/failed
        raise RuntimeError("the test agent's planted failure")
    messages = [{"role": "user", "content": task["prompt"]}]
    replies = []
    for turn in range(3):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6).choices[0].message
        replies.append(reply.content or "")
        messages += [{"role": "assistant", "content": reply.content or ""},
                     {"role": "user", "content": f"Check step {turn + 1} and go on."}]
    return {"answer": replies[-1], "replies": replies}
