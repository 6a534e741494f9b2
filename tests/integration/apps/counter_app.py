"""A minimal stateful Faust app for the changelog-recovery test: one agent, one Table.

Input: msgpack {"key": str, "seq": int} keyed by key. The table keeps per key the count and
the last seq counted (so a record re-read after a crash is not counted twice); each update
is also written to the output topic. Acks are held until the table write that covers them
(processors.checkpoints.AckHolder), exactly as the real worker does.

Run: python -m tests.integration.apps.counter_app BROKER IN_TOPIC OUT_TOPIC APP_ID
"""

from __future__ import annotations

import os
import sys
import time

import faust
import msgpack

from processors import faust_fixes
from processors.checkpoints import AckHolder, PendingWrites, tracked_table
from processors.faust_app import broker_urls


def build(broker: str, in_topic: str, out_topic: str, app_id: str) -> faust.App:
    faust_fixes.apply()
    app = faust.App(app_id, broker=broker_urls(broker), store="memory://", key_serializer="raw",
                    value_serializer="raw", topic_partitions=2, topic_replication_factor=1,
                    web_enabled=False, consumer_auto_offset_reset="earliest",
                    broker_commit_interval=0.5,
                    datadir=os.environ.get("AEGIS_DATA_DIR") or "{conf.name}-data")
    src = app.topic(in_topic, key_type=bytes, value_type=bytes, partitions=2)
    out = app.topic(out_topic, key_type=bytes, value_type=bytes, partitions=2)
    pending = PendingWrites()
    counts = tracked_table(app, "counts", pending, default=None, partitions=2, key_type=bytes,
                           value_type=bytes)

    @app.agent(src, name="counter")
    async def counter(stream):  # type: ignore[no-untyped-def]
        holder = AckHolder(every_s=0)  # checkpoint every event
        s = stream.noack()
        async for event in s.events():
            rec = msgpack.unpackb(event.value)
            key = rec["key"].encode()
            saved = counts.get(key)
            cur = msgpack.unpackb(saved) if saved is not None else {"count": 0, "last_seq": -1}
            if rec["seq"] > cur["last_seq"]:
                cur = {"count": cur["count"] + 1, "last_seq": rec["seq"]}
                counts[key] = msgpack.packb(cur)
                pending.add(await out.send(key=key, value=msgpack.packb(cur)))
            holder.hold(rec["key"], event.message.partition, event, time.monotonic())
            # the changelog write is on the broker before the ack
            await pending.ack_after(s, holder.checkpointed(rec["key"], 0.0))

    return app


if __name__ == "__main__":
    b, i, o, a = sys.argv[1:5]
    app = build(b, i, o, a)
    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()
