"""A Lua script with its SHA1."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, called with EVALSHA (EVAL when the node lost it)."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


def taking(
    name: str,
    functions: str,
    body: str,
    *,
    fence: int = 1,
    width: int = 3,
    trust: str | None = None,
) -> Script:
    """A script that takes something: ``functions`` (the Lua they share, with ``trusted()``),
    then the trust check of the fence hash at ``KEYS[fence]`` (a node not trusted answers
    ``{-1, counter, 0...}``, ``width`` items long), then ``body``. ``trust``: Lua that gives
    what ``trusted()`` gives from a read the script made already."""
    untrusted = "{-1, counter" + ", 0" * (width - 2) + "}"
    check = (
        f"\nlocal ok, counter, max_ttl = {trust or f'trusted(KEYS[{fence}])'}\n"
        f"if not ok then\n  return {untrusted}\nend\n"
    )
    return Script(name, functions + check + body)
