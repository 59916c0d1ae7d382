"""docs/errors.md and the tests agree: every catalog row names a test that exists and carries the row's id (as its
``[ID]`` parameter or a ``# ID`` comment on its ``def`` line), and every id the error tests use has a row."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| ([A-Z]\d{2,3}) \|.*\| `(tests/test_[a-z_]+\.py)::([A-Za-z0-9_]+)(?:\[([A-Z]\d{2,3})\])?` \|$")
ID_IN_TEST = re.compile(r"""(?:"|# )([A-Z]\d{2,3})\b""")


def _rows() -> list[tuple[str, str, str, str | None]]:
    text = (REPO / "docs" / "errors.md").read_text()
    rows = [m.groups() for m in map(ROW.match, text.splitlines()) if m]
    assert len(rows) == len(re.findall(r"^\| [A-Z]\d{2,3} \|", text, re.M)), "a catalog row does not name its test"
    return rows


def test_every_catalog_row_names_an_existing_test_with_its_id():
    rows = _rows()
    ids = [row[0] for row in rows]
    assert len(ids) == len(set(ids)), "duplicate catalog ids"
    for cid, path, name, param in rows:
        source = (REPO / path).read_text()
        if param is None:
            assert re.search(rf"^def {name}\(.*# {cid}$", source, re.M), f"{cid}: no `def {name}(...):  # {cid}`"
        else:
            assert param == cid and re.search(rf"^def {name}\(", source, re.M), f"{cid}: {path}::{name}[{param}]"
            assert f'"{cid}"' in source, f"{cid}: {path} has no parameter id {cid}"


def test_every_id_used_by_the_tests_is_in_the_catalog_and_there_are_at_least_40_errors():
    cataloged = {row[0] for row in _rows()}
    used = {cid for path in REPO.glob("tests/test_errors_*.py") for cid in ID_IN_TEST.findall(path.read_text())}
    assert used - cataloged == set()
    assert len([cid for cid in cataloged if not cid.startswith("W")]) >= 40
