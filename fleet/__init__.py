"""fleet: make racks of GPU nodes clean again, many at once, and prove it."""

__version__ = "0.2.0"
