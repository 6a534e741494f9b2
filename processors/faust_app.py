"""The Faust app: one thin agent per input topic, plus the guard agent on diagnoses.

Each input agent only decodes, calls the shared :class:`~processors.pipeline.InputProcessor`
and routes what comes out (practices §1); detector state lives in a changelog-backed
Table and acks are held until the state covering them is written (processors.checkpoints).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import faust

from processors import faust_fixes
from processors.checkpoints import (
    AckHolder,
    PendingWrites,
    load_chunked,
    save_chunked,
    tracked_table,
)
from processors.pipeline import INPUT_KINDS, InputProcessor
from processors.settings import PipelineConfig, Settings
from schemas.codec import decode, encode
from schemas.errors import WireError
from schemas.inventory import Inventory
from schemas.records import DeadLetter, Diagnosis

log = logging.getLogger("aegis.worker")


def broker_urls(brokers: str) -> list[str]:
    return [f"kafka://{b.strip()}" for b in brokers.split(",") if b.strip()]


def build_app(settings: Settings, config: PipelineConfig | None = None,
              inventory: Inventory | None = None, command_sink: Any = None,
              metrics: Any = None) -> faust.App:
    """Build the worker app. ``command_sink`` has add/flush (the Redis queue); ``metrics``
    is a sinks.metrics.Metrics (or None)."""
    config = config or PipelineConfig()
    faust_fixes.apply()
    app = faust.App(
        settings.app_id, broker=broker_urls(settings.brokers), store="memory://",
        key_serializer="raw", value_serializer="raw", topic_partitions=settings.partitions,
        topic_replication_factor=1, web_enabled=False, consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0, producer_acks=-1, table_standby_replicas=0,
        stream_wait_empty=False,
        # a crashed worker's partitions move to the others after 10 s, not Faust's 60 s
        broker_session_timeout=10.0, broker_heartbeat_interval=2.0,
        # a 10,000-GPU job is 1,250 msgs/s in one partition: the 1 MiB default fetch caps
        # a partition near that rate (bench/zscore.py)
        consumer_max_fetch_size=16 * 1024**2,
        datadir=settings.data_dir or "{conf.name}-data",  # Faust's own default
    )
    names = {"logs": settings.topic_logs, "telemetry": settings.topic_telemetry,
             "ccl": settings.topic_ccl}
    topics = {k: app.topic(n, key_type=bytes, value_type=bytes, partitions=settings.partitions)
              for k, n in names.items()}
    diagnoses_t = app.topic(settings.topic_diagnoses, key_type=bytes, value_type=bytes,
                            partitions=settings.partitions)
    commands_t = app.topic(settings.topic_commands, key_type=bytes, value_type=bytes,
                           partitions=settings.partitions)
    deadletter_t = app.topic(settings.topic_deadletter, key_type=bytes, value_type=bytes)
    # every produced record an ack depends on (changelog, diagnoses, commands, dead
    # letters) is awaited before the ack: processors.checkpoints.PendingWrites
    pending = PendingWrites()
    state = tracked_table(app, "detector-state", pending, default=None,
                          partitions=settings.partitions, key_type=bytes, value_type=bytes)
    guard_state = tracked_table(app, "guard-state", pending, default=None,
                                partitions=settings.partitions, key_type=bytes,
                                value_type=bytes)

    async def send(topic: Any, key: bytes, value: bytes) -> None:
        pending.add(await topic.send(key=key, value=value))

    async def dead_letter(dl: DeadLetter) -> None:
        await send(deadletter_t, dl.topic.encode(), encode(dl))
        if metrics is not None:
            metrics.record_dead_letter(dl.topic, dl.stage)
        log.warning("dead letter from %s[%d]@%d: %s", dl.topic, dl.partition, dl.offset, dl.error)

    def make_input_agent(kind: str) -> None:
        def load(job: str) -> bytes | None:
            return load_chunked(state, f"{kind}:{job}")

        async def run(stream: Any) -> None:
            proc = InputProcessor(kind, config, inventory, load_state=load)
            holder = AckHolder(settings.checkpoint_every_s)
            ack_stream = stream.noack()
            async for event in ack_stream.events():
                started = time.perf_counter()
                msg = event.message
                res = proc.handle(event.value, topic=msg.topic, partition=msg.partition,
                                  offset=msg.offset)
                if metrics is not None:
                    metrics.record_in(msg.topic)
                if res.dead_letter is not None:
                    await dead_letter(res.dead_letter)
                    await pending.ack_after(ack_stream, holder.release(msg.partition, event))
                    continue
                for d in res.diagnoses:
                    await send(diagnoses_t, d.job.encode(), encode(d))
                    if metrics is not None:
                        metrics.record_items((d,))
                        metrics.record_out(settings.topic_diagnoses)
                job = res.job or ""
                wall = time.monotonic()
                holder.hold(job, msg.partition, event, wall)
                ts = proc._watermark.get(job, 0.0)
                if holder.due(job, ts, force=bool(res.diagnoses)):
                    save_chunked(state, f"{kind}:{job}", proc.snapshot(job))
                    await pending.ack_after(ack_stream, holder.checkpointed(job, ts))
                for quiet in holder.quiet_jobs(msg.partition, wall, job):
                    save_chunked(state, f"{kind}:{quiet}", proc.snapshot(quiet))
                    await pending.ack_after(ack_stream, holder.checkpointed(
                        quiet, proc._watermark.get(quiet, 0.0)))
                if metrics is not None:
                    metrics.observe_latency(time.perf_counter() - started)

        run.__name__ = f"{kind}_agent"
        app.agent(topics[kind], name=f"aegis-{kind}")(run)

    for kind in INPUT_KINDS:
        make_input_agent(kind)

    if metrics is not None:
        @app.timer(5.0)
        async def consumer_lag() -> None:
            consumer = app.consumer
            for tp in consumer.assignment():
                high = consumer.highwater(tp)
                committed = consumer._committed_offset.get(tp)  # type: ignore[attr-defined]
                if high is not None:
                    metrics.set_lag(tp.topic, tp.partition, int(high) - int(committed or 0))

    @app.agent(diagnoses_t, name="aegis-guard")
    async def guard_agent(stream: Any) -> None:
        """Diagnosis → guard → IsolationCommand. One guard per diagnoses partition: the
        blast radius is per job (a job is in one partition); the cluster-wide rate limit
        is therefore per partition, see docs/sinks.md."""
        import msgpack

        from sinks.guard import Guard

        guards: dict[int, Guard] = {}
        sizes = {j: len(hs) for j, hs in (inventory.jobs.items() if inventory else [])}
        async def handle(event: Any) -> None:
            msg = event.message
            if metrics is not None:
                metrics.record_in(msg.topic)
            d = decode(Diagnosis, event.value)
            if isinstance(d, WireError):
                await dead_letter(DeadLetter(msg.topic, msg.partition, msg.offset,
                                             bytes(event.value), str(d)))
                return
            g = guards.get(msg.partition)
            if g is None:
                g = guards[msg.partition] = Guard(config.section("guard"),
                                                  job_hosts=lambda j: sizes.get(j, 0))
                saved = guard_state.get(f"guard:{msg.partition}".encode())
                if saved is not None:
                    g.restore(msgpack.unpackb(bytes(saved), raw=False, strict_map_key=False))
            decision = g.decide(d)
            if decision.duplicate:
                return
            for cmd in decision.commands:
                if command_sink is not None:
                    command_sink.add(cmd)
            if command_sink is not None and decision.commands:
                # at-least-once: this event is acked only after the queue has the commands
                await asyncio.to_thread(command_sink.flush)
            for cmd in decision.commands:
                await send(commands_t, cmd.job.encode(), encode(cmd))
                if metrics is not None:
                    metrics.record_items((cmd,))
                    metrics.record_out(settings.topic_commands)
            for extra in decision.diagnoses:
                await send(diagnoses_t, extra.job.encode(), encode(extra))
            for refusal in decision.refusals:
                if metrics is not None:
                    metrics.record_items((refusal,))
                log.info("guard refused %s %s: %s", refusal.action, refusal.target, refusal.reason)
            guard_state[f"guard:{msg.partition}".encode()] = msgpack.packb(
                g.snapshot(), use_bin_type=True)

        guard_stream = stream.noack()
        async for event in guard_stream.events():
            await handle(event)
            # the guard's state, commands and extra diagnoses are on the broker first
            await pending.ack_after(guard_stream, [event])

    return app
