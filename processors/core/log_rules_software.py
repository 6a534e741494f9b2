"""The software rules behind :func:`processors.core.log_classifier.classify`: PyTorch's
watchdog, NCCL (and the same failures from Gloo and the c10d store), the host's GPU stack not
being ready, and the application's CUDA errors. Conventions as in
:mod:`processors.core.log_rules`: plain substring tests first, then linear regexes.
"""

from __future__ import annotations

import re

from processors.core.log_rules import Hit, nic_device

# ---- the job stopped from outside ---------------------------------------------------------
_NODE_FAILURE = re.compile(r"(?:(?:srun|salloc|sbatch): error: Node|node-failure +node) failure on "
                           r"([A-Za-z0-9][\w.-]{0,62})")


def termination(line: str) -> Hit | None:
    """The scheduler or an operator stopped the job: Slurm's ``*** JOB … CANCELLED AT …``
    (time limit, preemption, scancel; not ``NODE FAILURE``), ``srun: Force Terminated``, and
    torchrun's agent receiving SIGHUP/SIGINT/SIGTERM (``Received 15 death signal, shutting
    down workers``; its ``Sending process … closing signal`` follows a worker's own failure
    too, so it does not count). The connection errors of the shutdown are not a fault. The
    scheduler losing a node of the job (srun's ``Node failure on X``, Flux's ``node failure
    on X``) is: a distributed symptom whose peer is that node (``slurm_node_failure``)."""
    if "death signal" in line:
        if "shutting down workers" in line:
            return Hit("other", "info", "job_terminated")
        return None
    if "ANCELLED AT" in line and "***" in line and "NODE FAIL" not in line:
        return Hit("other", "info", "job_terminated")
    if "Force Terminated" in line and "srun" in line:
        return Hit("other", "info", "job_terminated")
    if "ode failure on " in line:  # srun/salloc's "error: Node failure on X", Flux's
        m = _NODE_FAILURE.search(line, 0, 4096)  # "node failure on X (shell rank N)"
        if m:
            return Hit("distributed_symptom", "fatal", "slurm_node_failure", peer=m.group(1))
    return None


# ---- PyTorch ProcessGroupNCCL, NCCL, sockets -----------------------------------------------
def torch_watchdog(line: str) -> Hit | None:
    if "atchdog" not in line and "NCCL" not in line:
        return None
    if "watchdog got stuck" in line:  # the NCCL watchdog itself hung (driver or NCCL stuck)
        return Hit("distributed_symptom", "fatal", "torch_watchdog_stuck")
    if "Watchdog caught collective operation timeout" in line:
        return Hit("distributed_symptom", "fatal", "torch_watchdog_timeout")
    if "detected by watchdog" in line or "communicator was aborted" in line:
        return Hit("distributed_symptom", "fatal", "torch_watchdog_exception")
    if "operations have failed or timed out" in line:
        return Hit("distributed_symptom", "fatal", "torch_watchdog_exception")
    return None


# ---- other runtimes: UCX, libfabric (EFA), Ray, JAX/XLA, torchelastic's error file -----
_RAY_NODE_IP = re.compile(r"\b(?:ip|address)[:=] ?(\d{1,3}(?:\.\d{1,3}){3})\b")


