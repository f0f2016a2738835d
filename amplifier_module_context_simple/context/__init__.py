"""The context store and its policy, in layers (each imports only those before it):
``formats`` (wire formats), ``counting``, ``history`` (admission), ``ladder``,
``rendering``, ``policy``; then ``store`` (every write of the store's state) and
``state`` (everything observable). ``config``, ``stats`` and ``slices`` (pacing) are
leaves every layer may use. Nothing here imports ``negotiator``."""

__all__ = ()
