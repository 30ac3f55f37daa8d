"""What a block or a set needs of its manager (``LockManager`` is one): its alias and its
acquire calls. A protocol, so that blocks and sets do not import the manager that imports
them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .lease import Lease


class Acquirer(Protocol):
    """What a block needs of its manager: its alias and its (asyncio) acquire calls."""

    #: ``REDLOCK_CHECK_ORDER``: the lock-order checker is on
    check_order: bool

    @property
    def alias(self) -> str: ...

    @property
    def acquire(self) -> Callable[..., Lease]: ...

    @property
    def aacquire(self) -> Callable[..., Awaitable[Lease]]: ...

    @property
    def acquire_many(self) -> Callable[..., Any]: ...

    @property
    def aacquire_many(self) -> Callable[..., Awaitable[Any]]: ...

    @property
    def acquire_limits(self) -> Callable[..., Any]: ...

    @property
    def aacquire_limits(self) -> Callable[..., Awaitable[Any]]: ...
