"""The README and the manual: the site builds with ``mkdocs build --strict`` (every page in the
nav, every link and anchor resolved, the API reference read from the docstrings, no network),
the README stays a ten-minute read whose links reach the manual's pages and sections, and the
README's tour runs as written and prints what it says it prints."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TOUR = "## A ten-minute tour of the layers"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def page_ids(site: Path, page: str) -> set[str]:
    """The anchors of a built page (``docs/training.md`` -> ``training/index.html``)."""
    name = Path(page).with_suffix("")
    built = site / ("index.html" if name.name == "index" else name / "index.html")
    return set(re.findall(r'\bid="([^"]+)"', built.read_text()))


def test_the_site_builds_strictly_with_the_api_reference(site):
    api = (site / "api" / "index.html").read_text()
    # read from the docstrings, across the package_dir mapping (draco_gym.algos lives in algos/)
    assert "draco_gym.algos.credit.core" in api and "draco_gym.envs.base" in api
    assert "Register the decorated factory in" in html.unescape(api)  # credit_rule's docstring, rendered
    assert not (site / "_drafts").exists(), "engineers' drafts are not pages"
    nav = set(re.findall(r"^\s+- [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert nav == {p.name for p in (ROOT / "docs").glob("*.md")}, "every page in the nav, every nav entry a page"


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The build the site fixture trusts does fail on a dead link (strict)."""
    pytest.importorskip("mkdocs")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](nowhere.md) [no anchor](#nothing-here)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\nstrict: true\nvalidation: {anchors: warn}\n")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode != 0 and "nowhere.md" in done.stderr


def test_the_readme_is_a_ten_minute_read():
    lines = README.read_text().splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; the manual is docs/"
    assert "draco-gym train configs/quickstart.yaml --before-after" in README.read_text()
    assert "bash .ci/run" in README.read_text()


def test_the_readmes_links_reach_the_manual(site):
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert sum(link.startswith("docs/") for link in local) >= 10
    for link in local:
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which does not exist"
        if anchor:
            assert path.startswith("docs/") and anchor in page_ids(site, path.removeprefix("docs/")), \
                f"README links to {link}: no such section"


def tour_blocks() -> list[str]:
    tour = README.read_text().split(TOUR, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", tour, re.S | re.M)


def test_the_readme_tour_runs_as_written_and_prints_what_it_says(tmp_path):
    pytest.importorskip("transformers")
    blocks = tour_blocks()
    assert len(blocks) == 3, "one snippet per layer"
    tour = README.read_text().split(TOUR, 1)[1]
    script = tmp_path / "tour.py"
    script.write_text("\n".join(blocks))
    done = subprocess.run([sys.executable, "-W", "ignore", str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    printed = done.stdout.splitlines()
    # what the README says each snippet prints, in order
    said = [re.search(r"^prints `(.*?)`", tour, re.M).group(1),
            *re.search(r"^prints\n\n```text\n(.*?)^```$", tour, re.S | re.M).group(1).splitlines(),
            re.findall(r"^prints `(.*?)`", tour, re.M)[1]]
    assert printed == said


def test_the_readme_run_config_is_valid(tmp_path):
    from draco_gym.algos.config import load_config

    tour = README.read_text().split(TOUR, 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```yaml\n(.*?)^```$", tour, re.S | re.M)
    (tmp_path / "run.yaml").write_text(block)
    run = load_config(tmp_path / "run.yaml")
    assert (run.env.id, run.credit.name, run.reward.name, run.rollout.group_size) == \
        ("draco_gym/PythonTools-v0", "draco", "rule", 4)
