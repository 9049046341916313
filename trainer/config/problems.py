"""Collecting config problems so that one validation pass reports all of them at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["ConfigError", "Problems"]


class ConfigError(ValueError):
    """Every problem found in a run config, one per line, each starting with the full key."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        count = len(self.problems)
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(f"{count} problem{'s' if count != 1 else ''} in the run config:\n{lines}")


class Problems:
    """Problems found so far, kept from cascading.

    A value that does not fit the schema is *rejected*: its default stands in so that checking can go
    on, and no rule reports on it again. A rule that depends on a key already reported stays quiet, so
    one mistake gives one message.
    """

    def __init__(self, origins: Mapping[str, str] | None = None) -> None:
        self.messages: list[str] = []
        # Full key -> the file that set it, named in the messages of the values rejected there.
        self._origins = dict(origins or {})
        self._rejected: set[str] = set()
        self._reported: set[str] = set()

    @staticmethod
    def _covers(keys: set[str], key: str) -> bool:
        return any(key == k or key.startswith((f"{k}.", f"{k}[")) for k in keys)

    def reject(self, key: str, message: str) -> None:
        """Record a value that does not fit the schema (unknown key, wrong type, out of range), with
        the file that set it when known."""
        origin = self._origins.get(key.partition("[")[0])
        self.messages.append(f"{key}: {message}" + (f" (set in {origin})" if origin else ""))
        self._rejected.add(key)
        self._reported.add(key)

    def add(self, key: str, message: str, *depends_on: str) -> None:
        """Record a rule that ``key`` breaks, unless already recorded, ``key`` was rejected, or a key it depends on was reported."""
        line = f"{key}: {message}"
        # Two checks may meet the same fault (e.g. a pool that the sizes need and the placement names).
        if line in self.messages:
            return
        if self._covers(self._rejected, key) or any(self._covers(self._reported, k) for k in depends_on):
            return
        self.messages.append(line)
        self._reported.add(key)

    def raise_if_any(self) -> None:
        """Raise one :class:`ConfigError` listing every problem recorded."""
        if self.messages:
            raise ConfigError(self.messages)
