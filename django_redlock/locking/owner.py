"""What a lease needs of the manager that made it (``LockManager`` is one): its alias, its
settings and the engine of a name. A protocol, so that leases do not import the manager that
imports them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..conf import AliasConfig
    from ..engine import Engine


class LeaseOwner(Protocol):
    """The manager of a lease."""

    @property
    def alias(self) -> str: ...

    @property
    def config(self) -> AliasConfig: ...

    def engine_for(self, name: str) -> Engine: ...
