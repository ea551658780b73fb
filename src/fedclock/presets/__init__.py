"""Named experiments shipped with the package (one YAML file each)."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from fedclock.errors import ConfigError, short


def _files() -> dict[str, Any]:
    root = resources.files("fedclock.presets")
    return {f.name[: -len(".yaml")]: f for f in root.iterdir() if f.name.endswith(".yaml")}


def preset_names() -> list[str]:
    return sorted(_files())


def preset_text(name: str) -> str:
    files = _files()
    if name not in files:
        raise ConfigError(f"Unknown preset '{short(name)}'; available: {', '.join(sorted(files))}.")
    return str(files[name].read_text())


def load_preset(name: str) -> dict[str, Any]:
    raw = yaml.safe_load(preset_text(name))
    assert isinstance(raw, dict), f"preset {name} is not a mapping"
    return raw


def one_line(desc: str, width: int = 120) -> str:
    """The head of a description: up to its first colon, else ``width`` characters."""
    head = desc.split(": ", 1)[0]
    if len(head) <= width:
        return head
    return head[:width].rsplit(" ", 1)[0] + " …"


def list_presets() -> list[tuple[str, str]]:
    """(name, one-line description) for every shipped preset."""
    out = []
    for name in preset_names():
        desc = " ".join(str(load_preset(name).get("description", "")).split())
        out.append((name, one_line(desc)))
    return out
