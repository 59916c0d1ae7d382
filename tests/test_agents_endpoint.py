"""The agent endpoint without an engine: vLLM's OpenAI app over a scripted ``sample``, driven by the real ``openai``
client (chat with tools over three turns, streaming, completions, models, errors); the recorded prompt ids are what
vLLM's renderer renders (its ``/tokenize``), and the sessions' segments and masks are checked by hand. Plus the pure
segment assembly and the request-stream ``sample``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time

import pytest

from easyrl.agents.segments import RequestRecord, Segment, assemble_segments

ROOT_LEVEL_AT_IMPORT = logging.getLogger().level

# ------------------------------------------------------------------------------------------ segment assembly


def rec(prompt, response, log_probs="auto", index=0, versions=None, finish="stop"):
    if log_probs == "auto":
        log_probs = [-0.5] * len(response)
    return RequestRecord(list(prompt), list(response), log_probs, finish, index=index, versions=versions)


def test_first_request_is_its_own_segment():
    [segment] = assemble_segments([rec([1, 2, 3], [4, 5], [-0.1, -0.2], versions=[0, 0])])
    assert segment.prompt_ids == [1, 2, 3]
    assert segment.response_ids == [4, 5] and segment.response_mask == [1, 1]
    assert segment.log_probs == [-0.1, -0.2] and segment.versions == [0, 0]
    assert segment.requests == [0] and segment.finish_reason == "stop" and segment.sampled_tokens == 2
    assert assemble_segments([]) == []


def test_extension_continues_the_segment_with_masked_gap():
    records = [rec([1, 2], [3, 4], [-0.1, -0.2], 0, [0, 0]),
               rec([1, 2, 3, 4, 9, 9], [5], [-0.3], 1, [1], finish="length"),
               rec([1, 2, 3, 4, 9, 9, 5], [6, 7], [-0.4, -0.5], 2, [1, 2])]  # no gap at all
    [segment] = assemble_segments(records)
    assert segment.prompt_ids == [1, 2]
    assert segment.response_ids == [3, 4, 9, 9, 5, 6, 7]
    assert segment.response_mask == [1, 1, 0, 0, 1, 1, 1]
    assert segment.log_probs == [-0.1, -0.2, 0.0, 0.0, -0.3, -0.4, -0.5]
    assert segment.versions == [0, 0, -1, -1, 1, 1, 2]
    assert segment.requests == [0, 1, 2] and segment.finish_reason == "stop"
    assert segment.sequence == [1, 2, 3, 4, 9, 9, 5, 6, 7]


def test_retokenization_break_starts_a_new_segment():
    # the agent's framework re-rendered the sampled [3, 4] as [3, 8]: request 1 cannot continue segment 0
    records = [rec([1, 2], [3, 4], index=0), rec([1, 2, 3, 8, 9], [5], index=1),
               rec([1, 2, 3, 8, 9, 5, 6], [7], index=2)]
    first, second = assemble_segments(records)
    assert first.requests == [0] and first.response_ids == [3, 4]
    assert second.prompt_ids == [1, 2, 3, 8, 9] and second.requests == [1, 2]
    assert second.response_ids == [5, 6, 7] and second.response_mask == [1, 0, 1]
    # a prompt shorter than the segment so far (a truncated history) breaks too
    assert len(assemble_segments([rec([1, 2], [3, 4]), rec([1, 2, 3], [5])])) == 2


def test_empty_responses():
    records = [rec([1, 2], [], index=0), rec([1, 2, 7], [3], index=1)]
    [segment] = assemble_segments(records)
    assert segment.response_ids == [7, 3] and segment.response_mask == [0, 1] and segment.log_probs == [0.0, -0.5]
    [alone] = assemble_segments([rec([1, 2], [], index=0, finish="abort")])
    assert alone.response_ids == [] and alone.sampled_tokens == 0 and alone.finish_reason == "abort"
    # an empty response followed by an identical prompt: still one segment, nothing added
    [same] = assemble_segments([rec([1, 2], [], index=0), rec([1, 2], [4], index=1)])
    assert same.response_ids == [4] and same.requests == [0, 1]


def test_side_conversation_does_not_break_the_main_one():
    records = [rec([1, 2], [3], index=0),            # main conversation
               rec([50, 51], [52], index=1),         # a side call (a summary, a sub-agent)
               rec([1, 2, 3, 9], [4], index=2)]      # the main conversation goes on
    main, side = assemble_segments(records)
    assert main.requests == [0, 2] and main.response_ids == [3, 9, 4] and main.response_mask == [1, 0, 1]
    assert side.requests == [1]
    # the longest segment that fits takes the request
    records = [rec([1], [2], index=0), rec([1, 2, 3], [4], index=1), rec([1, 2, 3, 4, 5], [6], index=2)]
    assert [s.requests for s in assemble_segments(records)] == [[0, 1, 2]]


def test_a_segments_routing_is_its_requests_and_its_gap_tokens_route_by_themselves():
    """Routing replay through the endpoint: a segment keeps each request's engine routing; the batch takes each
    position's from the first request that ran it, and the gap tokens (mask 0) the actor's own (-1)."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    from easyrl.batch import Batch
    from easyrl.trainer.rollout import turns_routing_batch

    first = RequestRecord([1, 2], [3, 4], None, "stop", index=0, routed_experts=np.array([[[0]], [[1]], [[2]]]))
    second = RequestRecord([1, 2, 3, 4, 9], [5], None, "stop", index=1,
                           routed_experts=np.array([[[-1]], [[-1]], [[-1]], [[7]], [[8]]]))
    [segment] = assemble_segments([first, second])
    assert segment.response_mask == [1, 1, 0, 1] and len(segment.routings) == 2
    batch = Batch(TensorDict({"prompt_mask": torch.tensor([[0, 1, 1]]),
                              "response_mask": torch.tensor([segment.response_mask + [0]])}, batch_size=[1]), {})
    routed = turns_routing_batch(batch, [segment.routings], [segment.sequence])
    # the gap token 9 keeps its own (the engine's 8 dropped); the last sampled token never ran
    assert routed[0, :, 0, 0].tolist() == [-1, 0, 1, 2, 7, -1, -1, -1]


