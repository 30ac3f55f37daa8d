"""Every script a lock connection loads on connect (``WAITING`` is sent as EVAL, by
inspection only)."""

from __future__ import annotations

from . import primitive_scripts as more
from . import scripts as core

ALL_SCRIPTS = (
    core.ACQUIRE,
    core.RELEASE,
    core.EXTEND,
    core.RAISE,
    core.REJOIN,
    core.PROBE,
    core.FORCE_RELEASE,
    core.WITHDRAW,
    core.REGISTER,
    more.PERMIT,
    more.RELEASE_PERMIT,
    more.ACQUIRE_MANY,
    more.READ,
    more.WRITE,
    more.READ_RELEASE,
    more.READ_EXTEND,
    more.RELEASE_MANY,
)
