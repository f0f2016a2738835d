"""The context store and its policy: admission, classification, estimation, budget, the
eight rungs, sticky decisions, the notice, the meter; and the seam it hands the negotiator
(``negotiable.py``). Nothing here imports ``negotiator``."""

__all__ = ()