def test_missing_log_probs_and_versions_propagate():
    [segment] = assemble_segments([rec([1], [2], None, 0, [0]), rec([1, 2, 3], [4], [-0.1], 1, None)])
    assert segment.log_probs is None and segment.versions is None and segment.response_mask == [1, 0, 1]
    with pytest.raises(ValueError, match="log-probs"):
        assemble_segments([rec([1], [2, 3], [-0.1])])
    with pytest.raises(ValueError, match="does not extend"):
        Segment([1, 2]).extend(rec([1, 3], [4]))


# ------------------------------------------------------------------------------------- the request-stream sample


class FakeStream:
    def __init__(self):
        self.submitted = []

    def submit(self, prompts, overrides):
        self.submitted.append((prompts, overrides))
        return len(self.submitted) - 1

    def wait(self, sid):
        prompts, _ = self.submitted[sid]
        n = prompts["max_tokens"][0]
        return [(list(range(100, 100 + n)), [-1.0] * n, [7] * n, None)]  # RequestStream's samples


def test_stream_sample_submits_token_prompts():
    from types import SimpleNamespace

    from easyrl.trainer.agent_endpoint.stream import stream_sample
    from easyrl.batch import Batch
    from easyrl.trainer.request_stream import token_prompt
    from easyrl.trainer.rollout import for_rollout

    stream = FakeStream()
    session = SimpleNamespace(id="s0")
    params = SimpleNamespace(max_tokens=3, seed=5, temperature=0.2, top_p=0.9, top_k=4)
    assert stream_sample(lambda: stream, 8)(session, [1, 2], params).result(5) == (
        [100, 101, 102], [-1.0] * 3, None, [7] * 3, None)
    prompts, overrides = stream.submitted[0]
    assert overrides is None
    assert prompts["raw_prompt_ids"] == [[1, 2]] and prompts["uid"] == ["s0"] and prompts["images"] == [[]]
    assert prompts["max_tokens"] == [3] and prompts["rollout_seed"] == [5]
    params.max_tokens, params.seed = 50, None
    stream_sample(lambda: stream, 8, follow_sampling=True)(session, [1], params).result(5)
    prompts, overrides = stream.submitted[1]
    assert prompts["max_tokens"] == [8] and "rollout_seed" not in prompts  # cut to the response length
    assert overrides == {"temperature": 0.2, "top_p": 0.9, "top_k": 4}
    both = Batch.cat([for_rollout(token_prompt([1], 2, "a", 1)), for_rollout(token_prompt([2, 3], 4, "b", 2))])
    assert len(both) == 2 and both["raw_prompt_ids"] == [[1], [2, 3]] and both["rollout_seed"] == [1, 2]


# ----------------------------------------------------------------------------------------------- the endpoint

