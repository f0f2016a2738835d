"""The request negotiator: ``RequestTransaction`` (``transaction.py``: states, table,
effects, the orchestrator's handle) and the async driver (``driver.py``). It reaches the
store only through ``context.negotiable``."""

__all__ = ()
