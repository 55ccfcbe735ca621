"""fleet: make racks of GPU nodes clean again, many at once, and prove it."""
