"""Every committed benchmark result is a page of the documentation site.

``docs/hooks.py`` makes each ``benchmarks/results/*.md`` a page; ``mkdocs build --strict``
refuses a page that the nav of ``mkdocs.yml`` does not list. That build runs only after the
tests (and needs the docs extras), so a results file committed without its nav entry is
caught here first.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_results_page_is_in_the_nav():
    nav = set(re.findall(r"benchmarks/results/([\w.-]+\.md)", (ROOT / "mkdocs.yml").read_text()))
    pages = {p.name for p in (ROOT / "benchmarks" / "results").glob("*.md")}
    assert pages, "no results pages found"
    assert not pages - nav, f"results pages missing from the nav of mkdocs.yml: {sorted(pages - nav)}"
    assert not nav - pages, f"nav entries of mkdocs.yml without a results page: {sorted(nav - pages)}"
