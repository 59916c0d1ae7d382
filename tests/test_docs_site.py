"""README.md is a front door (at most 12 KB, the two commands), and the docs site (mkdocs.yml, docs/) builds strictly
(its own ``strict: true``) with no network: a broken link or anchor, an absolute link, or a page left out of the
navigation fails the build; every page of docs/ becomes a page of the site."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_NETWORK = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **NO_NETWORK}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, env=env, timeout=120)


def warnings(log: str) -> list[str]:
    """mkdocs' ``WARNING`` records in ``log``, each with its indented continuation lines (a list of pages)."""
    records, open_record = [], False
    for line in log.splitlines():
        if line.startswith("WARNING"):
            records.append(line)
            open_record = True
        elif open_record and line.startswith("  "):
            records[-1] += "\n" + line
        else:
            open_record = False
    return records


def test_the_site_builds_strictly_with_every_page(tmp_path):
    proc = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    pages = sorted(p.stem for p in (REPO / "docs").glob("*.md"))
    built = [page for page in pages
             if (tmp_path / "site" / ("index.html" if page == "index" else f"{page}/index.html")).is_file()]
    assert built == pages


def test_a_broken_link_or_a_page_outside_the_navigation_fails_the_build(tmp_path):
    """The same mkdocs.yml over a copy of docs/ with one broken link, one missing anchor and one page not in the
    navigation: the build fails with a warning naming each."""
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy2(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with open(tmp_path / "docs" / "lora.md", "a", encoding="utf-8") as f:
        f.write("\n[a](no-such-page.md) and [b](config.md#no-such-anchor)\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the navigation\n")
    proc = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    for name in ("no-such-page.md", "#no-such-anchor", "orphan.md"):
        assert any(name in warning for warning in warnings(proc.stderr)), proc.stderr


def test_the_readme_is_a_front_door():
    """README.md stays at most 12 KB and keeps the two commands (.ci/run runs `make test`); the rest is in docs/."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 12 * 1024
    quick_start = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    commands = [line.split()[:2] for line in quick_start if line.startswith(("make demo ", "make test "))]
    assert commands == [["make", "demo"], ["make", "test"]]