def runtimes(line: str) -> Hit | None:
    """The failures between processes that other runtimes report in their own words: UCX's
    ``Endpoint timeout`` (UD's ``unhandled timeout error``) and failed ``ucp_ep_create``; EFA's
    completion errors and exhausted resources (libfabric); Ray's head marking a node dead
    (the peer is that node's ip); XLA's rendezvous that ``may be stuck`` (a warning while it
    waits); JAX's coordination service; torchelastic's ``RendezvousTimeoutError`` (also as a
    field of its error file). Worker exits (Ray's ``ActorDiedError``, a segfault) stay other:
    they follow the error that caused them."""
    if "imeout" in line:
        if "Endpoint timeout" in line and ("UCX" in line or ".c:" in line) \
                or "unhandled timeout error" in line and "UD endpoint" in line:
            return Hit("distributed_symptom", "fatal", "ucx_endpoint_timeout", device=nic_device(line))
        if "RendezvousTimeoutError" in line:  # the rendezvous store: see tree_events.via_store
            return Hit("distributed_symptom", "fatal", "dist_timeout")
        if "heartbeat timeout" in line and "coordination service" in line:  # JAX: a task died
            return Hit("distributed_symptom", "fatal", "jax_task_heartbeat_timeout")
    if "ucp_ep_create" in line and "failed" in line:
        return Hit("distributed_symptom", "fatal", "ucx_connect_failed")
    if "libfabric" in line and "efa" in line and "<warn>" in line:
        if "Cannot allocate memory" in line or "Unable to register MR" in line:
            return Hit("config", "degraded", "efa_out_of_resources")  # memlock, hugepages, CQ depth
        if "handle_error" in line and "err: " in line:  # a completion with an error status
            return Hit("distributed_symptom", "fatal", "efa_completion_error")
    if "marked dead" in line and "missed too many heartbeats" in line \
            or "Raylet is terminated" in line and "unexpected" in line:
        m = _RAY_NODE_IP.search(line, 0, 4096)
        return Hit("distributed_symptom", "fatal", "ray_node_dead", peer=m.group(1) if m else None)
    if "may be stuck" in line and "waiting for" in line and (
            "rendezvous" in line or "participants" in line):  # XLA warns at 10-20 s, then waits on
        return Hit("distributed_symptom", "degraded", "xla_rendezvous_stuck")
    if "oordination service" in line and ("agent in error status" in line
                                           or "cluster registration failed" in line):
        return Hit("distributed_symptom", "fatal", "jax_coordination_error")
    return None


