"""Where a simulated GPU sits on the PCI bus, and the Xid the driver logs for it: stdlib only, imported by
`state` (which logs the Xid of a worker killed holding memory), `nvidia_smi` (which prints the bus ids) and
`journalctl`, so none of the three imports another in a circle."""

from __future__ import annotations

BUS_IDS = ("19", "3B", "4C", "5D", "9B", "BB", "CB", "DB")


def bus_id(index: int) -> str:
    bus = BUS_IDS[index] if index < len(BUS_IDS) else f"{0xE0 + index:02X}"
    return f"00000000:{bus}:00.0"


def pci_address(bus_id: str) -> str:
    """The GPU's PCI address as the driver writes it in an Xid: `00000000:1B:00.0` -> `0000:1b:00`."""
    domain, bus, device_fn = bus_id.split(":")
    return f"{domain[-4:]}:{bus}:{device_fn.split('.')[0]}".lower()


def xid_message(bus_id: str, code: int, text: str) -> str:
    """The kernel message of Xid `code` on the GPU at `bus_id`; `text` is what follows the code, as the
    driver prints it (e.g. "pid=1234, name=python3, GPU has fallen off the bus.")."""
    return f"NVRM: Xid (PCI:{pci_address(bus_id)}): {code}, {text}"
