"""Remote probes: for each, the argv to run and a pure parser of its stdout.

Nothing here does I/O. A probe is a function returning an argv list (no shell,
no quoting: the transport quotes once) and a parser from the command's stdout
text to frozen dataclasses. Malformed output raises `ProbeParseError`, whose
message names the 1-based line number and shows the line, clipped.

`fleet.probes.smi` holds the nvidia-smi probes (GPU and compute-app queries,
null values, failure classification); `fleet.probes.procs` the node's process
and systemd probes (device holders, ps, exe, alive, kill, unit state, and the
protected-process match); `fleet.probes.lineage` where a process comes from
(its ancestors, fleet's own process chain, its systemd unit);
`fleet.probes.privilege` says which commands need root (`needs_root`). Every
public name of them is importable from here.
"""

from __future__ import annotations

from fleet.node.probes._parse import LINE_CLIP, ProbeParseError
from fleet.node.probes.lineage import (
    LINEAGE_AWK,
    LINEAGE_DEPTH,
    SIM_NODE_VAR,
    SIM_UNIT_VAR,
    Lineage,
    ProcStat,
    cgroup_argv,
    lineage_argv,
    parse_cgroups,
    parse_lineage,
    parse_sim_units,
    sim_units_argv,
    unit_of_cgroup,
)
from fleet.node.probes.privilege import needs_root
from fleet.node.probes.procs import (
    COMM_LEN,
    SIGNALS,
    SSHD_NAMES,
    Holder,
    PsRow,
    UnitState,
    alive_argv,
    exe_argv,
    full_name,
    holders_scan_argv,
    is_protected,
    is_sshd,
    kill_argv,
    parse_exe,
    parse_holders,
    parse_pids,
    parse_ps,
    parse_unit_restart,
    parse_unit_state,
    ps_argv,
    unit_kill_argv,
    unit_restart_argv,
    unit_state_argv,
    unit_stop_argv,
)
from fleet.node.probes.smi import (
    COMPUTE_APPS_FIELDS,
    NULL_VALUES,
    SETTLE_FIELDS,
    SMI_FORMAT,
    SMI_SEPARATOR,
    VERIFY_FIELDS,
    ComputeApp,
    GpuRow,
    classify_smi_failure,
    compute_apps_argv,
    field_value,
    gpu_query_argv,
    parse_compute_apps,
    parse_gpu_csv_with_header,
    parse_gpu_query,
    parse_mib,
)

__all__ = [
    "COMM_LEN",
    "COMPUTE_APPS_FIELDS",
    "LINEAGE_AWK",
    "LINEAGE_DEPTH",
    "LINE_CLIP",
    "NULL_VALUES",
    "SETTLE_FIELDS",
    "SIGNALS",
    "SIM_NODE_VAR",
    "SIM_UNIT_VAR",
    "SMI_FORMAT",
    "SMI_SEPARATOR",
    "SSHD_NAMES",
    "VERIFY_FIELDS",
    "ComputeApp",
    "GpuRow",
    "Holder",
    "Lineage",
    "ProbeParseError",
    "ProcStat",
    "PsRow",
    "UnitState",
    "alive_argv",
    "cgroup_argv",
    "classify_smi_failure",
    "compute_apps_argv",
    "exe_argv",
    "field_value",
    "full_name",
    "gpu_query_argv",
    "holders_scan_argv",
    "is_protected",
    "is_sshd",
    "kill_argv",
    "lineage_argv",
    "needs_root",
    "parse_cgroups",
    "parse_compute_apps",
    "parse_exe",
    "parse_gpu_csv_with_header",
    "parse_gpu_query",
    "parse_holders",
    "parse_lineage",
    "parse_mib",
    "parse_pids",
    "parse_ps",
    "parse_sim_units",
    "parse_unit_restart",
    "parse_unit_state",
    "ps_argv",
    "sim_units_argv",
    "unit_kill_argv",
    "unit_of_cgroup",
    "unit_restart_argv",
    "unit_state_argv",
    "unit_stop_argv",
]
