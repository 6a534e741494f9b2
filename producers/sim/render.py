"""Tick arrays → wire bytes, exactly what ``schemas.codec.encode`` produces for the same record.

The fixed-layout hosts go through :class:`~producers.sim.packing.RowPacker` (numpy, one pass
per tick); a host whose CCL record differs this tick (pending peers, a crashed rank) is
built as a plain wire dict and packed with msgpack.
"""

from __future__ import annotations

import numpy as np

from producers.sim import packing as pk
from producers.sim.state import GPU_METRICS, HOST_METRICS, NIC_METRICS, TickArrays
from producers.sim.topology import GPUS_PER_HOST, Topology
from producers.sim.workload import K
from schemas import topics
from schemas.records import SCHEMA_VERSION

Encoded = tuple[str, str, float, bytes]
TELEMETRY, CCL, LOGS = topics.TELEMETRY.name, topics.CCL.name, topics.LOGS.name


def _telemetry_segments(topo: Topology) -> list[pk.Seg]:
    hosts = topo.hosts
    segs = [pk.const(pk.map_header(5) + pk.pack("v") + pk.pack(SCHEMA_VERSION) + pk.pack("host")),
            pk.rows([pk.pack(h.name) for h in hosts]),
            pk.const(pk.pack("job")),
            pk.rows([pk.pack(j.name if j else None) for j in map(topo.job_of, range(len(hosts)))]),
            pk.const(pk.pack("ts")), pk.FLOAT,
            pk.const(pk.pack("devices") + pk.map_header(3))]
    groups = (("gpu", [str(i) for i in range(GPUS_PER_HOST)], GPU_METRICS),
              ("nic", [f"mlx5_{i}" for i in range(GPUS_PER_HOST)], NIC_METRICS),
              ("host", ["host"], HOST_METRICS))
    for kind, ids, metrics in groups:
        segs.append(pk.const(pk.pack(kind) + pk.map_header(2) + pk.pack("ids") + pk.pack(ids)
                             + pk.pack("values") + pk.map_header(len(metrics))))
        for m in metrics:
            segs.append(pk.const(pk.pack(m) + pk.array_header(len(ids))))
            segs.extend([pk.FLOAT] * len(ids))
    return segs


def _ccl_segments(topo: Topology, hosts: list[int], n_entries: int) -> list[pk.Seg]:
    def job_of(h: int) -> str | None:
        j = topo.job_of(h)
        return j.name if j else None

    segs = [pk.const(pk.map_header(5) + pk.pack("v") + pk.pack(SCHEMA_VERSION) + pk.pack("host")),
            pk.rows([pk.pack(topo.hosts[h].name) for h in hosts]),
            pk.const(pk.pack("job")), pk.rows([pk.pack(job_of(h)) for h in hosts]),
            pk.const(pk.pack("ts")), pk.FLOAT,
            pk.const(pk.pack("ranks") + pk.array_header(n_entries))]
    for e in range(n_entries):
        head, ops = [], []
        for h in hosts:
            ent = topo.host_entries[h][e]
            c = topo.comms[ent.comm]
            head.append(pk.pack(c.id) + pk.pack("size") + pk.pack(c.size) + pk.pack("rank")
                        + pk.pack(ent.rank) + pk.pack("gpu") + pk.pack(ent.gpu) + pk.pack("ops")
                        + pk.array_header(K))
            ops.append(c.ops)
        segs += [pk.const(pk.map_header(7) + pk.pack("comm")), pk.rows(head)]
        for k in range(K):
            segs.append(pk.rows([pk.array_header(7) + pk.pack(o[k]) for o in ops]))
            segs += [pk.INT] * 4 + [pk.FLOAT] * 2
        segs += [pk.const(pk.pack("pending") + pk.array_header(0) + pk.pack("last")), pk.FLOAT]
    return segs


