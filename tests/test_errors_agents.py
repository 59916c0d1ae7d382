"""Config errors of ``worker.rollout.multi_turn`` and ``worker.rollout.agent`` (docs/errors.md, ids A..): one ``easyrl: config error:`` line
naming the key, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

TOOLS = Path(__file__).parent / "agent_tools" / "tools.py"
ON = "worker.rollout.multi_turn.enable=true"
AGENT = "worker.rollout.agent.entry_point"
AGENT_FILE = Path(__file__).parent / "agent_tools" / "openai_agent.py"

CASES = [
    pytest.param([ON], ["worker.rollout.multi_turn.tools", "environment"], id="A01"),
    pytest.param([ON, "worker.rollout.multi_turn.tools=[tools.py]"], ["tools[0]", "path/to/file.py:function"],
                 id="A02"),
    pytest.param([ON, "worker.rollout.multi_turn.tools=[missing/tools.py:add]"], ["tools[0]", "no file"], id="A03"),
    pytest.param([ON, f"worker.rollout.multi_turn.tools=[{TOOLS}:add]", "worker.rollout.multi_turn.format=json"],
                 ["worker.rollout.multi_turn.format", "hermes"], id="A04"),
    pytest.param([ON, f"worker.rollout.multi_turn.tools=[{TOOLS}:add]", "worker.rollout.multi_turn.tool_timeout_s=0"],
                 ["worker.rollout.multi_turn.tool_timeout_s"], id="A05"),
    pytest.param([ON, f"worker.rollout.multi_turn.tools=[{TOOLS}:add]",
                  "worker.rollout.multi_turn.max_assistant_turns=0"], ["max_assistant_turns", "null"], id="A06"),
    pytest.param([ON, f"worker.rollout.multi_turn.tools=[{TOOLS}:add,{TOOLS}:add]"], ["more than once", "add"],
                 id="A07"),
    pytest.param([ON, f"worker.rollout.multi_turn.tools=[{TOOLS}:add]", "worker.rollout.multi_turn.patience=-1"],
                 ["worker.rollout.multi_turn.patience", "0 or more", "inf"], id="A11"),
    pytest.param([ON, f"worker.rollout.multi_turn.tools=[{TOOLS}:add]", f"{AGENT}={AGENT_FILE}:run"],
                 [AGENT, "worker.rollout.multi_turn.enable=true", "an agent calls its tools itself"], id="A13"),
    pytest.param([f"{AGENT}=missing/agent.py:run"], [AGENT, "no file"], id="A14"),
]


@pytest.mark.parametrize("words, culprits", CASES)
def test_multi_turn_config_error(expect_user_error, e2e_args, tmp_path, words, culprits):
    from easyrl.config import load_config

    expect_user_error(lambda: load_config(e2e_args("qwen2_5", tmp_path, *words)), "config", *culprits)


def test_an_agent_that_cannot_take_its_arguments_is_refused_before_ray(expect_user_error, e2e_args, tmp_path):  # A15
    from easyrl.config import load_config
    from easyrl.trainer.preflight import prepare

    agent = tmp_path / "agent.py"
    agent.write_text("def run(task):\n    return None\n")
    config = load_config(e2e_args("qwen2_5", tmp_path, f"{AGENT}={agent}:run"))
    expect_user_error(lambda: prepare(config), "config", AGENT, "run(task)", "base_url")


def test_a_tool_call_parser_vllm_does_not_have_is_refused_before_ray(expect_user_error, e2e_args, tmp_path):  # A16
    from easyrl.config import load_config
    from easyrl.trainer.preflight import prepare

    config = load_config(e2e_args("qwen2_5", tmp_path, f"{AGENT}={AGENT_FILE}:run",
                                  "worker.rollout.agent.tool_call_parser=hermess"))
    expect_user_error(lambda: prepare(config), "config", "worker.rollout.agent.tool_call_parser='hermess'",
                      "did you mean hermes")


def test_tool_without_schema_is_a_config_error_before_ray(expect_user_error, e2e_args, tmp_path):  # A08
    from easyrl.config import load_config
    from easyrl.trainer.preflight import prepare

    config = load_config(e2e_args("qwen2_5", tmp_path, ON, f"worker.rollout.multi_turn.tools=[{TOOLS}:no_docstring]"))
    expect_user_error(lambda: prepare(config), "config", "tools[0]", "no_docstring", "docstring")


def test_a_chat_template_that_drops_the_tools_is_warned_of(e2e_args, tmp_path, caplog):  # W11
    """SmolLM2's template ignores ``tools=``: the model would never hear of the tools (0 tool calls, no error)."""
    import logging

    from easyrl.config import load_config
    from easyrl.trainer.preflight import prepare

    turns = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    plain, with_tools = tmp_path / "plain.jinja", tmp_path / "tools.jinja"
    plain.write_text(turns)
    with_tools.write_text("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
                          + turns)
    tools = [ON, f"worker.rollout.multi_turn.tools=[{TOOLS}:add]", "data.image_key=null"]
    with caplog.at_level(logging.WARNING, logger="easyrl"):
        prepare(load_config(e2e_args("qwen2_5", tmp_path, *tools, f"data.override_chat_template={with_tools}")))
        assert "does not render the tools" not in caplog.text
        prepare(load_config(e2e_args("qwen2_5", tmp_path, *tools, f"data.override_chat_template={plain}")))
    assert f"worker.rollout.multi_turn.tools: {plain} does not render the tools (no 'add' in a prompt" in caplog.text
    assert "data.override_chat_template=FILE.jinja" in caplog.text
