"""Lock names filled from a call's arguments: ``@lock("report:{day}")`` or ``"report:{0}"``.

The arguments are bound to the decorated function's signature first, so a field names a
parameter whether the caller passed it by position or by keyword, and defaults count:
``{0}`` is the first parameter's value, ``{day}`` the value of ``day``. Values are inserted as
:meth:`str.format` does (attribute access, indexing and format specs work). A template that
names a parameter the function does not have is refused when the function is decorated.
"""

from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable
from typing import Any

_FORMATTER = string.Formatter()
_ROOT = re.compile(r"[^.\[]*")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class CallTemplate:
    """A lock-name template over the arguments of one function."""

    def __init__(self, template: str, func: Callable[..., Any]) -> None:
        self.template = template
        self.where = getattr(func, "__qualname__", repr(func))
        try:
            self.signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):  # a builtin without a signature: format as called
            self.signature = None
        self._check_fields()

    def fill(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock name for one call (``ValueError`` if a field cannot be filled)."""
        positional, named = self._arguments(args, kwargs)
        try:
            return self.template.format(*positional, **named)
        except (IndexError, KeyError, AttributeError, TypeError, ValueError) as exc:
            raise ValueError(
                f"Lock name template {self.template!r} cannot be filled from the arguments of "
                f"{self.where}(): {type(exc).__name__}: {exc}."
            ) from exc

    # -- internals -------------------------------------------------------------------------
    def _arguments(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """Positional values in parameter order (``*args`` spread) and every value by name."""
        if self.signature is None:
            return list(args), dict(kwargs)
        bound = self.signature.bind(*args, **kwargs)  # a call that does not fit raises here
        bound.apply_defaults()
        positional: list[Any] = []
        named: dict[str, Any] = {}
        for name, param in self.signature.parameters.items():
            value = bound.arguments[name]
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                positional.extend(value)
            elif param.kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
                continue
            elif param.kind in _POSITIONAL:
                positional.append(value)
            named[name] = value
        return positional, named

    def _check_fields(self) -> None:
        """Refuse, at decoration time, a template that could never be filled."""
        try:
            fields = [f for _, f, _, _ in _FORMATTER.parse(self.template) if f is not None]
        except ValueError as exc:
            raise ValueError(
                f"Lock name template {self.template!r} on {self.where}() is not a valid format "
                f"string ({exc}). Write literal braces as '{{{{' and '}}}}'."
            ) from exc
        roots = [_ROOT.match(field).group() for field in fields]  # type: ignore[union-attr]
        if "" in roots and any(root.isdigit() for root in roots):
            raise ValueError(
                f"Lock name template {self.template!r} on {self.where}() mixes automatic "
                "fields ('{}') with numbered ones ('{0}'); use one style."
            )
        if self.signature is None:
            return
        params = self.signature.parameters.values()
        kinds = {p.kind for p in params}
        names = {p.name for p in params}
        positional = sum(1 for p in params if p.kind in _POSITIONAL)
        auto = 0
        for root in roots:
            if root == "" or root.isdigit():
                index = int(root) if root else auto
                auto += root == ""
                root = root or str(index)
                if index >= positional and inspect.Parameter.VAR_POSITIONAL not in kinds:
                    raise ValueError(
                        f"Lock name template {self.template!r}: {self.where}() has no "
                        f"positional parameter {{{root}}} (it takes {positional})."
                    )
            elif root not in names and inspect.Parameter.VAR_KEYWORD not in kinds:
                raise ValueError(
                    f"Lock name template {self.template!r}: {self.where}() has no parameter "
                    f"{root!r}; fields name parameters ({', '.join(sorted(names)) or 'none'}) "
                    "or their positions ({0})."
                )
