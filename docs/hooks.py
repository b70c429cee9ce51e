"""MkDocs hook: the repository's own files are pages of the site, read where they live.

- ``README.md`` is the home page and ``CHANGELOG.md`` the changelog;
- ``benchmarks/results/*.md`` and ``*.png`` are the benchmark pages and their plots.

None of them is copied under ``docs/``, so a page cannot drift from its file. Links are written
for the repository (they work on GitHub as they are); ``on_page_markdown`` maps a link that
leaves ``docs/`` onto the page's place in the site, where ``mkdocs build --strict`` checks it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
REFERENCE = re.compile(r"(?m)^(\[[^\]]+\]:[ ]+)(\S+)()")  # [label]: target


def repository_files() -> list[str]:
    """Repository paths (outside ``docs/``) that the site shows under the same path."""
    results = sorted(p.name for p in (ROOT / RESULTS).iterdir() if p.suffix in (".md", ".png"))
    return ["README.md", "CHANGELOG.md", *(f"{RESULTS}/{name}" for name in results)]


def on_files(files, config):
    for path in repository_files():
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def repo_path(page_src: str, page_abs: str) -> str:
    """Where the page lives in the repository, relative to its root."""
    return Path(page_abs).resolve().relative_to(ROOT).as_posix() if page_abs else page_src


def site_link(target: str, page_repo: str, page_src: str) -> str:
    """A repository-relative link of the page at ``page_repo``, as a link of its site page."""
    if re.match(r"^[a-z]+:|^#|^/", target):
        return target
    path, _, anchor = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo), path))
    if resolved.startswith("docs/"):
        site = resolved[len("docs/"):]
    elif resolved in repository_files():
        site = resolved
    else:
        return target  # left as written: strict mode names it if the site cannot resolve it
    new = posixpath.relpath(site, posixpath.dirname(page_src) or ".")
    return new + ("#" + anchor if anchor else "")


def on_page_markdown(markdown, page, config, files):
    page_repo = repo_path(page.file.src_uri, page.file.abs_src_path)
    def rewrite(m):
        return m[1] + site_link(m[2], page_repo, page.file.src_uri) + m[3]

    return REFERENCE.sub(rewrite, LINK.sub(rewrite, markdown))
