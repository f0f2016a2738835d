"""Amplifier context module (placeholder during bootstrap)."""

__amplifier_module_type__ = "context"
