"""Structured logs, captured by the host (bounded) and shown in the stage result.

Outside a component (a plugin's own unit tests) the lines go to stderr instead.
"""

from __future__ import annotations

import sys


def _emit(level: str, message: str) -> None:
    try:
        from wit_world.imports import log
    except ImportError:
        print(f"{level:5} {message}", file=sys.stderr)
        return
    log.log(log.Level[level.upper()], message)


def trace(message: str) -> None:
    """Logs at trace level."""
    _emit("trace", message)


def debug(message: str) -> None:
    """Logs at debug level."""
    _emit("debug", message)


def info(message: str) -> None:
    """Logs at info level."""
    _emit("info", message)


def warn(message: str) -> None:
    """Logs at warn level."""
    _emit("warn", message)


def error(message: str) -> None:
    """Logs at error level."""
    _emit("error", message)
