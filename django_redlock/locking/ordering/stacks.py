"""Where a lock was taken: the caller's stack without django-redlock's own frames."""

from __future__ import annotations

import os
import sys
import traceback
from types import FrameType

#: Frames of these directories are ours (or the standard library's block plumbing): a stack
#: shows the user's code, and a warning points at it.
_OURS = (
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
    os.path.dirname(os.path.abspath(traceback.__file__)) + os.sep + "contextlib.py",
    os.path.dirname(os.path.abspath(traceback.__file__)) + os.sep + "asyncio" + os.sep,
)
#: At most this many of the caller's innermost frames are kept.
DEPTH = 12
#: A stack is cut to this many characters (it is stored on the nodes).
MAX_STACK = 4000


def _ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_OURS)


def caller_stack() -> tuple[str, str]:
    """The calling code's stack as text (innermost last) and its innermost frame as
    ``path:line in function``."""
    frames = [f for f in traceback.extract_stack(sys._getframe(1)) if not _ours(f.filename)]
    frames = frames[-DEPTH:]
    if not frames:
        return "  (no frame outside django-redlock)\n", "?"
    last = frames[-1]
    text = "".join(traceback.format_list(frames))
    if len(text) > MAX_STACK:
        text = "  ...\n" + text[-MAX_STACK:]
    return text, f"{last.filename}:{last.lineno} in {last.name}"


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller of this function point at
    the innermost frame outside django-redlock."""
    frame: FrameType | None = sys._getframe(1)  # the caller: warnings.warn's stacklevel 1
    level = 1
    while frame is not None and _ours(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level
