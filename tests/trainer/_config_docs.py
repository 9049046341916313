"""The keys of docs/config.md's tables, with their documented defaults."""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf

CONFIG_DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def _parse(raw: str) -> object:
    """A table cell's value, parsed as an override value would be."""
    return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]), resolve=False)["v"]


def documented_defaults(text: str | None = None) -> dict[str, object]:
    """``key -> default`` from the tables of docs/config.md (or of ``text``). A row naming an actor and
    a critic key (``actor.x`` / ``critic.x``) gives both, with the critic's own default when it has one."""
    text = CONFIG_DOC.read_text() if text is None else text
    out: dict[str, object] = {}
    for key, raw in re.findall(r"^\| `([\w.<>\[\]]+)` \| `([^`]*)` \|", text, flags=re.MULTILINE):
        out[key] = _parse(raw)
    shared = r"^\| `(actor\.\w+)` / `(critic\.\w+)` \| `([^`]*)`(?: / `([^`]*)`)? \|"
    for actor_key, critic_key, actor_raw, critic_raw in re.findall(shared, text, flags=re.MULTILINE):
        out[actor_key] = _parse(actor_raw)
        out[critic_key] = _parse(critic_raw or actor_raw)
    return out
