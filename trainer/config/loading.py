"""Loading a run config: dataclass defaults, then a YAML file, then ``key.sub=value`` overrides.

Mappings merge key by key; anything else (scalars, lists) is replaced by the later source. OmegaConf
parses the YAML and the overrides (so ``1e-5`` is a number and ``[a,b]`` a list) and resolves ``${...}``
interpolations after the merge, so an interpolation may point at a value that any source set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainer.config.convert import build
from trainer.config.problems import Problems
from trainer.config.rules import check_rules
from trainer.config.schema import RunConfig

__all__ = ["config_from_dict", "config_to_dict", "load_config"]


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Load, merge and validate a run config.

    Args:
        path: a YAML file of sections (e.g. ``trainer/config/grpo.yaml``); None for the defaults alone.
        overrides: ``key.sub=value`` items applied in order, e.g. ``["actor.lr=1e-5", "critic=null"]``.

    Raises:
        ConfigError: listing every problem found, each under its full key.
    """
    problems = Problems()
    tree: dict[str, Any] = {}
    from_file: set[str] = set()
    if path is not None:
        tree = _read_yaml(Path(path), problems)
        from_file = _keys(tree, "")
    for item in overrides:
        override = _parse_override(item, problems)
        from_file -= _keys(override, "")
        tree = _merge(tree, override)
    problems.raise_if_any()
    return config_from_dict(tree, origins=dict.fromkeys(from_file, str(path)))


def config_from_dict(data: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> RunConfig:
    """Build and validate a run config from a (partial) nested mapping, merged onto the defaults.

    ``origins`` maps a full key to the file that set it; a value that does not fit the schema there
    (an unknown key, a wrong type, a value out of range) is reported with that file.

    Raises:
        ConfigError: listing every problem found, each under its full key.
    """
    problems = Problems(origins)
    tree = _resolve(_merge(config_to_dict(RunConfig()), config_to_dict(data)), problems)
    problems.raise_if_any()
    config = build(RunConfig, tree, "", problems)
    check_rules(config, problems)
    problems.raise_if_any()
    return config


def config_to_dict(config: Any) -> Any:
    """A config, a section or a mapping as plain dicts, lists and scalars (to log it or save it as YAML)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: config_to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, Mapping):
        return {key: config_to_dict(value) for key, value in config.items()}
    if isinstance(config, list | tuple):
        return [config_to_dict(value) for value in config]
    return config


def _keys(tree: Any, prefix: str) -> set[str]:
    """The full key of every mapping entry in ``tree`` (nested ones too), e.g. ``{"actor", "actor.lr"}``."""
    if not isinstance(tree, Mapping):
        return set()
    keys: set[str] = set()
    for name, value in tree.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        keys |= {key} | _keys(value, key)
    return keys


def _merge(base: Any, override: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    return override


def _read_yaml(path: Path, problems: Problems) -> dict[str, Any]:
    if not path.is_file():
        problems.reject(str(path), "config file not found")
        return {}
    try:
        tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except yaml.YAMLError as error:
        where, message = _yaml_error(path, error)
        problems.reject(where, f"invalid YAML: {message}")
        return {}
    except (OmegaConfBaseException, ValueError) as error:
        problems.reject(str(path), f"cannot parse YAML: {error}")
        return {}
    if not isinstance(tree, dict):
        problems.reject(str(path), f"must hold a mapping of sections, got {type(tree).__name__}")
        return {}
    return tree


def _parse_override(item: str, problems: Problems) -> dict[str, Any]:
    key, sep, _ = item.partition("=")
    if not sep or not key.strip():
        problems.reject(f"override {item!r}", "expected key.sub=value")
        return {}
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=False)  # type: ignore[return-value]
    except OmegaConfBaseException as error:
        problems.reject(f"override {item!r}", f"cannot parse: {str(error).splitlines()[0]}")
        return {}
    except yaml.YAMLError as error:
        problems.reject(f"override {item!r}", f"cannot parse the value: {_yaml_error(None, error)[1]}")
        return {}


def _yaml_error(path: Path | None, error: yaml.YAMLError) -> tuple[str, str]:
    """``("file:line:column", "what is wrong")`` for a YAML syntax error, in one line; lines and columns
    count from 1. Without a ``path`` (an override's value) positions are left out: they would point into
    the value, not a file."""
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return str(path), " ".join(str(error).split())
    message = error.problem or "syntax error"
    if error.context:
        opened = error.context_mark
        at = f" at line {opened.line + 1}, column {opened.column + 1}" if opened and path else ""
        message = f"{message} ({error.context}{at})"
    mark = error.problem_mark
    return f"{path}:{mark.line + 1}:{mark.column + 1}", message


def _resolve(tree: dict[str, Any], problems: Problems) -> dict[str, Any]:
    """``tree`` with ``${...}`` resolved. OmegaConf stops at the first failure, so only that one is reported."""
    try:
        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "<config>"
        problems.reject(str(key), f"cannot resolve interpolation: {str(error).splitlines()[0]}")
        return tree
