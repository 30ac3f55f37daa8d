"""Moved to :mod:`django_redlock.inspection` (this name shadowed the standard library's
``inspect``). Importing ``django_redlock.inspect`` gives that module itself, so old imports
and monkeypatches keep working."""

from __future__ import annotations

import sys

from . import inspection

sys.modules[__name__] = inspection
