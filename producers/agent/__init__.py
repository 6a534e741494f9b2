"""The aegis host agent: collectors (NVML, sysfs RDMA, /proc, kernel and training logs, the
CCL socket), one TelemetryBatch per host per interval, and a spooling Kafka publisher.

Aegis §3/§5.1: every signal comes from outside the model: host telemetry, logs, the network
and the CCL. See docs/agent.md.
"""
