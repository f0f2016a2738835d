"""Rendering: the view of a history prefix under some decisions (``render``), the
compaction notice and its place (``notice``), the preserved-thinking rule (``thinking``).
Imports the layers below it (``formats``, ``counting``, ``history``, ``ladder``)."""

__all__ = ()
