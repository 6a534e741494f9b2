"""Phase 1 through the real broker: simulator → log topic → worker's log agent →
diagnosis topic, commands topic and the Redis isolation stream."""

from __future__ import annotations

import pytest

from producers.sim.simulation import SimConfig
from schemas.topics import LOGS
from tests.kafkautil import consume
from tests.simkafka import publish_sim, read_diagnoses, redis_commands, wait_for
from tests.workerutil import WorkerProc

pytestmark = pytest.mark.integration


def test_xid79_from_log_topic_to_commands(kafka_bootstrap, redis_url, uid, tmp_path):
    w = WorkerProc(kafka_bootstrap, redis_url, uid, tmp_path / "worker.log").start()
    try:
        sim = publish_sim(kafka_bootstrap, w.prefix, SimConfig(
            hosts=16, hosts_per_job=8, scenario="xid79", seed=3, duration_s=240, fault_at_s=60),
            topics=[LOGS.name])
        fault = sim.truth[0]
        culprit = fault["culprit"]["hosts"][0]
        diags = read_diagnoses(kafka_bootstrap, w.topic("aegis.diagnoses"), timeout=120,
                               until=lambda ds: any(d.kind == "critical_error" for d in ds))
        crit = [d for d in diags if d.kind == "critical_error"]
        assert crit and crit[0].culprits.hosts == (culprit,), (diags, w.tail())
        assert crit[0].job == fault["job"]
        cmds = wait_for(lambda: redis_commands(redis_url, w.cluster), 60, "commands in Redis")
        isolated = {c.target for c in cmds if c.action == "isolate_host"}
        assert isolated == {culprit}, cmds  # that host, none of its peers
        assert any(c.action == "restart_job" and c.target == fault["job"] for c in cmds)
        audit = consume(kafka_bootstrap, w.topic("aegis.commands"), timeout=30,
                        until=lambda ms: len(ms) >= len(cmds))
        assert len(audit) == len(cmds)
        # issue 7: the live worker's /metrics shows every family, with this run's counts
        metrics = w.wait_metric('aegis_commands_issued_total{action="isolate_host"} 1.0')
        for family in ("aegis_events_in_total", "aegis_events_out_total",
                       "aegis_dead_letters_total", "aegis_diagnoses_total",
                       "aegis_commands_issued_total", "aegis_commands_refused_total",
                       "aegis_consumer_lag", "aegis_processing_latency_seconds",
                       "aegis_sink_retries_total"):
            assert f"# TYPE {family}" in metrics, (family, metrics)
        assert 'aegis_diagnoses_total{kind="critical_error"}' in metrics, metrics
        w.wait_metric("aegis_consumer_lag{", timeout=30)  # the 5 s lag timer has run
    finally:
        w.stop()
