"""The on-host fact collector: ``python -m producers.cbd.facts`` prints one JSON object.

Aegis §6 (CBD) configuration stage, "< 1 min: host, GPU, NIC". It runs ON the host (inside
the namespace for ``netns:`` targets, where /sys/class/net and /proc/net are that
namespace's) and only reads:

- ``/sys/class/net/*``: operstate, carrier, speed, MTU, PCI device of every interface;
- ``/sys/class/infiniband/*/ports/*``: state, phys_state, rate, link_layer, netdev;
- ``/sys/bus/pci/devices/*``: NVIDIA GPUs and NICs, current/max link width and speed;
- routes and IPv4 addresses (``ip -j``, else /proc/net/route);
- NCCL/UCX/MLX5 environment variables and /etc/nccl.conf; NCCL version (``NCCL_VERSION``
  or a ``libnccl.so.X.Y.Z`` file name); tools on PATH (all_reduce_perf, mpirun, nvidia-smi);
- NVML through pynvml when it loads: driver/CUDA version, GPU count, persistence and ECC
  modes, clocks, throttle reasons, remapped rows, retired pages, uncorrectable ECC, PCIe;
- the kernel log (/dev/kmsg) for ``NVRM: Xid`` lines, with their age.

Every reader tolerates absence: missing hardware gives empty lists, never invented values.
The NVML part lives in :mod:`producers.cbd.nvml_facts`.
"""

from __future__ import annotations

import argparse
import errno
import glob
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from producers.cbd.nvml_facts import read_nvml

NVIDIA_VENDOR = "0x10de"
NIC_CLASSES = ("0x0200", "0x0207")  # Ethernet, InfiniBand
GPU_CLASSES = ("0x0300", "0x0302")  # VGA, 3D controller
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
            "/usr/local/lib", "/usr/local/nccl/lib", "/opt/nccl/lib")
_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
_NCCL_LIB_RE = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)$")


def _read(path: Path | str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _pci_of(dev_dir: Path) -> str | None:
    """PCI bus id of a sysfs device link (``.../0000:3b:00.0``), None for virtual ones."""
    try:
        real = os.path.realpath(dev_dir / "device")
    except OSError:
        return None
    m = re.search(r"([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$", real)
    return m.group(1) if m and os.path.exists(dev_dir / "device") else None


def read_net(sysfs: str = "/sys") -> list[dict[str, Any]]:
    out = []
    for d in sorted(Path(sysfs, "class/net").glob("*")):
        speed = _int(_read(d / "speed"))
        out.append({
            "name": d.name, "operstate": _read(d / "operstate"),
            "carrier": _int(_read(d / "carrier")), "mtu": _int(_read(d / "mtu")),
            "speed_mbps": speed if speed is not None and speed > 0 else None,
            "virtual": not (d / "device").exists(), "pci": _pci_of(d)})
    return out


def parse_rate_gbps(text: str | None) -> float | None:
    """``400 Gb/sec (4X NDR)`` -> 400.0."""
    m = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    return float(m.group(1)) if m else None


def read_ib(sysfs: str = "/sys") -> list[dict[str, Any]]:
    out = []
    for port in sorted(Path(sysfs, "class/infiniband").glob("*/ports/*")):
        dev = port.parent.parent
        ndev = _read(port / "gid_attrs/ndevs/0")
        if not ndev:
            nets = sorted(p.name for p in (dev / "device/net").glob("*"))
            ndev = nets[0] if nets else None
        out.append({"dev": dev.name, "port": port.name, "state": _read(port / "state"),
                    "phys_state": _read(port / "phys_state"),
                    "rate_gbps": parse_rate_gbps(_read(port / "rate")),
                    "link_layer": _read(port / "link_layer"), "netdev": ndev,
                    "pci": _pci_of(dev)})
    return out


def parse_link_speed(text: str | None) -> float | None:
    """``16.0 GT/s PCIe`` -> 16.0; ``Unknown``/missing -> None."""
    m = re.match(r"\s*([\d.]+)\s*GT/s", text or "")
    return float(m.group(1)) if m else None


def read_pci(sysfs: str = "/sys") -> list[dict[str, Any]]:
    """NVIDIA GPUs and NICs with their PCIe link (current vs max width and speed)."""
    out = []
    for d in sorted(Path(sysfs, "bus/pci/devices").glob("*")):
        cls, vendor = _read(d / "class") or "", _read(d / "vendor") or ""
        if vendor == NVIDIA_VENDOR and cls[:6] in GPU_CLASSES:
            kind = "gpu"
        elif cls[:6] in NIC_CLASSES:
            kind = "nic"
        else:
            continue
        out.append({
            "bus": d.name, "kind": kind, "vendor": vendor, "class": cls,
            "cur_width": _int(_read(d / "current_link_width")),
            "max_width": _int(_read(d / "max_link_width")),
            "cur_speed": parse_link_speed(_read(d / "current_link_speed")),
            "max_speed": parse_link_speed(_read(d / "max_link_speed")),
            "netdevs": sorted(p.name for p in (d / "net").glob("*")),
            "ibdevs": sorted(p.name for p in (d / "infiniband").glob("*"))})
    return out


def _ip_json(args: list[str]) -> list[dict[str, Any]] | None:
    try:
        p = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=5)
        doc = json.loads(p.stdout) if p.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return doc if isinstance(doc, list) else None


