"""Remote probes: for each, the argv to run and a pure parser of its stdout.

Nothing here does I/O. A probe is a function returning an argv list (no shell,
no quoting: the transport quotes once) and a parser from the command's stdout
text to frozen dataclasses. Malformed output raises `ProbeParseError`, whose
message names the 1-based line number and shows the line, clipped.

`fleet.probes.smi` holds the nvidia-smi probes (GPU and compute-app queries,
null values, failure classification); `fleet.probes.procs` the node's process
and systemd probes (device holders, ps, exe, alive, kill, unit state, and the
protected-process match). Every public name of both is importable from here.
"""

from __future__ import annotations

from fleet.probes._parse import LINE_CLIP, ProbeParseError
from fleet.probes.procs import (
    COMM_LEN,
    SIGNALS,
    Holder,
    PsRow,
    UnitState,
    alive_argv,
    exe_argv,
    holders_scan_argv,
    is_protected,
    kill_argv,
    parse_exe,
    parse_holders,
    parse_pids,
    parse_ps,
    parse_unit_state,
    ps_argv,
    unit_kill_argv,
    unit_state_argv,
    unit_stop_argv,
)
from fleet.probes.smi import (
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
    "LINE_CLIP",
    "NULL_VALUES",
    "SETTLE_FIELDS",
    "SIGNALS",
    "SMI_FORMAT",
    "SMI_SEPARATOR",
    "VERIFY_FIELDS",
    "ComputeApp",
    "GpuRow",
    "Holder",
    "ProbeParseError",
    "PsRow",
    "UnitState",
    "alive_argv",
    "classify_smi_failure",
    "compute_apps_argv",
    "exe_argv",
    "field_value",
    "gpu_query_argv",
    "holders_scan_argv",
    "is_protected",
    "kill_argv",
    "parse_compute_apps",
    "parse_exe",
    "parse_gpu_csv_with_header",
    "parse_gpu_query",
    "parse_holders",
    "parse_mib",
    "parse_pids",
    "parse_ps",
    "parse_unit_state",
    "ps_argv",
    "unit_kill_argv",
    "unit_state_argv",
    "unit_stop_argv",
]