class Renderer:
    """Encodes each tick's telemetry and CCL records for every host."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        H = len(topo.hosts)
        self.keys = [(topo.job_of(h).name if topo.job_of(h) else topo.hosts[h].name)  # type: ignore[union-attr]
                     for h in range(H)]
        self.telemetry = pk.RowPacker(_telemetry_segments(topo), H)
        by_len: dict[int, list[int]] = {}
        for h, ents in enumerate(topo.host_entries):
            if ents:
                by_len.setdefault(len(ents), []).append(h)
        # One packer per entry count; rows in host order. host -> (packer index, row)
        self.ccl: list[tuple[pk.RowPacker, np.ndarray]] = []
        for n, hosts in sorted(by_len.items()):
            self.ccl.append((pk.RowPacker(_ccl_segments(topo, hosts, n), len(hosts)),
                             np.array(hosts, dtype=np.int64)))

    def render(self, a: TickArrays) -> list[Encoded]:
        """This tick's telemetry records (host order), then its CCL records (host order)."""
        t = a.t
        H = len(self.topo.hosts)
        floats = np.concatenate([np.full((H, 1), t),
                                 a.gpu.transpose(0, 2, 1).reshape(H, -1),
                                 a.nic.transpose(0, 2, 1).reshape(H, -1), a.host], axis=1)
        keys = self.keys
        dark = a.dark
        out = [(TELEMETRY, keys[h], t, b) for h, b in enumerate(self.telemetry.pack(floats))
               if h not in dark]
        out.extend(self._render_ccl(a))
        return out

    def _render_ccl(self, a: TickArrays) -> list[Encoded]:
        irregular = a.irregular()
        out: dict[int, bytes] = {}
        for packer, hosts in self.ccl:
            emit = a.ccl_hosts[hosts]
            regular = emit & ~np.isin(hosts, list(irregular)) if irregular else emit
            sel = np.flatnonzero(regular)
            if len(sel):
                rows = hosts[sel]
                n_e = len(self.topo.host_entries[int(rows[0])])
                fl = np.empty((len(rows), 1 + n_e * (2 * K + 1)))
                fl[:, 0] = a.t
                per = fl[:, 1:].reshape(len(rows), n_e, 2 * K + 1)
                per[..., :2 * K] = np.stack([a.td[rows, :n_e], a.n[rows, :n_e]], axis=-1
                                            ).reshape(len(rows), n_e, 2 * K)
                per[..., 2 * K] = a.last[rows, :n_e]
                ints = np.stack([a.cl[rows, :n_e], a.wr[rows, :n_e], a.wc[rows, :n_e],
                                 a.seq[rows, :n_e]], axis=-1).reshape(len(rows), -1)
                for h, b in zip(rows.tolist(), packer.pack(fl, ints, select=sel), strict=True):
                    out[h] = b
        for h in sorted(irregular):
            if a.ccl_hosts[h]:
                out[h] = pk.pack(self.ccl_wire(a, h))
        return [(CCL, self.keys[h], a.t, out[h]) for h in sorted(out)]

    def ccl_wire(self, a: TickArrays, h: int) -> dict:
        """The CCLRecord wire dict of host ``h`` (the general, slow path)."""
        topo = self.topo
        job = topo.job_of(h)
        dropped = a.dropped.get(h, set())
        ranks = []
        for e, ent in enumerate(topo.host_entries[h]):
            if e in dropped:
                continue
            c = topo.comms[ent.comm]
            ops = [[c.ops[k], int(a.cl[h, e, k]), int(a.wr[h, e, k]), int(a.wc[h, e, k]),
                    int(a.seq[h, e, k]), float(a.td[h, e, k]), float(a.n[h, e, k])]
                   for k in range(K)]
            ranks.append({"comm": c.id, "size": c.size, "rank": ent.rank, "gpu": ent.gpu,
                          "ops": ops, "pending": list(a.pending.get((h, e), ())),
                          "last": float(a.last[h, e])})
        return {"v": SCHEMA_VERSION, "host": topo.hosts[h].name,
                "job": job.name if job else None, "ts": float(a.t), "ranks": ranks}