def parse_proc_route(text: str) -> list[dict[str, Any]]:
    """/proc/net/route (little-endian hex) -> [{"dst": "10.0.0.0/24"|"default", dev, gw}]."""
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        dst, gw, mask = (socket.inet_ntoa(int(x, 16).to_bytes(4, "little")) for x in
                         (f[1], f[2], f[7]))
        plen = bin(int(f[7], 16)).count("1")
        out.append({"dst": "default" if plen == 0 else f"{dst}/{plen}", "dev": f[0],
                    "gw": None if gw == "0.0.0.0" else gw})
    return out


def read_routes(procroot: str = "/proc") -> list[dict[str, Any]]:
    doc = _ip_json(["-4", "route", "show", "table", "main"]) if procroot == "/proc" else None
    if doc is not None:
        return [{"dst": r.get("dst"), "dev": r.get("dev"), "gw": r.get("gateway")} for r in doc]
    return parse_proc_route(_read(Path(procroot, "net/route")) or "")


def read_addrs() -> dict[str, list[str]]:
    doc = _ip_json(["-4", "addr", "show"]) or []
    return {str(i.get("ifname")): [f"{a['local']}/{a.get('prefixlen', 32)}"
                                   for a in i.get("addr_info", []) if a.get("local")]
            for i in doc}


def read_env(environ: Mapping[str, str], prefixes: Iterable[str],
             conf_paths: Iterable[str] = ("/etc/nccl.conf",)) -> dict[str, str]:
    """Prefixed variables; /etc/nccl.conf ``KEY=VALUE`` lines fill what the env leaves unset
    (NCCL reads that file and lets the environment override it)."""
    pre = tuple(prefixes)
    out: dict[str, str] = {}
    for path in conf_paths:
        for line in (_read(path) or "").splitlines():
            k, sep, v = line.split("#", 1)[0].strip().partition("=")
            if sep and k.strip().startswith(pre):
                out[k.strip()] = v.strip()
    out.update({k: v for k, v in environ.items() if k.startswith(pre)})
    return dict(sorted(out.items()))


def nccl_version(environ: Mapping[str, str], lib_dirs: Iterable[str] = LIB_DIRS
                 ) -> dict[str, str] | None:
    if environ.get("NCCL_VERSION"):
        return {"version": environ["NCCL_VERSION"], "source": "env NCCL_VERSION"}
    dirs = [*environ.get("LD_LIBRARY_PATH", "").split(os.pathsep), *lib_dirs]
    for d in dirs:
        for p in sorted(glob.glob(os.path.join(d, "libnccl.so.*"))) if d else ():
            m = _NCCL_LIB_RE.search(p)
            if m:
                return {"version": m.group(1), "source": p}
    return None


def parse_kmsg_record(rec: str) -> tuple[float, str] | None:
    """``pri,seq,usec,flags;message`` -> (seconds since boot, message)."""
    head, sep, msg = rec.partition(";")
    parts = head.split(",")
    if not sep or len(parts) < 3:
        return None
    try:
        return int(parts[2]) / 1e6, msg.split("\n", 1)[0]
    except ValueError:
        return None


def xids_from_kmsg(records: Iterable[str], uptime_s: float) -> list[dict[str, Any]]:
    out = []
    for rec in records:
        parsed = parse_kmsg_record(rec)
        if not parsed:
            continue
        m = _XID_RE.search(parsed[1])
        if m:
            out.append({"bus": m.group(1).lower(), "xid": int(m.group(2)),
                        "age_s": round(max(0.0, uptime_s - parsed[0]), 1),
                        "line": parsed[1][:300]})
    return out


def read_kmsg(limit: int = 200_000) -> tuple[list[str] | None, str]:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return None, f"/dev/kmsg not readable: {e.strerror}"
    records: list[str] = []
    try:
        while len(records) < limit:
            try:
                records.append(os.read(fd, 8192).decode(errors="replace"))
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while reading: skip ahead
                    continue
                break
    finally:
        os.close(fd)
    return records, ""


def collect(sysfs: str = "/sys", env_prefixes: Iterable[str] = ("NCCL_", "UCX_", "MLX5_"),
            tools: Iterable[str] = ("all_reduce_perf", "mpirun", "nvidia-smi"),
            nvml: bool = True, kmsg: bool = True) -> dict[str, Any]:
    t0 = time.monotonic()
    uptime = float((_read("/proc/uptime") or "0").split()[0])
    records, kmsg_reason = read_kmsg() if kmsg else (None, "not read")
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(), "kernel": os.uname().release, "uptime_s": uptime,
        "net": read_net(sysfs), "ib": read_ib(sysfs), "pci": read_pci(sysfs),
        "routes": read_routes(), "addrs": read_addrs(),
        "env": read_env(os.environ, env_prefixes), "nccl": nccl_version(os.environ),
        "tools": {t: shutil.which(t) for t in tools},
        "torch": importlib.util.find_spec("torch") is not None,
        "nvml": read_nvml() if nvml else {"available": False, "reason": "not read"},
        "xids": xids_from_kmsg(records, uptime) if records is not None else None,
        "xids_reason": kmsg_reason,
    }
    facts["collect_s"] = round(time.monotonic() - t0, 3)
    return facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m producers.cbd.facts")
    p.add_argument("--sysfs-root", default="/sys")
    p.add_argument("--env-prefix", action="append", default=None)
    p.add_argument("--tool", action="append", default=None)
    p.add_argument("--no-nvml", action="store_true")
    a = p.parse_args(argv)
    facts = collect(a.sysfs_root, a.env_prefix or ("NCCL_", "UCX_", "MLX5_"),
                    a.tool or ("all_reduce_perf", "mpirun", "nvidia-smi"), nvml=not a.no_nvml)
    json.dump(facts, sys.stdout, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
