"""Formats found in later hunts for real lines (tests/data/log_lines.jsonl holds the lines
themselves): each new rule, its fields, and the look-alikes it must leave alone."""

from __future__ import annotations

import pytest

from processors.core.log_classifier import classify


@pytest.mark.parametrize("line, want", [
    # mlx5 health (drivers/net/ethernet/mellanox/mlx5/core/health.c formats): the HCA died
    ("[  204.791017] mlx5_core 0000:41:00.0: poll_health:478:(pid 0): Fatal error 1 detected",
     ("nic_or_link", "fatal", "nic_fw_fatal")),
    ("[  131.207065] mlx5_core 0000:41:00.0: print_health_info:421:(pid 0): synd 0x10: High temperature",
     ("nic_or_link", "fatal", "nic_fw_fatal")),
    ("[  204.791067] mlx5_core 0000:41:00.0: mlx5_enter_error_state:214:(pid 920): start",
     ("nic_or_link", "fatal", "nic_fw_fatal")),
    ("[   51.227747] mlx5_core 0000:41:00.1: temp_warn:170:(pid 0): High temperature on sensors "
     "with bit set 0 1", ("nic_or_link", "degraded", "nic_high_temperature")),
    # the health dump's other registers, and a call trace through the function, are not the event
    ("[  204.791050] mlx5_core 0000:41:00.0: print_health_info:424:(pid 0): ext_synd 0x8f4f",
     ("other", "info", "unmatched")),
    ("[  204.791101]  mlx5_enter_error_state+0x3c/0x90 [mlx5_core]", ("other", "info", "unmatched")),
    # creating a verbs object failed: the host's RDMA setup, not a failed completion
    ("[1577793869.853864] [thunder6:167167:0]        ib_mlx5.c:73   UCX  ERROR "
     "mlx5dv_create_cq(cqe=256) failed: Invalid argument", ("config", "fatal", "nccl_ib_qp_setup")),
    ("Failed to modify QP to RTS", ("config", "fatal", "nccl_ib_qp_setup")),
    # perftest's failed completions: 12 = IBV_WC_RETRY_EXC_ERR
    (" Completion with error at client Failed status 12: wr_id 0 syndrom 0x81 scnt=128, ccnt=0",
     ("distributed_symptom", "fatal", "ib_retry_exceeded")),
    ("  Failed status 4: wr_id 0 syndrom 0x51", ("distributed_symptom", "fatal", "ib_completion_error")),
    # the GPU stack's daemons: systemctl's and systemd's wording of a failed unit
    ("Job for nvidia-fabricmanager.service failed because the control process exited with error "
     "code.", ("config", "degraded", "gpu_daemon_failed")),
    ("systemd[1]: Failed to start nvidia-persistenced.service - NVIDIA Persistence Daemon.",
     ("config", "degraded", "gpu_daemon_failed")),
    ("systemd[1]: Started nvidia-persistenced.service - NVIDIA Persistence Daemon.",
     ("other", "info", "unmatched")),
    ("Failed to initialize NVML: Unknown Error", ("critical_gpu", "degraded", "gpu_handle_unavailable")),
    ("RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
     ("config", "fatal", "cuda_driver_insufficient")),
    # frameworks' own wording of faults the classifier knew under other names
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
     "allocate 7406166528 bytes.", ("cuda_app_error", "fatal", "cuda_oom")),
    ("jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: "
     "PjRT_Client_Connect.", ("distributed_symptom", "fatal", "dist_timeout")),
    ("RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
     "CollectiveFingerPrint(OpType=ALLREDUCE)", ("config", "fatal", "nccl_collective_mismatch")),
    ("RuntimeError: Rank 2 successfully reached monitoredBarrier, but received errors while waiting "
     "for send/recv from rank 0.", ("distributed_symptom", "fatal", "dist_monitored_barrier_failed")),
])
def test_hunted_formats(line: str, want: tuple) -> None:
    e = classify(line)
    assert (e.category, e.severity, e.rule) == want, e


def test_an_xid_with_its_bus_id_edited_out_keeps_its_number() -> None:
    e = classify("kernel: NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)")
    assert (e.category, e.severity, e.xid, e.pci_bus_id) == ("nvlink", "degraded", 145, None)


@pytest.mark.parametrize("line, waited", [
    ("[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to connect "
     "to (192.0.0.1, 1234).", 60.0),
    ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 "
     "clients joined.", 901.0),
])
def test_waited_s_reads_a_timeout_given_in_seconds(line: str, waited: float) -> None:
    assert classify(line).waited_s == waited


