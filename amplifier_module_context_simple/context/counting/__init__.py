"""Counting: per-message token estimates (``estimate``, ``text_tokens``, ``image_tokens``),
the budget and its provenance (``budget``), the provider's own usage reading (``meter``).
Imports ``formats`` only."""

__all__ = ()