# A Qwen2.5-style (hermes) template that renders tools, tool calls and tool results (the tiny model's own renders
# none): tools in the system turn, calls as <tool_call> JSON, results as a user turn of <tool_response>.
TOOL_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.' -}}"
    "{%- if tools -%}{{- '\\n<tools>' -}}{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>' -}}{%- endif -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' -}}"
    "{{- (call['function']['arguments'] | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
MODEL = "tiny-qwen"
MAX_LEN = 384


def call_text(a, b, compact=False):
    body = {"name": "add", "arguments": {"a": a, "b": b}}
    return "<tool_call>\n" + (json.dumps(body, separators=(",", ":")) if compact else json.dumps(body)) + \
        "\n</tool_call>"


@pytest.fixture(scope="module")
def tiny_path():
    from easyrl.testing.tiny import build_tiny_model

    return str(build_tiny_model("qwen2_5"))


@pytest.fixture(scope="module")
def tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="module")
def endpoint(tiny_path, tokenizer):
    """One endpoint for the module. Each session's ``data["replies"]``: the texts its requests sample, in order
    (``"<eos>"`` appended as <|im_end|>, ``"!raise"`` to fail); log-prob of the i-th token: -0.01 * (i + 1)."""
    from easyrl.trainer.agent_endpoint.server import AgentEndpoint

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pool = concurrent.futures.ThreadPoolExecutor(16)
    seen = []

    def sample(session, prompt_ids, params):
        seen.append((session.id, list(prompt_ids), params))
        reply = session.data["replies"][session.data.setdefault("turn", 0)]
        session.data["turn"] += 1
        if reply == "!raise":
            raise RuntimeError("the engine fell over")
        ids = tokenizer.encode(reply.replace("<eos>", ""), add_special_tokens=False)
        ids += [eos] * reply.endswith("<eos>")
        result = (ids, [-0.01 * (i + 1) for i in range(len(ids))], None)
        if session.data.get("gate") is not None:  # held until the test opens the gate
            return pool.submit(lambda: session.data["gate"].wait(30) and result)
        if session.data.get("future"):
            return pool.submit(lambda: time.sleep(session.data.get("delay", 0.0)) or result)
        if session.data.get("coroutine"):
            async def later():
                await asyncio.sleep(0)
                return result
            return later()
        return result

    server = AgentEndpoint(tiny_path, sample, served_model_name=MODEL, tool_call_parser="hermes",
                           chat_template=TOOL_TEMPLATE, max_model_len=MAX_LEN)
    server.start()
    server.seen = seen
    yield server
    server.stop()
    pool.shutdown()


def client_of(session):
    import openai

    return openai.OpenAI(base_url=session.base_url, api_key="unused", max_retries=0, timeout=60)


