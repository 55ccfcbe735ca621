"""The facts fleet reads of each GPU from nvidia-smi, one row each: the only place a fact is declared.

A `Field` row says, for one fact: its name (`GpuHealth[FIELD]`, a test's keyword), the `--query-gpu` field that
answers it (or the `-q -d` section it is read from instead), where `nvidia-smi -q` prints it (key paths as printed,
matched without regard to case; several are summed, as the ECC counters of one kind of memory are), how its text
reads (`Reader`), the unit `-q` prints after the value, the health check it feeds (`fleet.model.health_checks`),
what an error note in it means, and what a healthy simulated GPU prints for it. From the table come `GpuHealth`'s
facts, the `--query-gpu` list and the `-q` lookup (`fleet.node.probes.health`), the health gate's "read from"
column (`fleet.model.health_checks`) and the simulated nvidia-smi's answers (`fleet.sim.nvidia_smi`).

What nvidia-smi prints instead of a value (captures in tests/fixtures/nvidia-smi): `N/A` and `Not Supported`
(bracketed in --query-gpu, bare in -q) mean the fact does not apply to this GPU: it is absent. NVML's error
strings (`NVML_ERRORS`, bare or bracketed) and any other bracketed note mean the value was asked for and not got:
in a `strict` field the fact was not observed and its check fails (`GpuHealth.unread`); in another it is absent.

A leaf of the model: stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, TypeVar

__all__ = ["FIELDS", "MAYBE_NOTE", "NOT_APPLICABLE", "NVML_ERRORS", "SETTINGS", "Field", "GpuHealth", "GpuSettings",
           "Reader", "Unread", "count", "current", "derived", "reading", "registered", "switch", "watts", "word"]

T = TypeVar("T")
R = TypeVar("R")
Path = tuple[str, ...]

# What nvidia-smi prints for a value that does not apply to this GPU: no page retirement on a GPU with a row
# remapper, no fabric without NVSwitch. The fact is absent: nothing to judge.
NOT_APPLICABLE = frozenset({"", "N/A", "Not Supported"})
# NVML's error strings (nvmlErrorString, as the NVML headers and bindings spell them), which nvidia-smi prints in
# place of a value it asked for and did not get: bare in -q, bracketed in --query-gpu (any bracketed note counts
# too), and `Not Available`, which older -q output prints. The fact was not observed: never read as "fine".
NVML_ERRORS = frozenset({
    "Unknown Error", "GPU is lost", "Insufficient Permissions", "Not Available", "Timeout", "GPU requires reset",
    "GPU requires restart", "Corrupted infoROM", "Corrupted InfoROM", "Driver Not Loaded", "Uninitialized",
    "Invalid Argument", "Not Found", "Function Not Found", "Insufficient Memory", "No data", "In use by another client",
    "Interrupt Request Issue", "IRQ Issue", "Requested functionality has been deprecated", "Deprecated", "Not Ready",
    "GPU not found", "Invalid state", "The operating system has blocked the request",
})

# Every text `reading` may take for a note or for "not applicable", but those that begin with "[": any other text is
# a plain value (the parsers' fast path: a cell that is neither is read without `reading`).
MAYBE_NOTE = NOT_APPLICABLE | NVML_ERRORS


def reading(raw: str) -> tuple[str | None, str | None]:
    """(the value, None); (None, None) where it does not apply; (None, the note) where nvidia-smi printed an
    error note instead (`NVML_ERRORS`, or any bracketed note but `[N/A]` and `[Not Supported]`)."""
    value = raw.strip()
    bracketed = value[:1] == "[" and value[-1:] == "]"
    inner = value[1:-1] if bracketed else value
    if inner in NOT_APPLICABLE:
        return None, None
    if bracketed or inner in NVML_ERRORS:
        return None, value
    return value, None


# --- how a value reads ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reader(Generic[T]):
    """A value's text (stripped, never a note) to its value; `ValueError` saying what was expected. `plain`: the
    same reading by a builtin where there is one (`int`, `float`, a dict's lookup: no call of Python a value), for
    the parsers' fast path; whatever it raises, the text is read again by `parse`, for its message."""

    what: str  # the value in an error message: "PCIe link width"
    parse: Callable[[str], T]
    plain: Callable[[str], T] | None = None  # None: `parse`

    @property
    def fast(self) -> Callable[[str], T]:
        return self.parse if self.plain is None else self.plain


def switch(on: str, off: str) -> Reader[bool]:
    def parse(text: str) -> bool:
        if text != on and text != off:
            raise ValueError(f"expected {on!r} or {off!r}")
        return text == on
    return Reader(f"{on!r} or {off!r}", parse, {on: True, off: False}.__getitem__)


def count(what: str) -> Reader[int]:
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{what} is not an integer") from None
    return Reader(what, parse, int)


def word(what: str) -> Reader[str]:
    return Reader(what, str)


# --- the table ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Field(Generic[T]):
    """One fact of a GPU nvidia-smi reads: see the module."""

    name: str  # the fact: `GpuHealth[field]`, and a test's keyword for it
    query: str  # its `--query-gpu` field (the simulated nvidia-smi answers it by this name)
    q: tuple[Path, ...]  # where `nvidia-smi -q` prints it, key paths as printed (the first: where the simulator does;
    # one key alone may be the header's, before the GPUs: `Driver Version`)
    read: Reader[T]
    check: str | None = None  # the health check it feeds (`fleet.model.health_checks`); None: no check reads it
    strict: bool = False  # an error note in it is a fact not observed, failing `check`; else the fact is absent
    display: str | None = None  # read from `nvidia-smi -q -d DISPLAY` instead of --query-gpu (a field not every
    # driver's --query-gpu knows: one unknown field fails the whole query)
    unit: str = ""  # what -q prints after the value ("16x"); --query-gpu with nounits prints none
    total: bool = False  # the sum of every `q` path printed, not the first
    sim: str = "[N/A]"  # what a healthy simulated GPU prints for it in --query-gpu (nounits)

    def __post_init__(self) -> None:
        if self.strict and self.check is None:
            raise ValueError(f"{self.name}: a strict field names the check an error note in it fails")

    @property
    def like(self) -> str:
        """An example of the value as -q prints it (the simulator's): `16x`."""
        return f"{'0' if self.sim.startswith('[') else self.sim}{self.unit}"


_LINK = ("PCI", "GPU Link Info")
_VOLATILE = ("ECC Errors", "Volatile")

PERSISTENCE = Field(name="persistence", query="persistence_mode", q=(("Persistence Mode",),),
                    read=switch("Enabled", "Disabled"), check="persistence", sim="Enabled")
ECC_CORRECTED = Field(
    name="ecc_corrected", query="ecc.errors.corrected.volatile.total",
    q=((*_VOLATILE, "SRAM Correctable"), (*_VOLATILE, "DRAM Correctable"), (*_VOLATILE, "Single Bit", "Total")),
    read=count("ECC error count"), check="ecc_corrected", strict=True, total=True, sim="0")
ECC_UNCORRECTED = Field(
    name="ecc_uncorrected", query="ecc.errors.uncorrected.volatile.total",
    q=((*_VOLATILE, "DRAM Uncorrectable"), (*_VOLATILE, "SRAM Uncorrectable"),
       (*_VOLATILE, "SRAM Uncorrectable Parity"), (*_VOLATILE, "SRAM Uncorrectable SEC-DED"),
       (*_VOLATILE, "Double Bit", "Total")),
    read=count("ECC error count"), check="ecc_uncorrected", strict=True, total=True, sim="0")
RETIRED_PENDING = Field(  # `Pending Page Blacklist` (most drivers) or `Pending Page Retirement` (newer ones)
    name="retired_pending", query="retired_pages.pending",
    q=(("Retired Pages", "Pending Page Blacklist"), ("Retired Pages", "Pending Page Retirement")),
    read=switch("Yes", "No"), check="retired_pending", strict=True)
REMAP_PENDING = Field(name="remap_pending", query="remapped_rows.pending", q=(("Remapped Rows", "Pending"),),
                      read=switch("Yes", "No"), check="remap_pending", strict=True, display="ROW_REMAPPER", sim="No")
REMAP_FAILED = Field(name="remap_failed", query="remapped_rows.failure",
                     q=(("Remapped Rows", "Remapping Failure Occurred"),), read=switch("Yes", "No"),
                     check="remap_failed", strict=True, display="ROW_REMAPPER", sim="No")
FABRIC_STATE = Field(name="fabric_state", query="fabric.state", q=(("Fabric", "State"),), read=word("fabric state"),
                     check="fabric", strict=True, sim="Completed")
FABRIC_STATUS = Field(name="fabric_status", query="fabric.status", q=(("Fabric", "Status"),),
                      read=word("fabric status"), check="fabric", strict=True, sim="Success")
PCIE_GEN = Field(name="pcie_gen", query="pcie.link.gen.current", q=((*_LINK, "PCIe Generation", "Current"),),
                 read=count("PCIe generation"), sim="5")
PCIE_GEN_MAX = Field(name="pcie_gen_max", query="pcie.link.gen.max", q=((*_LINK, "PCIe Generation", "Max"),),
                     read=count("PCIe generation"), sim="5")
PCIE_WIDTH = Field(name="pcie_width", query="pcie.link.width.current", q=((*_LINK, "Link Width", "Current"),),
                   read=count("PCIe link width"), check="pcie_width", unit="x", sim="16")
PCIE_WIDTH_MAX = Field(name="pcie_width_max", query="pcie.link.width.max", q=((*_LINK, "Link Width", "Max"),),
                       read=count("PCIe link width"), check="pcie_width", unit="x", sim="16")

# --- the settings a last user may leave behind: read in the same reads, recorded, not judged here ---
# From the captures in tests/fixtures/nvidia-smi (SOURCES.md): --query-gpu names and values from the 590.48.01 H100
# all-fields capture, -q paths from the 460.32.03 A100, 535.183.01 H100 and 590.48.01 H200 captures.


def watts(what: str) -> Reader[float]:
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{what} is not a number of watts") from None
    return Reader(what, parse, float)


_POWER, _OLD_POWER = "GPU Power Readings", "Power Readings"  # 535 and newer; before (460)
_REASONS = ("Clocks Event Reasons", "Clocks Throttle Reasons")  # 535 and newer; before (460)
_MHZ = " MHz"
_DEPRECATED = "[Requested functionality has been deprecated]"  # application clocks on 590 (the H100 capture)

PRODUCT = Field(name="name", query="name", q=(("Product Name",),), read=word("GPU model"),
                sim="NVIDIA H100 80GB HBM3")
VBIOS = Field(name="vbios", query="vbios_version", q=(("VBIOS Version",),), read=word("VBIOS version"),
              sim="96.00.A5.00.01")
DRIVER = Field(name="driver", query="driver_version", q=(("Driver Version",),), read=word("driver version"),
               sim="590.48.01")
COMPUTE_MODE = Field(name="compute_mode", query="compute_mode", q=(("Compute Mode",),), read=word("compute mode"),
                     sim="Default")
MIG = Field(name="mig", query="mig.mode.current", q=(("MIG Mode", "Current"),), read=switch("Enabled", "Disabled"),
            sim="Disabled")
MIG_PENDING = Field(name="mig_pending", query="mig.mode.pending", q=(("MIG Mode", "Pending"),),
                    read=switch("Enabled", "Disabled"), sim="Disabled")
ECC = Field(name="ecc", query="ecc.mode.current", q=(("ECC Mode", "Current"),), read=switch("Enabled", "Disabled"),
            sim="Enabled")
ECC_PENDING = Field(name="ecc_pending", query="ecc.mode.pending", q=(("ECC Mode", "Pending"),),
                    read=switch("Enabled", "Disabled"), sim="Enabled")
POWER_LIMIT = Field(name="power_limit_w", query="power.limit",
                    q=((_POWER, "Requested Power Limit"), (_OLD_POWER, "Power Limit")),
                    read=watts("power limit"), unit=" W", sim="700.00")
ENFORCED_POWER_LIMIT = Field(name="enforced_power_limit_w", query="enforced.power.limit",
                             q=((_POWER, "Current Power Limit"), (_OLD_POWER, "Enforced Power Limit")),
                             read=watts("enforced power limit"), unit=" W", sim="700.00")
DEFAULT_POWER_LIMIT = Field(name="default_power_limit_w", query="power.default_limit",
                            q=((_POWER, "Default Power Limit"), (_OLD_POWER, "Default Power Limit")),
                            read=watts("default power limit"), unit=" W", sim="700.00")
APP_CLOCKS_SETTING = Field(name="app_clocks_setting", query="clocks_event_reasons.applications_clocks_setting",
                           q=tuple((reasons, "Applications Clocks Setting") for reasons in _REASONS),
                           read=switch("Active", "Not Active"), sim="Not Active")
APP_CLOCK_GRAPHICS = Field(name="app_clock_graphics_mhz", query="clocks.applications.graphics",
                           q=(("Applications Clocks", "Graphics"),), read=count("application clock"), unit=_MHZ,
                           sim=_DEPRECATED)
APP_CLOCK_MEMORY = Field(name="app_clock_memory_mhz", query="clocks.applications.memory",
                         q=(("Applications Clocks", "Memory"),), read=count("application clock"), unit=_MHZ,
                         sim=_DEPRECATED)
DEFAULT_APP_CLOCK_GRAPHICS = Field(name="default_app_clock_graphics_mhz", query="clocks.default_applications.graphics",
                                   q=(("Default Applications Clocks", "Graphics"),), read=count("application clock"),
                                   unit=_MHZ, sim=_DEPRECATED)
DEFAULT_APP_CLOCK_MEMORY = Field(name="default_app_clock_memory_mhz", query="clocks.default_applications.memory",
                                 q=(("Default Applications Clocks", "Memory"),), read=count("application clock"),
                                 unit=_MHZ, sim=_DEPRECATED)
SETTINGS: tuple[Field[Any], ...] = (
    PRODUCT, VBIOS, DRIVER, PERSISTENCE, COMPUTE_MODE, MIG, MIG_PENDING, ECC, ECC_PENDING, POWER_LIMIT,
    ENFORCED_POWER_LIMIT, DEFAULT_POWER_LIMIT, APP_CLOCKS_SETTING, APP_CLOCK_GRAPHICS, APP_CLOCK_MEMORY,
    DEFAULT_APP_CLOCK_GRAPHICS, DEFAULT_APP_CLOCK_MEMORY,
)

# The facts, in the order --query-gpu asks them (after `pci.bus_id`): the bytes on the wire.
FIELDS: tuple[Field[Any], ...] = (
    PERSISTENCE, ECC_CORRECTED, ECC_UNCORRECTED, RETIRED_PENDING, REMAP_PENDING, REMAP_FAILED, FABRIC_STATE,
    FABRIC_STATUS, PCIE_GEN, PCIE_GEN_MAX, PCIE_WIDTH, PCIE_WIDTH_MAX,
    *(fact for fact in SETTINGS if fact is not PERSISTENCE),
)
_current: list[tuple[Field[Any], ...]] = [FIELDS]


def current() -> tuple[Field[Any], ...]:
    """The table as it is now: `FIELDS` and any row `registered` (a test's, a plug's)."""
    return _current[0]


@contextmanager
def registered(*rows: Field[Any]) -> Iterator[None]:
    """The table with `rows` added after the others while the block runs."""
    names = {f.name for f in current()} | {f.query for f in current()}
    taken = [f.name for f in rows if f.name in names or f.query in names]
    if taken:
        raise ValueError(f"already in the table of GPU facts: {', '.join(taken)}")
    before = _current[0]
    _current[0] = (*before, *rows)
    try:
        yield
    finally:
        _current[0] = before


def derived(build: Callable[[tuple[Field[Any], ...]], R]) -> Callable[[], R]:
    """`build` of the current table, built again only when the table changes (a row registered)."""
    memo: dict[int, tuple[tuple[Field[Any], ...], R]] = {}

    def get() -> R:
        table = _current[0]
        held = memo.get(0)
        if held is None or held[0] is not table:
            held = memo[0] = (table, build(table))
        return held[1]
    return get


# --- one GPU's facts ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unread:
    """A fact nvidia-smi did not give: the check it is read for, the field (as --query-gpu names it, or -q's key
    path) and what nvidia-smi printed instead (`[Unknown Error]`)."""

    check: str
    field: str
    note: str


@dataclass(frozen=True)
class GpuHealth:
    """What nvidia-smi says of one GPU: each fact of the table it gave (`gpu[PCIE_WIDTH]`; None: not said, or
    not applicable), and the facts it printed an error note for (not observed, never "fine")."""

    bus_id: str  # as nvidia-smi prints it: "00000000:83:00.0"
    facts: Mapping[str, object] = field(default_factory=dict)  # by `Field.name`; a fact not said is not here
    unread: tuple[Unread, ...] = ()

    def __getitem__(self, fact: Field[T]) -> T | None:
        # its row's reader made it a T (not `cast`: a call, and this is read per GPU and check)
        return self.facts.get(fact.name)  # type: ignore[return-value]

    def said(self, **facts: object) -> GpuHealth:
        """These facts (by `Field.name`) changed; None takes one away."""
        merged = {**self.facts, **facts}
        return replace(self, facts={name: value for name, value in merged.items() if value is not None})


@dataclass(frozen=True, kw_only=True)
class GpuSettings:
    """The settings of one GPU a benchmark's results depend on, as nvidia-smi said them (None: not said, not
    applicable, or an error note): the rows of `SETTINGS`, by name. Recorded in the report; judged against the
    expected profile by `fleet.model.gpu_profile` and across the rack by `fleet.model.uniformity`."""

    name: str | None = None  # the model: "NVIDIA H100 80GB HBM3"
    vbios: str | None = None
    driver: str | None = None
    persistence: bool | None = None
    compute_mode: str | None = None  # "Default", "Exclusive_Process", "Prohibited"
    mig: bool | None = None
    mig_pending: bool | None = None
    ecc: bool | None = None
    ecc_pending: bool | None = None
    power_limit_w: float | None = None  # what was asked (nvidia-smi -pl)
    enforced_power_limit_w: float | None = None  # what holds (the least of every limiter)
    default_power_limit_w: float | None = None
    app_clocks_setting: bool | None = None  # the clock event reason "Applications Clocks Setting" is active
    app_clock_graphics_mhz: int | None = None  # nvidia-smi -ac; deprecated on 590 and later (not said)
    app_clock_memory_mhz: int | None = None
    default_app_clock_graphics_mhz: int | None = None
    default_app_clock_memory_mhz: int | None = None

    @classmethod
    def of(cls, gpu: GpuHealth) -> GpuSettings:
        """Its settings: each `SETTINGS` row's fact, by the field of its name (the fields are the rows, checked
        below)."""
        facts: Mapping[str, Any] = gpu.facts  # each by its row's reader: the field's type
        return cls(**{name: facts.get(name) for name in _SETTING_NAMES})

    @classmethod
    def of_each(cls, gpus: Sequence[GpuHealth]) -> list[GpuSettings]:
        """Each GPU's settings (`of`); a GPU whose facts are the GPU before it's (nearly every GPU of a node: one
        model, driver and set of settings; their dicts compared in C) has that GPU's settings, the same value
        (frozen), not made again."""
        said: list[GpuSettings] = []
        for before, gpu in zip([None, *gpus], gpus, strict=False):  # each with the one before it (None: the first)
            said.append(said[-1] if before is not None and before.facts == gpu.facts else cls.of(gpu))
        return said


_SETTING_NAMES = tuple(fact.name for fact in SETTINGS)
if tuple(f.name for f in fields(GpuSettings)) != _SETTING_NAMES:
    raise TypeError("GpuSettings' fields are not SETTINGS' rows, in their order")
