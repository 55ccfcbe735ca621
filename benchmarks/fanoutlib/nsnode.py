"""Run inside a simulated node's PID namespace (pidns.py) by the testbed: start the node, or make it busy again.

    nsnode.py ROOT NAME LINGER_S PROTECTED(0|1) start|busy

`start` starts the node's daemon, unit and workers and waits until they hold their GPUs; `busy` starts the
unit again if the last reset stopped it. The processes stay in the namespace when this exits (its init reaps
them); their pids, recorded in the node's state folder, are the namespace's, as on a real node.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]

from fanoutlib.common import UNIT  # noqa: E402
from fanoutlib.testbed import node_spec  # noqa: E402
from fleet.sim.node import SimNode  # noqa: E402


def main() -> None:
    root, name, linger, protected, action = sys.argv[1:6]
    node = SimNode(Path(root), node_spec(name, float(linger), protected == "1"))
    if action == "start":
        node.start()
    elif action == "busy":
        if node.unit_state(UNIT) != "active":
            node.start_unit(UNIT)
    else:
        sys.exit(f"unknown action {action!r}")


if __name__ == "__main__":
    main()
