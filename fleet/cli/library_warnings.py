"""What an operator's terminal gets of Python's warnings: fleet's own, never a library's.

A library's warning is addressed to fleet's maintainers, not to whoever runs `fleet reset`: the tests turn every
one into an error (pyproject.toml's `filterwarnings`, each tolerated one named there with its reason) and
`make test-latest` finds the next one before a release. The command line therefore ignores, in front of any
filter the operator set (`-W`, `PYTHONWARNINGS`), two kinds of warning:

- a deprecation (DeprecationWarning, PendingDeprecationWarning, FutureWarning) raised by any module outside fleet;
- any warning raised by the libraries fleet runs on (`LIBRARIES`). cryptography's own deprecations are
  UserWarnings it raises into the library that touched the deprecated name, asyncssh's import among them.

Nothing else is touched: fleet's own warnings, and every other module's other categories (an asyncio
ResourceWarning, a RuntimeWarning of a coroutine never awaited), still go where the operator's filters say.
"""

from __future__ import annotations

import warnings

DEPRECATIONS: tuple[type[Warning], ...] = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)

# The import packages of fleet's dependencies (pyproject.toml's `dependencies`: a test holds the two together) and
# of the libraries they raise warnings through (cryptography under asyncssh, click under typer).
LIBRARIES = (
    "asyncssh", "cryptography", "anyio", "structlog", "typer", "click", "yaml", "ClusterShell", "pydantic",
    "pydantic_core", "rich",
)

NOT_FLEET = r"(?!fleet(\.|$))"
OF_LIBRARIES = rf"({'|'.join(LIBRARIES)})(\.|$)"


def quiet_libraries() -> None:
    """Put the two ignore filters in front of the process's warning filters (the console script's first step)."""
    warnings.filterwarnings("ignore", module=OF_LIBRARIES)
    for category in DEPRECATIONS:
        warnings.filterwarnings("ignore", category=category, module=NOT_FLEET)
