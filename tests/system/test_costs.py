"""The README's system-test cost table is the one the catalog computes (``costs.py``)."""

from __future__ import annotations

from pathlib import Path

from costs import markdown

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_cost_table_is_computed_from_the_catalog() -> None:
    assert markdown() in README.read_text(), "paste `python tests/system/costs.py` into README 'System tests'"
