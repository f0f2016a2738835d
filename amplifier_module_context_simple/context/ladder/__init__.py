"""The ladder: the eight rungs over a working view (``ladder``, its columns ``rows``), the
reduced forms they make (``forms``) and the sticky decisions they leave (``decisions``).
Imports ``formats``, ``counting`` and ``history``; nothing here awaits or touches the store."""

__all__ = ()
