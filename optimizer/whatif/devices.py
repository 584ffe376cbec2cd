"""The accelerators the what-if estimate knows, from their vendors' datasheets.

Figures are per device and dense (no structured sparsity: the datasheets' starred figures are
twice these). `link_gbs` is the device-to-device bandwidth the datasheet states (NVLink and
Infinity Fabric: both directions together; PCIe: one x16 slot, both directions); an
all-reduce is costed on half of it, one direction. Memory is the datasheet's figure: on the HBM
parts (A100, H100, H100 NVL, H200, B200, MI300X) that is GiB (an "80GB" H100 reports 81,559 MiB
to nvidia-smi), on the GDDR parts (L40S, L40, L4, A10) 10^9 bytes (an L4's 24 GB is 23,034 MiB).
An operator adds a device the table lacks with `custom` (config `whatif.devices`, in 10^9 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import ConfigError


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_gb: float  # on-device memory, 10^9 bytes
    bandwidth_gbs: float  # memory bandwidth, GB/s
    bf16_tflops: float  # dense bf16/fp16 tensor throughput
    fp8_tflops: float | None  # dense fp8 tensor throughput; None: no fp8 tensor cores
    link_gbs: float  # device-to-device, as the datasheet states it
    link: str  # what that link is
    source: str  # where the figures come from
    binary: bool = False  # memory_gb is GiB (HBM parts' datasheets), not 10^9 bytes
    custom: bool = False  # described by the operator: only the roofline estimates it

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * (2**30 if self.binary else 1e9)


KNOWN: dict[str, DeviceSpec] = {d.name: d for d in (
    DeviceSpec("a100", 80, 2039, 312, None, 600, "NVLink 3",
               "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)", binary=True),
    DeviceSpec("h100", 80, 3350, 989, 1979, 900, "NVLink 4",
               "NVIDIA H100 Tensor Core GPU datasheet (SXM5)", binary=True),
    DeviceSpec("h100-nvl", 94, 3900, 835, 1670, 600, "NVLink bridge",
               "NVIDIA H100 NVL datasheet (per GPU of the pair)", binary=True),
    DeviceSpec("h200", 141, 4800, 989, 1979, 900, "NVLink 4",
               "NVIDIA H200 Tensor Core GPU datasheet (SXM)", binary=True),
    DeviceSpec("b200", 180, 8000, 2250, 4500, 1800, "NVLink 5",
               "NVIDIA DGX B200 datasheet (per GPU: 1,440 GB, 64 TB/s, 72 PFLOPS fp8 sparse over 8)", binary=True),
    DeviceSpec("l40s", 48, 864, 362, 733, 64, "PCIe Gen4 x16",
               "NVIDIA L40S datasheet"),
    DeviceSpec("l40", 48, 864, 181, 362, 64, "PCIe Gen4 x16",
               "NVIDIA L40 datasheet"),
    DeviceSpec("l4", 24, 300, 121, 242, 64, "PCIe Gen4 x16",
               "NVIDIA L4 Tensor Core GPU datasheet"),
    DeviceSpec("a10", 24, 600, 125, None, 64, "PCIe Gen4 x16",
               "NVIDIA A10 Tensor Core GPU datasheet"),
    DeviceSpec("mi300x", 192, 5300, 1307, 2615, 896, "Infinity Fabric",
               "AMD Instinct MI300X accelerator datasheet", binary=True),
)}


def known(name: str) -> DeviceSpec:
    """The device called `name` (any case); a ConfigError naming the known ones otherwise."""
    key = name.strip().lower()
    if key not in KNOWN:
        raise ConfigError(f"what-if: unknown device {name!r}; known: {', '.join(KNOWN)} (or describe it in "
                          "config whatif.devices)")
    return KNOWN[key]


def custom(name: str, fields: dict) -> DeviceSpec:
    """A device the operator describes: memory_gb, bandwidth_gbs, bf16_tflops, and optionally
    fp8_tflops, link_gbs (default PCIe Gen4's 64), link, source."""
    need = ("memory_gb", "bandwidth_gbs", "bf16_tflops")
    missing = [k for k in need if k not in fields]
    if missing:
        raise ConfigError(f"whatif.devices.{name}: give {', '.join(missing)} (numbers from its datasheet)")
    bad = [k for k in (*need, "fp8_tflops", "link_gbs") if k in fields and fields[k] is not None
           and (isinstance(fields[k], bool) or not isinstance(fields[k], (int, float)) or fields[k] <= 0)]
    if bad:
        raise ConfigError(f"whatif.devices.{name}: {bad[0]} is {fields[bad[0]]!r}; give a number above 0")
    return DeviceSpec(name.lower(), float(fields["memory_gb"]), float(fields["bandwidth_gbs"]),
                      float(fields["bf16_tflops"]), fields.get("fp8_tflops"), float(fields.get("link_gbs", 64)),
                      str(fields.get("link", "as given")), str(fields.get("source", "the operator's config")),
                      custom=True)


# nvidia-smi / rocm-smi names -> the table's, most specific first ("H100 NVL" before "H100").
_NAMES = (("h100 nvl", "h100-nvl"), ("h100", "h100"), ("h200", "h200"), ("b200", "b200"), ("a100", "a100"),
          ("l40s", "l40s"), ("l40", "l40"), ("l4", "l4"), ("a10", "a10"), ("mi300x", "mi300x"))


def match(reported: str) -> DeviceSpec | None:
    """The table's device for a name nvidia-smi reports ("NVIDIA H100 80GB HBM3" -> h100), or None.
    An A10G (not an A10) and anything the table lacks are None."""
    text = reported.lower()
    if "a10g" in text:
        return None
    for needle, name in _NAMES:
        if needle in text:
            return KNOWN[name]
    return None