def rendered(endpoint, messages, tools=None):
    """vLLM's renderer's ids for ``messages`` (its ``/tokenize`` route)."""
    import httpx

    body = {"model": MODEL, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    reply = httpx.post(f"{endpoint.url}/tokenize", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def test_starting_the_endpoint_keeps_the_root_log_level(endpoint):
    # vLLM's app imports model_hosting_container_standards, which sets the root logger to ERROR
    assert logging.getLogger().level == ROOT_LEVEL_AT_IMPORT


def test_chat_tool_loop_is_recorded_token_exact(endpoint, tokenizer):
    replies = [call_text(1, 2) + "<eos>", call_text(3, 4) + "<eos>", "The sum is 10.<eos>"]
    session = endpoint.open_session(data={"replies": replies, "future": True})
    client = client_of(session)
    messages = [{"role": "user", "content": "Add 1 and 2, then 3 and 4."}]
    prompts = []
    for turn in range(3):
        prompts.append(rendered(endpoint, messages, TOOLS))
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, logprobs=True)
        message = reply.choices[0].message
        if turn < 2:
            assert reply.choices[0].finish_reason == "tool_calls"
            [call] = message.tool_calls
            assert call.function.name == "add"
            arguments = json.loads(call.function.arguments)
            assert arguments == ({"a": 1, "b": 2} if turn == 0 else {"a": 3, "b": 4})
            messages.append(message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(sum(arguments.values()))})
        else:
            assert reply.choices[0].finish_reason == "stop" and message.content == "The sum is 10."
            served = [item.logprob for item in reply.choices[0].logprobs.content]
            assert served == pytest.approx([-0.01 * (i + 1) for i in range(len(served))])
    endpoint.close_session(session)
    records = session.records
    assert [r.route for r in records] == ["/v1/chat/completions"] * 3 and [r.index for r in records] == [0, 1, 2]
    for record, prompt, reply in zip(records, prompts, replies):
        assert record.prompt_ids == prompt  # the ids vLLM's renderer rendered, as the engine took them
        ids = tokenizer.encode(reply.replace("<eos>", ""), add_special_tokens=False)
        assert record.response_ids == ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        assert record.log_probs == pytest.approx([-0.01 * (i + 1) for i in range(len(record.response_ids))])
        assert record.finish_reason == "stop"
    assert "<tools>" in tokenizer.decode(records[0].prompt_ids)
    # the renderer re-rendered each served tool call to the very ids sampled: one segment, masks by hand
    [segment] = session.segments()
    assert segment.prompt_ids == records[0].prompt_ids and segment.requests == [0, 1, 2]
    gaps = [records[i + 1].prompt_ids[len(records[i].prompt_ids) + len(records[i].response_ids):] for i in range(2)]
    expected = []
    for i, record in enumerate(records):
        expected += [1] * len(record.response_ids) + ([0] * len(gaps[i]) if i < 2 else [])
    assert segment.response_mask == expected
    assert segment.sampled_tokens == sum(len(r.response_ids) for r in records)
    assert tokenizer.decode(gaps[0]) == "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n" \
                                        "<|im_start|>assistant\n"
    assert [lp for lp, m in zip(segment.log_probs, segment.response_mask) if m] == pytest.approx(
        [lp for r in records for lp in r.log_probs])
    assert segment.sequence == records[2].prompt_ids + records[2].response_ids
    # what the engine was asked: the rendered ids, vLLM's SamplingParams with the EOS from the generation config
    session_id, prompt_ids, params = [s for s in endpoint.seen if s[0] == session.id][0]
    assert prompt_ids == prompts[0] and params.max_tokens == MAX_LEN - len(prompts[0]) and params.n == 1


def test_retokenization_break_shows_as_a_second_segment(endpoint):
    # a compact tool call: vLLM re-renders it with spaces, so the next prompt does not extend what was sampled
    session = endpoint.open_session(data={"replies": [call_text(1, 2, compact=True) + "<eos>", "3<eos>"],
                                          "coroutine": True})
    client = client_of(session)
    messages = [{"role": "user", "content": "Add 1 and 2."}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    [call] = reply.choices[0].message.tool_calls
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "3"}]
    client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    first, second = endpoint.close_session(session).segments()
    assert first.requests == [0] and second.requests == [1]
    assert second.prompt_ids == session.records[1].prompt_ids


def test_streaming_serves_per_token_deltas(endpoint, tokenizer):
    session = endpoint.open_session(data={"replies": ["Hello there, friend.<eos>", call_text(5, 6) + "<eos>"]})
    client = client_of(session)
    messages = [{"role": "user", "content": "Say hello."}]
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello there, friend."
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1  # deltas, not one block
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.completion_tokens == len(session.records[0].response_ids)
    # a streamed tool call: vLLM's streaming hermes parser gets the per-token deltas
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, stream=True))
    calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "add"
    assert json.loads("".join(call.function.arguments or "" for call in calls)) == {"a": 5, "b": 6}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    endpoint.close_session(session)
    assert [len(r.response_ids) for r in session.records] == [
        len(tokenizer.encode(t.replace("<eos>", ""), add_special_tokens=False)) + 1
        for t in session.data["replies"]]


def test_completions_models_stop_strings_and_the_api_key(endpoint, tokenizer):
    import openai

    session = endpoint.open_session(data={"replies": ["one two three four", "five six"]})
    # the session id as the API key on the plain /v1
    client = openai.OpenAI(base_url=endpoint.url + "/v1", api_key=session.api_key, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list()] == [MODEL]
    reply = client.completions.create(model=MODEL, prompt="Count:", max_tokens=16, stop=[" three"])
    assert reply.choices[0].text == "one two" and reply.choices[0].finish_reason == "stop"
    record = session.records[0]
    assert record.route == "/v1/completions"
    assert record.prompt_ids == tokenizer.encode("Count:", add_special_tokens=False)
    # cut after the token that completed the stop string, as vLLM cuts it
    assert tokenizer.decode(record.response_ids) == "one two three" and record.finish_reason == "stop"
    reply = client.completions.create(model=MODEL, prompt="More:", max_tokens=1)
    assert reply.choices[0].finish_reason == "length" and len(session.records[1].response_ids) == 1
    endpoint.close_session(session)


