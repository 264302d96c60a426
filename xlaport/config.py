"""``[tool.xlaport]`` in the nearest pyproject.toml (like ruff's own table).

Keys: ``select``, ``ignore``, ``exclude`` (lists), ``target`` (string),
``keep-progress`` (bool), ``prints`` ("defer" | "delete" | "keep").
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

import click


def _find(paths: Sequence[str]) -> Optional[Path]:
    start = Path(paths[0]).resolve() if paths else Path.cwd()
    if start.is_file() or not start.exists():
        start = start.parent
    for d in (start, *start.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(paths: Sequence[str], explicit: Optional[str] = None) -> Dict[str, object]:
    path = Path(explicit) if explicit else _find(paths)
    if path is None:
        return {}
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise click.UsageError(f"{path}: cannot read [tool.xlaport]: {exc}") from None
    table = data.get("tool", {}).get("xlaport", {})
    config: Dict[str, object] = {}
    for key in ("select", "ignore", "exclude"):
        if key in table:
            value = table[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise click.UsageError(f"{path}: [tool.xlaport] {key} must be a list of strings")
            config[key] = [v.upper() for v in value] if key != "exclude" else value
    if "target" in table:
        config["target"] = str(table["target"])
    options: Dict[str, object] = {}
    if "keep-progress" in table:
        options["keep_progress"] = bool(table["keep-progress"])
    if "prints" in table:
        options["prints"] = str(table["prints"])
    config["options"] = options
    return config