_CONFIG_RULES: tuple[tuple[tuple[str, ...], str, str], ...] = (  # any of -> severity, rule
    (("invalid usage", "ncclInvalidUsage", "ncclInvalidArgument", "Duplicate GPU detected"), "fatal",
     "nccl_invalid_usage"),  # two ranks on one GPU: NCCL's "Last error" under ncclInvalidUsage
    (("Mismatched collective", "collective mismatch", "mismatch between collectives"), "fatal",
     "nccl_collective_mismatch"),  # PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL check
    (("version mismatch", "Mismatched NCCL version", "wrong type"), "fatal",
     "nccl_version_mismatch"),
    # ranks disagree on a message's size: mismatched calls or settings between ranks, which
    # NCCL reports as invalid usage since 2.12 (NVIDIA/nccl#605), not an update to roll back
    (("bytes instead of", "Message truncated", "message truncated"), "fatal",
     "nccl_message_truncated"),
    (("neither AF_INET", "no socket interface found", "No socket interface found"), "fatal",
     "nccl_socket_config"),
    # perftest, UCX and UCCL word a failed QP state change as "Failed to modify QP to RTR"
    (("ibv_modify_qp failed", "ibv_create_qp failed", "ibv_create_cq failed",
      "modify QP to RTR", "modify QP to RTS", "modify QP to INIT"), "fatal", "nccl_ib_qp_setup"),
    (("Unable to open device", "ibv_open_device failed", "could not open"), "degraded",
     "nccl_ib_device_unavailable"),
    (("No device found",), "info", "nccl_ib_no_device"),
    # no verbs library: NCCL falls back to sockets (NET/Socket), slow where IB was meant
    (("Failed to open libibverbs",), "degraded", "nccl_ibverbs_missing"),
    # NCCL <= 2.4's socket.h without the NCCL token: IPv6 refused, another family is tried
    (("Socket creation failed",), "degraded", "nccl_socket_family"),
    # the host's limits, not the network: /dev/shm full or too small, memlock too low
    (("shared memory segment", "failed to extend /dev/shm", "posix_fallocate"), "fatal",
     "nccl_shm_unavailable"),
    (("ibv_reg_mr", "Unable to register memory"), "fatal", "nccl_ib_memory_registration"),
    (("no algorithm/protocol available", "Unable to load NCCL library"), "fatal",
     "nccl_setup_failed"),
)
_NCCL_BENIGN = ("falling back to simple order",)  # topology search fallback: harmless
_IB_PORT = re.compile(r"\b([A-Za-z][\w-]{0,15}?\d)(?::\d+)? (?:Got async|async fatal)")  # mlx5_0:1
# IBV_WC_LOC_PROT_ERR: the local HCA refused the buffer, almost always ACS or the IOMMU breaking
# GPUDirect RDMA (NVIDIA/nccl#928): a failed connection whose cause is the reporter's own
# configuration (the tree's ConfigCheck, once RootDiag finds no root)
_IB_LOCAL_PROT = re.compile(r"with (?:error|status=?) ?4\b")
# NCCL >= 2.23 ends a failed completion with the local HCA: "... remoteGids::ffff:10.0.0.2 hca
# mlx5_3" (mlx5_bond_0, irdma0, bnxt_re1, rocep1s0f0): the reporter's NIC, not the peer's
_HCA = re.compile(r" hca ([A-Za-z][\w.-]{0,31})")
_IB_PORT_EVENTS = ("GID table change", "port active", "LID change", "SM change")  # reconfiguration
_DIST_RULES: tuple[tuple[tuple[str, ...], str, str, str], ...] = (  # any of -> cat, sev, rule
    (("unhandled cuda error", "ncclUnhandledCudaError", "Cuda failure"), "cuda_app_error", "fatal",
     "nccl_cuda_error"),
    (("Got completion", "completion error", "completed with error"), "distributed_symptom", "fatal",
     "nccl_ib_completion_error"),  # IB verbs, and aws-ofi-nccl (EFA) "NET/OFI Request …"
    (("Connection reset by peer",), "distributed_symptom", "fatal", "nccl_connection_reset"),
    (("closed by remote peer", "closed by peer"), "distributed_symptom", "fatal",
     "nccl_connection_closed"),
    (("remote process exited", "ncclRemoteError", "Horovod has been shut down"),
     "distributed_symptom", "fatal", "nccl_remote_error"),  # Horovod: a rank raised
    (("Broken pipe",), "distributed_symptom", "fatal", "nccl_broken_pipe"),
    (("unhandled system error", "ncclSystemError"), "distributed_symptom", "fatal",
     "nccl_system_error"),
    (("internal error", "ncclInternalError"), "distributed_symptom", "fatal", "nccl_internal_error"),
    (("socketStartConnect", "Connection refused", "connection refused", "Connect to ",
      "failed to connect", "connectFullMesh failed"),
     "distributed_symptom", "fatal", "nccl_connect_failed"),
    (("recv failed", "send failed", "Call to recv", "Call to send", "recvValue failed",
      "ailed to recv", "recvValueWithTimeout failed"), "distributed_symptom", "fatal",
     "nccl_socket_io_failed"),
    (("Failed to execute operation", "Proxy Call to rank"), "distributed_symptom", "fatal",
     "nccl_proxy_failed"),  # proxy.cc prints "Proxy Call to rank N failed" only on its error path
    (("timeout", "Timeout", "timed out", "Timed out"), "distributed_symptom", "fatal",
     "nccl_timeout"),
)
# PyTorch's other transports (Gloo) and its rendezvous store (c10d TCPStore) report the same
# failures between ranks; their rules are named dist_* instead of nccl_*
_TORCH_DIST = ("gloo", "c10d", "torch.distributed", "DistStoreError", "DistNetworkError",
               "DistBackendError", "client socket has timed out", "TCPStore", "SocketImpl",
               "store based barrier", "tensorpipe", "mismatch between collectives", "Socket Timeout",
               "monitoredBarrier", "Horovod has been shut down",
               # JAX's coordination service (jax.distributed): a task that never joined
               "DEADLINE_EXCEEDED: Barrier timed out", "XlaRuntimeError: DEADLINE_EXCEEDED")