def test_anthropic_messages_and_responses_routes(endpoint, tokenizer):
    anthropic = pytest.importorskip("anthropic")

    session = endpoint.open_session(data={"replies": ["Hi from Claude.<eos>", "Hi again.<eos>"]})
    reply = anthropic.Anthropic(base_url=session.root_url, api_key="unused", max_retries=0).messages.create(
        model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "hello"}])
    assert reply.content[0].text == "Hi from Claude." and reply.stop_reason == "end_turn"
    reply = client_of(session).responses.create(model=MODEL, input="hello", max_output_tokens=32)
    assert reply.output_text == "Hi again."
    endpoint.close_session(session)
    assert [r.route for r in session.records] == ["/v1/messages", "/v1/responses"]
    assert "hello" in tokenizer.decode(session.records[0].prompt_ids)
    with pytest.raises(ValueError, match="letters, digits"):
        endpoint.open_session("a/b")


def test_bad_requests_get_openai_errors_and_are_counted(endpoint):
    import httpx
    import openai

    before = endpoint.counts()
    session = endpoint.open_session(data={"replies": ["!raise", "fine<eos>"]})
    client = client_of(session)
    too_long = [{"role": "user", "content": "word " * (2 * MAX_LEN)}]
    with pytest.raises(openai.BadRequestError, match="context length|maximum"):
        client.chat.completions.create(model=MODEL, messages=too_long)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    malformed = httpx.post(f"{session.base_url}/chat/completions", json={"model": MODEL, "messages": "nope"})
    assert malformed.status_code == 400 and "error" in malformed.json()
    with pytest.raises(openai.InternalServerError):  # sample raised: a 500, the server goes on
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]).choices[0].message.content == "fine"
    nobody = openai.OpenAI(base_url=endpoint.url + "/v1", api_key="not-a-session", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="no open agent session"):
        nobody.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    endpoint.close_session(session)
    with pytest.raises(openai.NotFoundError, match="no open agent session"):  # a closed session's URL
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert len(session.records) == 1 and session.errors == 5
    assert session.errors_by_status == {400: 3, 404: 1, 500: 1}
    after = endpoint.counts()
    assert after["failed"] - before["failed"] == 1 and after["refused"] - before["refused"] >= 2
    assert after["http_errors"] - before["http_errors"] == 7


def test_concurrent_sessions_are_attributed_apart(endpoint, tokenizer):
    sessions = [endpoint.open_session(data={"replies": [f"first {i}<eos>", f"second {i}<eos>"], "future": True,
                                            "delay": 0.05 * (i % 3)}) for i in range(8)]

    def run(i):
        client = client_of(sessions[i])
        messages = [{"role": "user", "content": f"agent {i}"}]
        for _ in range(2):
            reply = client.chat.completions.create(model=MODEL, messages=messages)
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": "again"}]
        return messages

    with concurrent.futures.ThreadPoolExecutor(8) as threads:
        conversations = list(threads.map(run, range(8)))
    for i, (session, messages) in enumerate(zip(sessions, conversations)):
        endpoint.close_session(session)
        assert [m["content"] for m in messages if m["role"] == "assistant"] == [f"first {i}", f"second {i}"]
        assert f"agent {i}" in tokenizer.decode(session.records[0].prompt_ids)
        [segment] = session.segments()
        assert segment.requests == [0, 1]


def test_a_client_that_leaves_or_a_closed_session_records_nothing(endpoint):
    import httpx

    before = endpoint.counts()
    gate = threading.Event()
    session = endpoint.open_session(data={"replies": ["late<eos>"], "gate": gate})
    with pytest.raises(httpx.TimeoutException):  # the agent's own timeout: it hangs up while the engine samples
        httpx.post(f"{session.base_url}/chat/completions", timeout=1.0,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    deadline = time.time() + 30
    while endpoint.counts()["aborted"] == before["aborted"] and time.time() < deadline:
        time.sleep(0.05)
    gate.set()
    assert endpoint.counts()["aborted"] == before["aborted"] + 1 and session.records == []
    # a request in flight when its session closes is served but not recorded
    gate = threading.Event()
    session = endpoint.open_session(data={"replies": ["late<eos>"], "gate": gate})
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        pending = threads.submit(client_of(session).chat.completions.create, model=MODEL,
                                 messages=[{"role": "user", "content": "hi"}])
        while not session.data.get("turn"):
            time.sleep(0.02)
        endpoint.close_session(session)
        gate.set()
        assert pending.result(30).choices[0].message.content == "late"
    assert session.records == []
