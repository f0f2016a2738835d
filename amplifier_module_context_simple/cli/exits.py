"""The program's name, its exit codes and ``CliError``, the one way a command fails."""

from __future__ import annotations

from typing import Final

__all__ = ("EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "PROG", "CliError")

PROG: Final = "amplifier-context-simple"
EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2


class CliError(Exception):
    """A failure reported as ``PROG: error: <message>`` with exit code ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
