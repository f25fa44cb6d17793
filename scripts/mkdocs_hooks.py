"""mkdocs hook: the package as its import names lay it out, for the API reference.

setup.cfg maps ``draco_gym.envs`` to ``envs/``, ``draco_gym.algos`` to ``algos/`` and so on;
mkdocstrings reads modules statically (griffe) from a folder tree, which must then hold
``draco_gym/envs/``. This builds that tree under ``build/api_src/`` (folders, and a symlink per module) before
the pages are rendered; nothing is imported and nothing is copied.
"""

from __future__ import annotations

import configparser
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "build" / "api_src"


def package_tree(root: Path = ROOT, out: Path = SOURCE) -> Path:
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    mapping = dict(line.split("=") for line in cfg["options"]["package_dir"].strip().splitlines())
    shutil.rmtree(out, ignore_errors=True)
    for package, folder in sorted((k.strip(), v.strip()) for k, v in mapping.items()):
        base = root / folder
        for source in base.rglob("*.py"):  # folders are made, files linked: griffe walks no linked folder
            target = out.joinpath(*package.split("."), source.relative_to(base))
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(source)
    return out


def on_config(config, **kwargs):
    package_tree()
    return config


# mkdocstrings keeps only the handler paths that exist when it reads its configuration, which
# comes before on_config: the tree must be there once this hook is loaded, on a first build too.
package_tree()
