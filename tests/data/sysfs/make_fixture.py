"""Regenerate the fixture tree: 8 mlx5 RoCE ports as the kernel lays them out in sysfs.

    python tests/data/sysfs/make_fixture.py   # rewrites tests/data/sysfs/class/infiniband

File names and formats follow the sources listed in README.md; values are invented but
plausible (a ConnectX-7 400G RoCE port some hours into a job). Deterministic.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
IB = HERE / "class" / "infiniband"

# ib_core port counters (Documentation/infiniband/sysfs.txt; ib_core sysfs.c adds the
# extended unicast/multicast and port_xmit_wait ones)
PMA_COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
    "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards", "port_xmit_packets",
    "port_xmit_wait", "symbol_error", "unicast_rcv_packets", "unicast_xmit_packets",
)
# mlx5 hw_counters on a RoCE port (drivers/infiniband/hw/mlx5/counters.c: basic, out of
# sequence, retransmission, extended error, RoCE acceleration, congestion, ext PPCNT)
HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "local_ack_timeout_err", "np_cnp_sent",
    "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence", "packet_seq_err",
    "req_cqe_error", "req_cqe_flush_error", "req_remote_access_errors",
    "req_remote_invalid_request", "req_rnr_retries_exceeded", "req_transport_retries_exceeded",
    "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
    "resp_remote_access_errors", "rnr_nak_retry_err", "roce_adp_retrans", "roce_adp_retrans_to",
    "roce_slow_restart", "roce_slow_restart_cnps", "roce_slow_restart_trans", "rp_cnp_handled",
    "rp_cnp_ignored", "rx_atomic_requests", "rx_dct_connect", "rx_icrc_encapsulated",
    "rx_read_requests", "rx_write_requests",
)
BIG = {"port_rcv_data": 9_117_453_002_311, "port_xmit_data": 9_204_118_650_977,
       "port_rcv_packets": 2_305_811_004, "port_xmit_packets": 2_311_907_215,
       "unicast_rcv_packets": 2_305_810_771, "unicast_xmit_packets": 2_311_906_990,
       "multicast_rcv_packets": 233, "multicast_xmit_packets": 225,
       "port_xmit_wait": 1_530_004, "rx_write_requests": 18_220_301,
       "rx_read_requests": 4_410, "np_ecn_marked_roce_packets": 1_204,
       "np_cnp_sent": 1_198, "rp_cnp_handled": 1_311, "roce_slow_restart_cnps": 40,
       "roce_adp_retrans": 12, "local_ack_timeout_err": 3, "out_of_sequence": 7,
       "packet_seq_err": 2}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def make_device(i: int) -> None:
    dev = IB / f"mlx5_{i}"
    guid = f"b83f:d203:00a1:{0x1c40 + i:04x}"
    for name, text in {"node_type": "1: CA", "node_guid": guid, "sys_image_guid": guid,
                       "fw_ver": "28.39.2048", "hca_type": "MT4129", "hw_rev": "0x0",
                       "board_id": "MT_0000000838", "node_desc": f"gpu-node mlx5_{i}",
                       "fw_pages": "312831", "reg_pages": "0"}.items():
        write(dev / name, text)
    port = dev / "ports" / "1"
    for name, text in {"state": "4: ACTIVE", "phys_state": "5: LinkUp",
                       "rate": "400 Gb/sec (4X NDR)", "link_layer": "Ethernet", "lid": "0x0",
                       "sm_lid": "0x0", "sm_sl": "0", "lid_mask_count": "0",
                       "cap_mask": "0x00010000"}.items():
        write(port / name, text)
    write(port / "gids" / "0", f"fe80:0000:0000:0000:ba3f:d2ff:fea1:{0x1c40 + i:04x}")
    write(port / "gids" / "1", "0000:0000:0000:0000:0000:ffff:0a00:" + f"{0x0101 + i:04x}")
    write(port / "gid_attrs" / "types" / "0", "IB/RoCE v1")
    write(port / "gid_attrs" / "types" / "1", "RoCE v2")
    write(port / "gid_attrs" / "ndevs" / "0", f"ens{10 + i}np0")
    write(port / "gid_attrs" / "ndevs" / "1", f"ens{10 + i}np0")
    write(port / "pkeys" / "0", "0xffff")
    for name in PMA_COUNTERS:
        write(port / "counters" / name, str(BIG.get(name, 0) + (i * 7919 if name in BIG else 0)))
    for name in HW_COUNTERS:
        write(port / "hw_counters" / name, str(BIG.get(name, 0) + (i * 13 if name in BIG else 0)))
    write(port / "hw_counters" / "lifespan", "10")


def main() -> None:
    if IB.exists():
        shutil.rmtree(IB)
    for i in range(8):
        make_device(i)
    print(f"wrote {IB}")


if __name__ == "__main__":
    main()
