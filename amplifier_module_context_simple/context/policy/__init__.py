"""The policy: one request's snapshot (``plan``), the rules every request path shares
(``policy``), the ordinary path's compaction (``compaction``) and the seam a negotiated
request gets (``negotiable``). The top layer under the store."""

__all__ = ()