_SETTING = re.compile(r"[Tt]imeout\w*['\"]?\s?[:=]\s?['\"]?\(?\d")  # a setting, not an event
_GLOG_WARNING = re.compile(r"(?:^|[\[:])W(?:\d{3,4})? ")  # [W0625 …], W0701 …, [W tensorpipe…
# a glog warning header behind a prefix (CRI, srun's "12: ", "[rank3]: ", syslog): W0701 13:41:43.4
_GLOG_WARNING_FRAMED = re.compile(r"[\s\]:]W\d{4} \d\d:\d\d:\d\d\.\d")
# C++ stack lines PyTorch prints under an error: they name checkTimeout, ProcessGroupNCCL, …
_STACK = re.compile(r"(?:^|[\s:])(?:frame #\d{1,4}: |Exception raised from \w+ at )")
_SOCKET_ONLY = frozenset(("nccl_connection_reset", "nccl_connection_closed", "nccl_socket_io_failed",
                          "nccl_broken_pipe"))


def nccl(line: str) -> Hit | None:
    """NCCL WARN lines, the NCCL errors PyTorch raises, NCCL's socket layer, and the same
    failures from Gloo and the c10d store."""
    is_nccl = ("NCCL" in line or "nccl" in line or "NET/IB" in line or "NET/OFI" in line
               or "Message truncated" in line or "uccl" in line or "UCCL" in line
               or "Duplicate GPU detected" in line)
    torch_dist = False
    if not is_nccl:
        if not ("ocket" in line or "tore" in line or "istributed" in line or "Dist" in line
                or "gloo" in line or "c10d" in line or "tensorpipe" in line
                or "ollectives" in line or "arrier" in line or "Horovod" in line
                or "DEADLINE_EXCEEDED" in line):
            return None
        torch_dist = any(k in line for k in _TORCH_DIST)
        if not torch_dist and "socket" not in line:
            return None
    if "NCCL INFO" in line:
        if "No device found" in line:
            return Hit("config", "info", "nccl_ib_no_device")
        return Hit("other", "info", "nccl_info")
    for keys, sev, rule in _CONFIG_RULES:
        for k in keys:
            if k in line:
                return Hit("config", sev, rule)
    if "NCCL_" in line and ("nvalid" in line or "nknown" in line) and "TORCH_NCCL" not in line:
        return Hit("config", "degraded", "nccl_env_invalid")
    if "async" in line and ("async event" in line or "async error event" in line
                            or "async fatal event" in line):  # IBV_EVENT_* from the HCA
        m = _IB_PORT.search(line)
        dev = m.group(1) if m else None
        if any(k in line for k in _IB_PORT_EVENTS):  # an address or subnet manager change
            return Hit("other", "info", "nccl_ib_port_event", device=dev)
        if "async fatal event on QP" in line:  # IBV_EVENT_QP_FATAL: that connection is dead
            return Hit("distributed_symptom", "fatal", "nccl_ib_qp_fatal", device=dev)
        if "catastrophic" in line or "device fatal" in line or "DEVICE_FATAL" in line:
            return Hit("nic_or_link", "fatal", "nccl_ib_device_fatal", device=dev)
        return Hit("distributed_symptom", "degraded", "nccl_ib_async_event", device=dev)
    if any(k in line for k in _NCCL_BENIGN):
        return Hit("other", "info", "nccl_benign_warn")
    if ("frame #" in line or "Exception raised from" in line) and _STACK.search(line, 0, 96):
        return None  # a stack line under the error, not the error (docs: stay other)
    hca = _HCA.search(line, 0, 4096) if " hca " in line else None
    dev = hca.group(1) if hca else None
    if "NET/IB" in line and "ompletion" in line and _IB_LOCAL_PROT.search(line):
        return Hit("distributed_symptom", "fatal", "nccl_ib_local_protection_error", device=dev)
    if "monitoredBarrier" in line and ("received errors" in line or "failed" in line):
        return Hit("distributed_symptom", "fatal", "dist_monitored_barrier_failed")
    for keys, cat, sev, rule in _DIST_RULES:
        for k in keys:
            if k in line:
                if not is_nccl and not torch_dist and rule not in _SOCKET_ONLY:
                    break  # a bare "socket ... timed out" is as likely an HTTP download
                if rule == "nccl_timeout" and "imed out" not in line and _SETTING.search(line):
                    break  # a config dump: timeout=1800, nccl_timeout: 600
                if (torch_dist or is_nccl) and (_GLOG_WARNING.search(line, 0, 64)
                                                or _GLOG_WARNING_FRAMED.search(line, 0, 200)):
                    sev = "degraded"  # PyTorch logs retries as warnings; the error comes later
                return Hit(cat, sev, rule if is_nccl else "dist_" + rule[5:], device=dev)
    if is_nccl and ("NCCL WARN" in line or "NCCL error" in line):
        return Hit("distributed_symptom", "degraded", "nccl_warn")
    return None


