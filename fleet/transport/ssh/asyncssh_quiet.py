"""asyncssh, imported without the warning it raises as it is imported; every module of fleet's takes it from here.

asyncssh (2.24) names cryptography's DSA classes when it is imported, and cryptography (51) deprecates them: a
warning addressed to asyncssh's maintainers (fleet never offers or accepts a DSA key), which would reach the
terminal of whoever imports fleet's SSH transport, a harness using fleet as a library among them. It is ignored
for that import alone: `warnings.catch_warnings` puts the caller's filters back as they were, and any other
warning, asyncssh's included, goes where they say. The tests still turn every other warning into an error
(pyproject.toml's `filterwarnings`).
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="DSA is deprecated", module="asyncssh")
    import asyncssh

__all__ = ["asyncssh"]
