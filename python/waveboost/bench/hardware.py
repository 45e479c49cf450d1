"""Peak HBM bandwidth of the device, for the serving cells' "% of peak".

First a table of published peaks by device name (vendor data sheets, TB/s = 1e12 bytes/s);
else the driver's memory clock x bus width x 2 (double data rate), read through the CUDA driver
API; else unknown. The source is reported with the number, so a reader sees which one was used.
"""

from __future__ import annotations

# (substring of the device name, GB/s, the part it stands for); first match wins, so the longer,
# more specific names come before the shorter ones they contain.
PEAK_HBM_GBS = (
    ("GH200", 4000.0, "GH200 (HBM3, 96 GB)"),
    ("H200", 4800.0, "H200 (HBM3e)"),
    ("H100 NVL", 3900.0, "H100 NVL"),
    ("H100 PCIe", 2000.0, "H100 PCIe"),
    ("H100", 3350.0, "H100 SXM5 (HBM3)"),
    ("H800", 3350.0, "H800 SXM5"),
    ("B200", 8000.0, "B200"),
    ("A100-SXM4-80GB", 2039.0, "A100 SXM4 80 GB"),
    ("A100 80GB PCIe", 1935.0, "A100 PCIe 80 GB"),
    ("A100", 1555.0, "A100 40 GB"),
    ("L40S", 864.0, "L40S"),
    ("A10G", 600.0, "A10G"),
    ("RTX 4090", 1008.0, "GeForce RTX 4090"),
)

_MEMORY_CLOCK_KHZ, _BUS_WIDTH_BITS = 36, 37  # CUdevice_attribute


def _driver_peak_gbs(ordinal: int) -> float | None:
    """2 x memory clock x bus width from the CUDA driver, or None where it cannot be read."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, clock, width = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return None
    if cuda.cuDeviceGetAttribute(ctypes.byref(clock), _MEMORY_CLOCK_KHZ, device) != 0:
        return None
    if cuda.cuDeviceGetAttribute(ctypes.byref(width), _BUS_WIDTH_BITS, device) != 0:
        return None
    if clock.value <= 0 or width.value <= 0:
        return None
    return 2 * clock.value * 1e3 * width.value / 8 / 1e9


def peak_bandwidth(device: str, name: str, override: float | None = None, ordinal: int = 0) -> tuple:
    """(GB/s or None, where the number comes from)."""
    if override:
        return override, "--peak-gbs"
    if device != "cuda":
        return None, "unknown for a CPU (give --peak-gbs)"
    for key, gbs, part in PEAK_HBM_GBS:
        if key.lower() in name.lower():
            return gbs, f"table: {part} {gbs / 1e3:g} TB/s"
    gbs = _driver_peak_gbs(ordinal)
    if gbs:
        return gbs, "driver: 2 x memory clock x bus width"
    return None, f"unknown for {name!r} (give --peak-gbs)"
