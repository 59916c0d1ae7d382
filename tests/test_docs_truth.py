"""The docs tell the truth: every config key, command, repository path and metric name that README.md and docs/*.md
mention exists.

What is extracted (from inline code spans and fenced code blocks; paths and links also from the prose):

- config keys: dotted words starting with a section (``data.``, ``algorithm.``, ``worker.``, ``trainer.``), braces
  expanded (``worker.{actor,ref}.x``), checked against ``easyrl.config.valid_keys(PPOConfig)`` (anything below a
  free-form dict such as ``worker.reward.reward_function_kwargs`` is accepted);
- commands: ``python -m easyrl.X`` (the module exists), ``easyrl X`` (the console script accepts ``X --help``),
  ``make X`` (a Makefile target), ``--extra X`` / ``easyrl[X]`` (an extra of pyproject.toml);
- paths: ``easyrl/``, ``examples/``, ``docs/``, ``tests/``, ``bench/`` paths (globs allowed) and relative markdown
  links exist on disk; ``tests/x.py::test_name`` names a test function of that file;
- metric names: ``actor/...``, ``critic/...``, ``timing_s/...``, ``perf/...``, ... are emitted by the code: a string
  literal of easyrl/ equal to the name, or an f-string such as ``f"{prefix}/mean"`` / ``f"timing_s/{name}"`` whose
  holes are filled by string literals of easyrl/ (``"critic/score"``, ``"gen"``). ``<name>``, ``*`` and ``...``
  are wildcards: some emitted name must have the prefix before them.
"""

from __future__ import annotations

import ast
import contextlib
import glob
import io
import os
import re
import tomllib

import pytest

from easyrl.config import PPOConfig, valid_keys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))

SECTIONS = ("data", "algorithm", "worker", "trainer")
METRIC_ROOTS = ("actor", "critic", "reward", "val", "timing_s", "perf", "response_length", "prompt_length",
                "dynamic_sampling", "rollout", "async")
PATH_ROOTS = ("easyrl", "examples", "docs", "tests", "bench")

# Deliberate mentions of names that are not easyrl's (other libraries' keys in comparisons and migration notes).
# Each entry: the exact token as written, and why it is allowed.
ALLOWED: dict[str, str] = {
    "data.rollout_bach_size": "a deliberate typo: the example of the unknown-key error (config.md, errors.md C1)",
    "worker.rollout.tempreature": "a deliberate typo: the example of the unknown-key error (errors.md)",
    "data.max_promt_length": "a deliberate typo: the example of several unknown keys at once (errors.md C63)",
    "trainer.max_step": "a deliberate typo: the example of several unknown keys at once (errors.md C63)",
    "data.max_prompt_length.a": "the unknown key an earlier easyrl reported for a mapping value (errors.md C83)",
    "worker.model_runner.get_model": "vLLM's worker attribute path, not a config key (vllm-versions.md)",
    "actor/.metadata": "a checkpoint's file, named by the export's error (errors.md X07), not a metric",
    "val/reward/lenght": "a deliberate typo: the example of a best metric the validation never logs (errors.md R14)",
    **{key: "verl's key in the migration table of docs/migrating.md" for key in (
        "data.train_batch_size", "data.gen_batch_size", "algorithm.kl_ctrl.type", "algorithm.filter_groups.enable",
        "trainer.total_training_steps", "trainer.test_freq", "trainer.default_local_dir",
        "trainer.max_actor_ckpt_to_keep", "trainer.log_val_generations", "algorithm.rollout_correction.bypass_mode")},
}

CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?$(.*?)^```", re.S | re.M)
BRACES = re.compile(r"\{([^{}]*)\}")
KEY = re.compile(r"(?<![\w./\-{])((?:%s)\.[\w.{},]*\w\}?)" % "|".join(SECTIONS))
METRIC = re.compile(r"(?<![\w./\-])((?:%s)/[\w/{},.<>*-]*)" % "|".join(METRIC_ROOTS))
PATH = re.compile(r"(?<![\w./\-])((?:%s)/[\w./*-]*)" % "|".join(PATH_ROOTS))
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
PY_MODULE = re.compile(r"python3? -m (easyrl(?:\.\w+)*)")
CLI = re.compile(r"^easyrl ((?:--)?[a-z][a-z-]*)(?![\w:\[])")
MAKE = re.compile(r"\bmake ([a-z][\w-]*)")
EXTRA = re.compile(r"--extra ([\w-]+)|easyrl\[([\w,-]+)\]")
FILE_SUFFIX = re.compile(r"\.(py|md|yaml|yml|json|jsonl|pt|png|html|sh|txt|toml)$")


def _read(doc: str) -> str:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        return f.read()


def code_fragments(text: str) -> list[str]:
    """Inline code spans and the lines of fenced code blocks."""
    fragments = [line.strip() for block in FENCE.findall(text) for line in block.splitlines() if line.strip()]
    outside = FENCE.sub("", text)
    return fragments + CODE_SPAN.findall(outside)


def expand_braces(token: str) -> list[str]:
    """``a.{b,c}.d`` -> ``a.b.d``, ``a.c.d`` (every brace group, in order); ``{...}`` stays a wildcard."""
    match = BRACES.search(token)
    if match is None or match.group(1) in ("...", "…"):
        return [token]
    head, tail = token[: match.start()], token[match.end():]
    return [out for choice in match.group(1).split(",") for out in expand_braces(head + choice.strip() + tail)]


# -- what exists --------------------------------------------------------------------------------------------------


def _code_strings() -> tuple[set[str], list[re.Pattern]]:
    """String literals of easyrl/ (docstrings excluded) and f-strings holding a ``/`` turned into patterns."""
    literals: set[str] = set()
    patterns: list[re.Pattern] = []
    for path in glob.glob(os.path.join(ROOT, "easyrl", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                literals.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                parts = [re.escape(v.value) if isinstance(v, ast.Constant) else r"([\w/]+)" for v in node.values]
                if any(isinstance(v, ast.Constant) and "/" in str(v.value) for v in node.values):
                    patterns.append(re.compile("".join(parts)))
    return literals, patterns


LITERALS, FSTRINGS = _code_strings()


def metric_emitted(name: str) -> bool:
    """``name`` is a string literal of the code, or an f-string of the code filled with literals."""
    if name in LITERALS:
        return True
    for pattern in FSTRINGS:
        match = pattern.fullmatch(name)
        if match and all(group in LITERALS or group.rstrip("/") in LITERALS for group in match.groups()):
            return True
    return False


def metric_prefix_emitted(prefix: str) -> bool:
    """Some emitted name starts with ``prefix`` (for ``reward/<name>``, ``timing_s/*``, ``critic/returns/{...}``):
    a literal that starts with it, or an f-string whose text before its first hole does."""
    if any(literal.startswith(prefix.rstrip("/")) for literal in LITERALS):
        return True
    return any(re.sub(r"\(.*", "", pattern.pattern).replace("\\", "").startswith(prefix) for pattern in FSTRINGS)


KEYS = valid_keys(PPOConfig)
FREE_DICTS = [key for key, is_dict in KEYS.items() if is_dict]


def key_exists(key: str) -> bool:
    """A config key, a key inside a free-form dict, a prefix written as ``trainer.val_*`` (``trainer.val_``), or an
    EasyR1 key that load_config maps (easyrl/config/aliases.py, docs/migrating.md)."""
    from easyrl.config.aliases import ALIASES

    return (key in KEYS or any(key.startswith(free + ".") for free in FREE_DICTS)
            or (key.endswith("_") and any(known.startswith(key) for known in KEYS))
            or any(alias == key or alias.startswith(key + ".") for alias in ALIASES))


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", _read("Makefile"), re.M))


def extras() -> set[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return set(tomllib.load(f)["project"]["optional-dependencies"])


def cli_accepts(word: str) -> bool:
    """``easyrl WORD --help`` (or ``easyrl --flag``) exits 0."""
    from easyrl.cli import main

    argv = [word] if word.startswith("--") else [word, "--help"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code
    return status in (0, None)


def module_exists(module: str) -> bool:
    parts = module.split(".")
    base = os.path.join(ROOT, *parts)
    return os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__main__.py"))


def path_exists(path: str, relative_to: str = ROOT) -> bool:
    path = path.rstrip(".,;")
    full = os.path.normpath(os.path.join(relative_to, path))
    return bool(glob.glob(full)) if "*" in path else os.path.exists(full)


# -- the mismatches of one document ----------------------------------------------------------------------------


def mismatches(doc: str) -> list[str]:
    return find_mismatches(_read(doc), os.path.dirname(os.path.join(ROOT, doc)))


def find_mismatches(text: str, folder: str) -> list[str]:
    """Every mention in ``text`` (a markdown document in ``folder``) that does not exist, as ``"<kind> <name>"``."""
    fragments = code_fragments(text)
    wrong: list[str] = []
    for fragment in fragments:
        for token in KEY.findall(fragment):
            if FILE_SUFFIX.search(token) or token in ALLOWED:
                continue
            wrong += [f"config key {key}" for key in expand_braces(token) if not key_exists(key.rstrip("."))]
        for token in METRIC.findall(fragment):
            token = token.rstrip(".,")
            if FILE_SUFFIX.search(token) or token.endswith("/") or token in ALLOWED:
                continue
            for name in expand_braces(token):
                wild = re.search(r"<[^>]*>|\*|\{\.\.\.\}|\.\.\.", name)
                ok = metric_prefix_emitted(name[: wild.start()]) if wild else metric_emitted(name)
                if not ok:
                    wrong.append(f"metric {name}")
        wrong += [f"module python -m {m}" for m in PY_MODULE.findall(fragment) if not module_exists(m)]
        match = CLI.match(fragment)
        if match and not cli_accepts(match.group(1)):
            wrong.append(f"command easyrl {match.group(1)}")
        wrong += [f"make target {t}" for t in MAKE.findall(fragment) if t not in make_targets()]
        for single, listed in EXTRA.findall(fragment):
            wrong += [f"extra {e}" for e in (single or listed).split(",") if e and e not in extras()]
    for path in PATH.findall(text):
        if not path_exists(path):
            wrong.append(f"path {path}")
    for path, test in TEST_REF.findall(text):
        if os.path.isfile(os.path.join(ROOT, path)) and not re.search(rf"^def {test}\(", _read(path), re.M):
            wrong.append(f"test {path}::{test}")
    for target in LINK.findall(text):
        if not target.startswith(("http://", "https://", "mailto:")) and \
                not path_exists(target, folder):
            wrong.append(f"link {target}")
    return sorted(set(wrong))


@pytest.mark.parametrize("doc", DOCS)
def test_doc_mentions_exist(doc):
    assert mismatches(doc) == []


def emitted_metrics() -> set[str]:
    """Metric names the code emits, as far as they can be read off it: metric-shaped string literals, the phases of
    ``timer("name", ...)`` (``timing_s/name``), the prefixes of ``_stats("prefix", ...)`` (``/mean``, ``/max``,
    ``/min``) and ``f"{role}/name"`` for both roles (actor, critic)."""
    shape = re.compile(r"(?:%s)/[\w/]*[a-z0-9]" % "|".join(METRIC_ROOTS))
    names = {literal for literal in LITERALS if shape.fullmatch(literal)}
    for path in glob.glob(os.path.join(ROOT, "easyrl", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                if node.func.id == "timer":
                    names.add(f"timing_s/{node.args[0].value}")
                elif node.func.id == "_stats":
                    names.discard(node.args[0].value)
                    names.update(f"{node.args[0].value}/{stat}" for stat in ("mean", "max", "min"))
            elif isinstance(node, ast.JoinedStr) and len(node.values) == 2 \
                    and isinstance(node.values[0], ast.FormattedValue) \
                    and isinstance(node.values[0].value, ast.Name) and node.values[0].value.id == "role":
                names.update(f"{role}{node.values[1].value}" for role in ("actor", "critic"))
    return names


def test_metrics_doc_lists_every_emitted_metric():
    """The other direction, for docs/metrics.md: every metric the code emits is listed there by its full name (or
    under a family such as ``reward/<name>``, ``critic/returns/{...}``; a bare root like ``perf/*`` is not enough)."""
    documented, families = set(), []
    for fragment in code_fragments(_read("docs/metrics.md")):
        for token in METRIC.findall(fragment):
            for name in expand_braces(token.rstrip(".,")):
                wild = re.search(r"<[^>]*>|\*|\{\.\.\.\}|\.\.\.", name)
                if wild is None:
                    documented.add(name)
                    continue
                family = name[: wild.start()]
                if family.count("/") >= 2 or family.rstrip("/") in ("reward", "val/reward"):
                    families.append(family)
    missing = sorted(name for name in emitted_metrics()
                     if name not in documented and not any(name.startswith(family) for family in families))
    assert missing == [], f"emitted but not in docs/metrics.md: {missing}"


@pytest.mark.parametrize("source", ["pyproject.toml", "Makefile", "Dockerfile", "config.yaml",
                                    "easyrl/trainer/__main__.py"])
def test_paths_named_by_project_files_exist(source):
    """The pointers outside the docs: pyproject's comments (docs/environment.md), the Makefile, the Dockerfile,
    config.yaml's values and comments, ``python -m easyrl.trainer --help``."""
    assert [path for path in PATH.findall(_read(source)) if not path_exists(path)] == []


# -- the extractor itself -------------------------------------------------------------------------------------------


def test_extractor_finds_each_kind(tmp_path):
    text = ("Set `worker.actor.no_such_key=1` and `data.max_pixels`; run `python -m easyrl.nope`, `make nope`, "
            "`easyrl nope`, `uv sync --extra nope`; see easyrl/nope.py and [x](nope.md); metrics `actor/no_such`, "
            "`critic/score/{mean,nope}`, `timing_s/<phase>`, `actor/pg_loss`, `reward/<name>`, `nope/x`.\n"
            "```bash\npython -m easyrl.trainer trainer.nope=1\nmake test\n```\n")
    assert find_mismatches(text, str(tmp_path)) == sorted([
        "command easyrl nope", "config key trainer.nope", "config key worker.actor.no_such_key", "extra nope",
        "link nope.md", "make target nope", "metric actor/no_such", "metric critic/score/nope",
        "module python -m easyrl.nope", "path easyrl/nope.py",
    ])


def test_brace_expansion():
    assert expand_braces("critic/{score,rewards}/{mean,max}") == [
        "critic/score/mean", "critic/score/max", "critic/rewards/mean", "critic/rewards/max"]
    assert expand_braces("critic/returns/{...}") == ["critic/returns/{...}"]
    assert expand_braces("worker.{actor,ref}.x") == ["worker.actor.x", "worker.ref.x"]
