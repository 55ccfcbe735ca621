"""fleet's version, declared once (the package's `__version__`, pyproject's dynamic version): a leaf every room may
import without importing the package's face."""

__version__ = "0.2.0"
