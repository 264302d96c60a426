"""``[tool.xlaport]`` in the nearest pyproject.toml (like ruff's own table).

Keys: ``select``, ``extend-select``, ``ignore``, ``exclude`` (lists),
``per-file-ignores`` (glob -> codes), ``target`` (string), ``keep-progress``
(bool), ``prints`` ("defer" | "delete" | "keep"), ``unsafe-fixes`` (bool: also
the rewrites that change what the program computes), ``port-cpu`` (bool: convert a
program with no CUDA code too), ``force-exclude`` (bool:
``exclude`` applies to files named on the command line too, as pre-commit
passes them), ``respect-gitignore`` (bool, default true).  Unknown keys and
values of the wrong kind are errors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import click

from codemods import registry
from codemods.target import DEFAULT_TARGET, TARGETS
from xlaport.settings import Settings


def _find(paths: Sequence[str]) -> Optional[Path]:
    # realpath, not Path.resolve: a looping symbolic link must not raise here
    # (it is reported as the file it is, XLA001)
    start = Path(os.path.realpath(paths[0])) if paths else Path.cwd()
    if not start.is_dir():
        start = start.parent
    for d in (start, *start.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


KNOWN_KEYS = ("select", "extend-select", "ignore", "exclude", "per-file-ignores", "target", "keep-progress", "prints",
              "unsafe-fixes", "force-exclude", "respect-gitignore", "port-cpu")
PRINTS = ("defer", "delete", "keep")


def load_config(paths: Sequence[str], explicit: Optional[str] = None,
                overrides: Sequence[str] = ()) -> Dict[str, object]:
    """The ``[tool.xlaport]`` table, checked strictly: an unknown key or a
    value of the wrong kind stops the run (exit 2) naming the key, as Ruff does.
    ``overrides`` are ``KEY = VALUE`` TOML lines (``--config``) that win over
    the file."""
    path = Path(explicit) if explicit else _find(paths)
    if path is not None or overrides:  # (a hook run on a file of no project does not import tomllib)
        try:
            import tomllib
        except ImportError:  # Python 3.10
            return {}
    table: Dict[str, object] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise click.UsageError(f"{path}: cannot read [tool.xlaport]: {exc}") from None
        table = dict(data.get("tool", {}).get("xlaport", {}))
    where = f"{path}: [tool.xlaport]" if path is not None else "--config"
    for line in overrides:
        try:
            table.update(tomllib.loads(line))
        except ValueError as exc:
            raise click.UsageError(f"--config {line!r} is not `KEY = VALUE` in TOML: {exc}") from None
        where = f"{where} (with --config)" if "--config" not in where else where
    unknown = [k for k in table if k not in KNOWN_KEYS]
    if unknown:
        import difflib

        hints = [f"{k!r} (did you mean {difflib.get_close_matches(k, KNOWN_KEYS, 1)[0]!r}?)"
                 if difflib.get_close_matches(k, KNOWN_KEYS, 1) else repr(k) for k in unknown]
        raise click.UsageError(f"{where}: unknown key {', '.join(hints)}; known keys: {', '.join(KNOWN_KEYS)}")
    config: Dict[str, object] = {}
    for key in ("select", "extend-select", "ignore", "exclude"):
        if key in table:
            value = table[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise click.UsageError(f"{where} {key} must be a list of strings, not {value!r}")
            config[key.replace("-", "_")] = [v.upper() for v in value] if key != "exclude" else value
    if "per-file-ignores" in table:
        value = table["per-file-ignores"]
        if not isinstance(value, dict) or not all(
                isinstance(v, list) and all(isinstance(c, str) for c in v) for v in value.values()):
            raise click.UsageError(f"{where} per-file-ignores must map globs to lists of codes, not {value!r}")
        config["per_file_ignores"] = {k: [c.upper() for c in v] for k, v in value.items()}
    if "target" in table:
        if not isinstance(table["target"], str):
            raise click.UsageError(f"{where} target must be a string, not {table['target']!r}")
        config["target"] = table["target"]
    options: Dict[str, object] = {}
    for key in ("keep-progress", "unsafe-fixes"):
        if key in table:
            if not isinstance(table[key], bool):
                raise click.UsageError(f"{where} {key} must be true or false, not {table[key]!r}")
            options[key.replace("-", "_")] = table[key]
    if "prints" in table:
        if table["prints"] not in PRINTS:
            raise click.UsageError(f"{where} prints must be one of {', '.join(PRINTS)}, not {table['prints']!r}")
        options["prints"] = table["prints"]
    for key in ("force-exclude", "respect-gitignore", "port-cpu"):
        if key in table:
            if not isinstance(table[key], bool):
                raise click.UsageError(f"{where} {key} must be true or false, not {table[key]!r}")
            config[key.replace("-", "_")] = table[key]
    config["options"] = options
    return config


def settings_for(config: Dict[str, object], select: Optional[str] = None, ignore: Optional[str] = None,
                 target: Optional[str] = None, keep_progress: Optional[bool] = None, prints: Optional[str] = None,
                 unsafe_fixes: Optional[bool] = None) -> Settings:
    """What a run is asked to do: ``config`` (:func:`load_config`) with the
    command line's options over it (None: not given).  An unknown code or
    target stops the run (exit 2), as the table's own errors do."""
    sel = _codes(select) if select is not None else config.get("select")
    ign = (_codes(ignore) or []) + list(config.get("ignore", []))
    extend = list(config.get("extend_select", []))
    per_file = dict(config.get("per_file_ignores", {}))
    _check_codes(sel, "--select")
    _check_codes(ign, "--ignore")
    _check_codes(extend, "extend-select")
    for codes in per_file.values():
        _check_codes(codes, "per-file-ignores")
    if sel is not None and "ALL" in sel:
        sel = None
    if sel is not None and extend:
        sel = list(sel) + extend
    options: Dict[str, object] = dict(config.get("options", {}))
    if keep_progress is not None:
        options["keep_progress"] = keep_progress
    if prints is not None:
        options["prints"] = prints
    if unsafe_fixes is not None:
        options["unsafe_fixes"] = unsafe_fixes
    if not options.get("unsafe_fixes"):
        options.pop("unsafe_fixes", None)  # (off is the default: one cache key for both)
    target_name = target or config.get("target") or DEFAULT_TARGET
    if target_name not in TARGETS:
        raise click.UsageError(f"[tool.xlaport] target {target_name!r} is not one of {', '.join(sorted(TARGETS))}")
    return Settings(select=sel, ignore=ign, target=target_name, options=options, per_file_ignores=per_file)


def _codes(value: Optional[str]) -> Optional[List[str]]:
    if value is None:
        return None
    return [c.strip().upper() for c in value.split(",") if c.strip()]


def _check_codes(codes: Optional[Sequence[str]], option: str) -> None:
    known = [r.code for r in registry.rules()]
    for c in codes or ():
        if c != "ALL" and not any(k.startswith(c) for k in known):
            raise click.BadParameter(f"no rule code starts with {c!r} (see `xlaport rules`)", param_hint=option)