# ---- GPU software stack not ready on the host ---------------------------------------------
def _daemon_unit_failed(line: str) -> bool:
    """systemd or systemctl: the fabric manager's or the persistence daemon's unit failed."""
    if "fabricmanager.service" not in line and "persistenced.service" not in line:
        return False
    return ("process exited, code=exited, status=" in line and "status=0/" not in line
            or "Failed with result" in line or "Failed to start" in line
            or "failed because" in line)  # systemctl: 'Job for ….service failed because …'


def gpu_setup(line: str) -> Hit | None:
    """The host's GPU stack is not usable: the driver was updated under a loaded module
    (NVML version mismatch), is not loaded, or the fabric manager is not running (CUDA 802)."""
    if "Driver/library version mismatch" in line:
        return Hit("config", "fatal", "nvml_driver_mismatch")
    if "driver version is insufficient for CUDA runtime" in line \
            or "NVIDIA driver on your system is too old" in line:  # CUDA 35: the image needs a newer driver
        return Hit("config", "fatal", "cuda_driver_insufficient")
    if "couldn't communicate with the NVIDIA driver" in line or "nvml error: driver not loaded" in line:
        return Hit("config", "fatal", "nvidia_driver_unavailable")
    if ("abric" in line or "NVML" in line or "persistenced" in line) and (
            "nv-fabricmanager" in line and "failed! Exit" in line or "has an invalid value" in line
            or "could not load NVML" in line or "persistenced failed" in line
            or _daemon_unit_failed(line)):
        # the fabric manager, NVML or the persistence daemon did not start: no usable GPUs
        return Hit("config", "degraded", "gpu_daemon_failed")
    if "load library failed: libnvidia-ml" in line:  # nvidia-container-cli: no NVML on the host
        return Hit("config", "degraded", "gpu_daemon_failed")
    if ("could not select device driver" in line and "[[gpu]]" in line
            or 'no runtime for "nvidia" is configured' in line):  # Docker / containerd: no GPU runtime
        return Hit("config", "fatal", "gpu_runtime_missing")
    if ("system not yet initialized" in line or "cudaErrorSystemNotReady" in line
            or "CUDA_ERROR_SYSTEM_NOT_READY" in line):
        return Hit("config", "fatal", "cuda_system_not_ready")
    return None


# ---- CUDA runtime errors seen by the application ------------------------------------------
_CUDA_NVLINK = re.compile(r"(?:^|rror: |\] )CUDA error: uncorrectable NVLink")
_CUDA_FAILURE = re.compile(r"Cuda failure (?:\d+ )?'")
_CUDA_ADVICE = re.compile(r"CUDA kernel errors might|For debugging consider|Compile with|"
                          r"TORCH_USE_CUDA_DSA")
_KERNEL_ASSERT = re.compile(r"\.cuh?:\d+: .{0,300}block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] "
                            r"Assertion `")