@pytest.mark.parametrize("line, want", [
    ("host:22337:22400 [6] proxy.cc:862 NCCL WARN Proxy Call to rank 14 failed (Connect)",
     ("nccl_proxy_failed", "fatal", None, 14, None)),
    ("RuntimeError: [2] is setting up NCCL communicator and retreiving ncclUniqueId from [0] via c10d "
     "key-value store by key '0', but store->get('0') got error: Socket Timeout",
     ("nccl_timeout", "fatal", 2, None, None)),
    ("[rank1]: torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving "
     "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: wait "
     "timeout after 600000ms, keys: /default_pg/0//cuda//0", ("nccl_timeout", "fatal", 1, None, 600.0)),
    ("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10",
     ("nccl_invalid_usage", "fatal", None, None, None)),
    ("RuntimeError: Socket Timeout", ("dist_timeout", "fatal", None, None, None)),
])
def test_fifth_hunt_fields(line: str, want: tuple) -> None:
    e = classify(line)
    assert (e.rule, e.severity, e.rank, e.peer_rank, e.waited_s) == want, e


@pytest.mark.parametrize("line, want", [
    # DPC: status bits 2:1 are the trigger; 0x0005 = ERR_FATAL, 0x1f01 = an unmasked error
    ("pcieport 0000:30:03.0: DPC: containment event, status:0x0005 source:0x3400",
     ("pcie", "fatal", "pcie_dpc_containment")),
    ("pcieport 0000:00:1b.0: DPC: containment event, status:0x1f01 source:0x0000",
     ("pcie", "degraded", "pcie_dpc_containment")),
    ("pcieport 0000:00:1c.0: DPC: enabled", ("other", "info", "unmatched")),  # not an event
    # MCi_STATUS: found by polling (at boot) an uncorrected error is degraded, not fatal
    ("mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 4: a600000000020408",
     ("host_hw", "degraded", "host_mce")),
    ("mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 9: 0000000000000000",
     ("host_hw", "info", "host_mce_corrected")),
    ("STATUS ae2000000003110a MCGSTATUS 0", ("host_hw", "fatal", "host_mce")),  # mcelog: UC+PCC
    # a BMC's threshold events: the assertion, not its deassertion
    ("   3 | 10/04/2018 | 07:28:04 | Temperature #0x03 | Upper Critical going high | Asserted",
     ("host_hw", "degraded", "host_bmc_sensor")),
    ("   4 | 10/04/2018 | 07:29:04 | Temperature #0x03 | Upper Critical going high | Deasserted",
     ("other", "info", "unmatched")),
    ("thermal thermal_zone3: critical temperature reached (80 C), shutting down",
     ("host_hw", "fatal", "host_thermal_shutdown")),
    ("Memory failure: 0x40272d: unhandlable page.", ("host_hw", "fatal", "host_memory_uncorrectable")),
    ("Internal error: synchronous external abort: 0000000096000410 [#1] SMP",
     ("host_hw", "fatal", "host_mce_fatal")),
    ("systemd[1]: user-1021.slice: A process of this unit has been killed by the OOM killer.",
     ("cuda_app_error", "fatal", "host_oom_kill")),
    ("iommu ivhd0: AMD-Vi: Event logged [IOTLB_INV_TIMEOUT device=0000:0b:00.0 address=0x1002147e0]",
     ("pcie", "degraded", "iommu_timeout")),
    ("nvme2n1: detected capacity change from 800166076416 to 0", ("host_hw", "degraded", "host_storage_error")),
    ("nvme0n1: detected capacity change from 0 to 800166076416", ("other", "info", "unmatched")),
])
def test_host_hunt_formats(line: str, want: tuple) -> None:
    e = classify(line)
    assert (e.category, e.severity, e.rule) == want, e


@pytest.mark.parametrize("line, want", [
    ('"message": "xid 119 detected by dmesg (47 minutes ago)",', ("critical_gpu", "fatal", "xid_119")),
    ("slurmstepd: error: Step 1141810.0 exceeded memory limit (52917772 > 20971520), being killed",
     ("cuda_app_error", "fatal", "host_oom_kill")),
    ("slurmstepd: error: Exceeded job memory limit at some point.", ("other", "info", "unmatched")),
    ("nvidia-container-cli: initialization error: nvml error: driver not loaded",
     ("config", "fatal", "nvidia_driver_unavailable")),
    ('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].',
     ("config", "fatal", "gpu_runtime_missing")),
    ("Failed to initialize NVML: ERROR_UNKNOWN", ("critical_gpu", "degraded", "gpu_handle_unavailable")),
])
def test_scheduler_and_container_formats(line: str, want: tuple) -> None:
    e = classify(line)
    assert (e.category, e.severity, e.rule) == want, e
