"""``aegis classify-log [FILES...]``: classify log lines, one JSON object per input line.

Reads the files in order (stdin when none or ``-``), decodes bytes as UTF-8 with replacement,
and writes for every line, in order, the :class:`~processors.core.log_classifier.LogEvent`
fields (category, severity, xid, pci_bus_id, gpu, peer, peer_rank, rank, device, action,
rule). Exit 0 on success, 1 when a file could not be read (the others are still classified),
2 on usage errors or a bad ``--inventory`` / ``--policy`` file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import BinaryIO

import orjson

from processors.core.log_classifier import classify
from processors.core.xid_policy import XidPolicy
from schemas.errors import AegisError
from schemas.inventory import HostInventory, Inventory
from schemas.records import LOG_SOURCES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="aegis classify-log",
        description="Classify log lines (NVRM Xid and SXid, NCCL, PyTorch watchdog, Gloo and "
                    "c10d, mlx5 and NIC links, PCIe AER, DCGM, CUDA errors, host CPU/memory/"
                    "storage, the OOM killer) and write one JSON object per line "
                    "(categories: docs/phase1.md).")
    p.add_argument("files", nargs="*", metavar="FILE", help="log files; none or '-' reads stdin")
    p.add_argument("--inventory", metavar="FILE",
                   help="inventory JSON: maps PCI bus ids to GPU indexes")
    p.add_argument("--host", help="the inventory host the lines come from (default: the only one)")
    p.add_argument("--policy", metavar="FILE", help="XID policy override (TOML), merged over the default")
    p.add_argument("--source", choices=LOG_SOURCES, help="where the lines come from (a hint)")
    p.add_argument("--with-line", action="store_true", help="include the line itself in the output")
    return p


def _lines(fh: BinaryIO) -> Iterator[str]:
    for raw in fh:
        yield raw.rstrip(b"\r\n").decode("utf-8", "replace")


def _host_inventory(path: str | None, host: str | None) -> HostInventory | None:
    if not path:
        return None
    try:
        inv = Inventory.load(path)
    except (OSError, ValueError, AegisError) as e:  # orjson.JSONDecodeError is a ValueError
        raise AegisError(f"inventory {path}: {e}") from e
    if host is not None:
        if host not in inv.hosts:
            raise AegisError(f"inventory {path}: no host {host!r} (has {sorted(inv.hosts)[:10]})")
        return inv.hosts[host]
    if len(inv.hosts) == 1:
        return next(iter(inv.hosts.values()))
    raise AegisError(f"inventory {path}: {len(inv.hosts)} hosts; say which with --host")


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): return, don't exit
        return e.code if isinstance(e.code, int) else 2
    try:
        policy = XidPolicy.load(args.policy)
        hinv = _host_inventory(args.inventory, args.host)
    except AegisError as e:
        print(f"aegis classify-log: {e}", file=sys.stderr)
        return 2
    out = sys.stdout.buffer
    status = 0
    try:
        for name in args.files or ["-"]:
            if name == "-":
                fh: BinaryIO = sys.stdin.buffer
            else:
                try:
                    fh = open(name, "rb")  # noqa: SIM115 - closed below
                except OSError as e:
                    print(f"aegis classify-log: cannot read {name}: {e.strerror or e}", file=sys.stderr)
                    status = 1
                    continue
            try:
                for line in _lines(fh):
                    d = classify(line, args.source, hinv, policy).to_dict()
                    if args.with_line:
                        d["line"] = line
                    out.write(orjson.dumps(d) + b"\n")
            except BrokenPipeError:
                raise
            except OSError as e:
                print(f"aegis classify-log: error reading {name}: {e.strerror or e}", file=sys.stderr)
                status = 1
            finally:
                if fh is not sys.stdin.buffer:
                    fh.close()
        out.flush()
    except BrokenPipeError:  # `aegis classify-log big.log | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status


if __name__ == "__main__":
    sys.exit(main())