def cuda(line: str) -> Hit | None:
    if "OOM when allocating tensor" in line or "RESOURCE_EXHAUSTED: Out of memory" in line:
        return Hit("cuda_app_error", "fatal", "cuda_oom")  # TensorFlow's and XLA's (JAX) allocators
    if "CU" not in line and "cuda" not in line and "Cuda" not in line:  # CUDA, CUBLAS, CUDNN
        return None
    if "NVLink" in line and "ncorrectable" in line and _CUDA_NVLINK.search(line, 0, 4096) \
            or "NvlinkUncorrectable" in line:  # the error itself, not text quoting it
        return Hit("nvlink", "fatal", "cuda_nvlink_uncorrectable")  # hardware, not the app
    if "TORCH_USE_CUDA_DSA" in line:  # PyTorch's advice printed after every CUDA error;
        # a tool that flattens the message puts the error itself before it on one line
        m = _CUDA_ADVICE.search(line)
        hit = cuda(line[:m.start()]) if m is not None and m.start() > 0 else None
        return hit if hit is not None else Hit("other", "info", "cuda_advice")
    if "Assertion `" in line and _KERNEL_ASSERT.search(line, 0, 4096):  # a kernel's assert()
        return Hit("cuda_app_error", "fatal", "cuda_device_assert")
    if "uncorrectable ECC error" in line:
        return Hit("critical_gpu", "fatal", "cuda_ecc_uncorrectable")
    if "Invalid access of peer GPU memory over nvlink or a hardware error" in line \
            or "CUDA_ERROR_CONTAINED" in line or "cudaErrorContained" in line:
        # the GPU's error containment stopped the process (the app's view of a contained XID,
        # such as 94): hardware, not the job's bug; it follows that XID's policy as ECC does
        return Hit("critical_gpu", "fatal", "cuda_error_contained")
    if ("out of memory" in line or "OutOfMemoryError" in line) and (
            "OutOfMemoryError" in line or "CUDA out of memory" in line or "rror: out of memory" in line
            or "rror (2): out of memory" in line):  # not vLLM's "if you are running out of memory"
        return Hit("cuda_app_error", "fatal", "cuda_oom")
    if "illegal memory access" in line or "illegal address" in line:
        return Hit("cuda_app_error", "fatal", "cuda_illegal_access")
    if "device-side assert" in line:
        return Hit("cuda_app_error", "fatal", "cuda_device_assert")
    if "CUDA-capable device" in line:
        return Hit("cuda_app_error", "fatal", "cuda_no_device")
    if "UserWarning" in line:  # e.g. cuDNN "Plan failed ... NOT_SUPPORTED": another plan runs
        return Hit("other", "info", "cuda_warning")
    if ("CUDA error" in line or "CUDA_ERROR_" in line or "cudaError" in line
            or "Cuda failure" in line and _CUDA_FAILURE.search(line, 0, 4096)  # NCCL's bare
            # "Last error" line: Cuda failure 'x', Cuda failure 217 'x'
            or "CUBLAS_STATUS_" in line and "SUCCESS" not in line
            or "CUDNN_STATUS_" in line and "SUCCESS" not in line
            or "Check failed: error == cudaSuccess" in line):  # Caffe/glog: CHECK on a CUDA call
        return Hit("cuda_app_error", "fatal", "cuda_error")
    return None


# ---- torchrun's summary of a worker that exited -------------------------------------------
def torch_elastic(line: str) -> Hit | None:
    """torchrun's report that a worker exited: ``ChildFailedError``, its agent's ``failed
    (exitcode: -6) local_rank: 3 (pid: …)`` and its Root Cause block (``exitcode  : -6 (pid:
    …)``, ``traceback : Signal 6 (SIGABRT) received by PID …``). Named so analysts see what
    the line is, but ``info``: the worker's own error (XID, NCCL, CUDA) came before it and is
    the evidence; runs last, so a line that quotes such an error is classified by it."""
    if "ChildFailedError" in line:
        return Hit("other", "info", "torch_elastic_child_failed")
    if ("failed (exitcode" in line and "local_rank" in line) \
            or ("exitcode" in line and "(pid:" in line) \
            or ("received by PID" in line and "Signal" in line):  # the Root Cause block
        return Hit("other", "info", "torch_elastic_worker_failed")
    return None


SOFTWARE = (termination, torch_watchdog, runtimes, nccl, gpu_setup, cuda, torch_elastic)
