"""Admission and history: what a message is (``classify``), what admission accepts
(``validation``, ``ingress``), the stored entries and their indexes, tool groups and display
order (``history``), reused ids and synthesized results. Imports ``formats`` and
``counting`` only."""

__all__ = ()
