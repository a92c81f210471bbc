"""The job's GPUs through NVML (nvidia-ml-py): SM utilisation, memory used, power, energy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

MB = 1024 * 1024


@dataclass
class Series:
    """Mean and peak of one metric over its samples."""

    total: float = 0.0
    count: int = 0
    peak: float | None = None

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.total += value
        self.count += 1
        self.peak = value if self.peak is None else max(self.peak, value)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass
class Device:
    """One GPU of the job and its sampled series."""

    label: str
    handle: Any
    uuid: str
    name: str
    memory_total_mb: float
    energy_start_mj: int | None
    energy_last_mj: int | None = None
    sm_util: Series = field(default_factory=Series)
    memory_used_mb: Series = field(default_factory=Series)
    power_w: Series = field(default_factory=Series)
    energy_integrated_j: float = 0.0
    unsupported: set[str] = field(default_factory=set)

    def sample(self, interval_s: float) -> None:
        """Read utilisation, memory and power once."""
        util = _read(self, "sm_util", pynvml.nvmlDeviceGetUtilizationRates, self.handle)
        memory = _read(self, "memory", pynvml.nvmlDeviceGetMemoryInfo, self.handle)
        power_mw = _read(self, "power", pynvml.nvmlDeviceGetPowerUsage, self.handle)
        self.sm_util.add(None if util is None else float(util.gpu))
        self.memory_used_mb.add(None if memory is None else memory.used / MB)
        if power_mw is not None:
            self.power_w.add(power_mw / 1000)
            self.energy_integrated_j += power_mw / 1000 * interval_s
        if self.energy_start_mj is not None:
            energy = _read(self, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, self.handle)
            self.energy_last_mj = self.energy_last_mj if energy is None else energy

    def energy_j(self) -> float | None:
        """Energy from the first sample to the last: NVML's counter where supported, else power
        x time. From the samples, never read here: a summary may follow NVML's shutdown."""
        if self.energy_start_mj is not None and self.energy_last_mj is not None:
            return (self.energy_last_mj - self.energy_start_mj) / 1000
        return self.energy_integrated_j if self.power_w.count else None

    def summary(self) -> dict[str, Any]:
        return {
            "device": self.label,
            "uuid": self.uuid,
            "name": self.name,
            "sm_util_mean": self.sm_util.mean,
            "sm_util_peak": self.sm_util.peak,
            "memory_used_mean_mb": self.memory_used_mb.mean,
            "memory_used_peak_mb": self.memory_used_mb.peak,
            "memory_total_mb": self.memory_total_mb,
            "power_mean_w": self.power_w.mean,
            "power_peak_w": self.power_w.peak,
            "energy_j": self.energy_j(),
            "unsupported": sorted(self.unsupported),
        }


def _read(device: Device | None, metric: str, reader: Any, *args: Any) -> Any:
    """`reader(*args)`, or None when NVML says the device cannot give it."""
    try:
        return reader(*args)
    except pynvml.NVMLError:
        if device is not None:
            device.unsupported.add(metric)
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _handles(visible: str | None) -> list[tuple[str, Any]]:
    """(label, handle) of every device CUDA_VISIBLE_DEVICES names."""
    if visible is None:
        count = pynvml.nvmlDeviceGetCount()
        return [(str(i), pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    found = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit():
            found.append((entry, pynvml.nvmlDeviceGetHandleByIndex(int(entry))))
        elif entry.startswith(("GPU-", "MIG-")):
            found.append((entry, pynvml.nvmlDeviceGetHandleByUUID(entry)))
        else:
            break  # CUDA, too, ignores the list from its first invalid entry on
    return found


class Gpus:
    """The job's GPUs; `absent` names why there are none (NVML's error, or none visible)."""

    def __init__(self, visible: str | None) -> None:
        self.devices: list[Device] = []
        self.absent: str | None = None
        self.open = False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            self.absent = f"NVML init failed: {error}"
            return
        self.open = True
        try:
            for label, handle in _handles(visible):
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                self.devices.append(
                    Device(
                        label=label,
                        handle=handle,
                        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                        name=_text(pynvml.nvmlDeviceGetName(handle)),
                        memory_total_mb=memory.total / MB,
                        energy_start_mj=_read(
                            None, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, handle
                        ),
                    )
                )
        except pynvml.NVMLError as error:
            self.devices = []
            self.absent = f"NVML could not open CUDA_VISIBLE_DEVICES={visible!r}: {error}"
        if not self.devices and self.absent is None:
            self.absent = f"no GPU visible (CUDA_VISIBLE_DEVICES={visible!r})"

    def sample(self, interval_s: float) -> None:
        for device in self.devices:
            device.sample(interval_s)

    def summary(self, wall_s: float, nodes: int) -> dict[str, Any]:
        """Per device mean/peak, and GPU-hours (devices x nodes x wall), mean SM util, energy."""
        if self.absent is not None:
            return {"absent": self.absent, "count": 0, "gpu_hours": 0.0}
        devices = [device.summary() for device in self.devices]
        utils = [d["sm_util_mean"] for d in devices if d["sm_util_mean"] is not None]
        energies = [d["energy_j"] for d in devices if d["energy_j"] is not None]
        return {
            "count": len(devices),
            "nodes": nodes,
            "gpu_hours": len(devices) * nodes * wall_s / 3600,
            "sm_util_mean": sum(utils) / len(utils) if utils else None,
            "memory_used_peak_mb": max(
                (d["memory_used_peak_mb"] or 0.0 for d in devices), default=None
            ),
            "energy_j": sum(energies) if energies else None,
            "devices": devices,
        }

    def close(self) -> None:
        if self.open:
            _read(None, "shutdown", pynvml.nvmlShutdown)
            self.open = False
