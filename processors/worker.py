"""``aegis worker``: the Faust stream worker with every agent and sink.

Checks that Kafka and Redis answer before starting, and says clearly which one does not
(exit 3). Configuration: env AEGIS_* (see processors.settings.Settings) and these flags.
"""

from __future__ import annotations

import argparse
import logging
import sys

from processors.settings import PipelineConfig, Settings, mask_url
from schemas.errors import AegisError, ServiceUnavailable


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    s = Settings()
    p = argparse.ArgumentParser(prog="aegis worker", description=__doc__)
    p.add_argument("--brokers", default=s.brokers, help="Kafka bootstrap servers (env AEGIS_KAFKA_BOOTSTRAP)")
    p.add_argument("--redis", default=s.redis_url, help="Redis URL for the isolation queue (env AEGIS_REDIS_URL)")
    p.add_argument("--cluster", default=s.cluster, help="cluster name: the Redis stream is aegis:{cluster}:commands")
    p.add_argument("--app-id", default=s.app_id, help="Faust app id = consumer group and changelog prefix")
    p.add_argument("--topic-prefix", default="", help="prefix for every topic name")
    p.add_argument("--partitions", type=int, default=s.partitions, help="partitions of input topics and tables")
    p.add_argument("--metrics-port", type=int, default=s.metrics_port, help="Prometheus /metrics port (0: off)")
    p.add_argument("--policy", default=s.policy, help="TOML policy file: thresholds, XID policy")
    p.add_argument("--inventory", default=s.inventory, help="inventory JSON: host IPs, GPU bus ids, jobs")
    p.add_argument("--checkpoint-every", type=float, default=s.checkpoint_every_s,
                   help="seconds of event time between detector-state checkpoints")
    p.add_argument("--data-dir", default=s.data_dir,
                   help="Faust's local folder, {conf.name} = the app id "
                        "(env AEGIS_DATA_DIR; default: ./{app-id}-data)")
    p.add_argument("--no-redis", action="store_true", help="do not send commands to Redis (topic only)")
    p.add_argument("--loglevel", default="warning")
    a = p.parse_args(argv)
    s.brokers, s.redis_url, s.cluster, s.app_id = a.brokers, a.redis, a.cluster, a.app_id
    s.partitions, s.metrics_port, s.policy, s.inventory = a.partitions, a.metrics_port, a.policy, a.inventory
    s.checkpoint_every_s, s.data_dir = a.checkpoint_every, a.data_dir
    if a.topic_prefix:
        s = s.with_topic_prefix(a.topic_prefix)
    return a, s


def check_kafka(brokers: str, timeout: float = 10.0) -> None:
    from confluent_kafka.admin import AdminClient

    try:
        md = AdminClient({"bootstrap.servers": brokers, "socket.timeout.ms": int(timeout * 1000)}
                         ).list_topics(timeout=timeout)
    except Exception as e:
        raise ServiceUnavailable(f"Kafka at {brokers} did not answer within {timeout:.0f}s: {e}") from e
    if not md.brokers:
        raise ServiceUnavailable(f"Kafka at {brokers} answered with no brokers")


def check_redis(url: str, timeout: float = 5.0) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout).ping()
    except Exception as e:
        raise ServiceUnavailable(f"Redis at {mask_url(url)} did not answer: {e}") from e


def main(argv: list[str] | None = None) -> int:
    a, settings = parse(argv)
    logging.basicConfig(level=a.loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = PipelineConfig.from_toml(settings.policy)
        inventory = None
        if settings.inventory:
            from schemas.inventory import Inventory

            inventory = Inventory.load(settings.inventory)
        check_kafka(settings.brokers)
        sink = None
        if not a.no_redis:
            check_redis(settings.redis_url)
            from sinks.delivery import RetryingSink
            from sinks.redis_queue import RedisCommandQueue

            def warn(attempt: int, wait: float, err: Exception) -> None:
                print(f"aegis worker: Redis flush failed ({err}); retry {attempt} in {wait:.1f}s",
                      file=sys.stderr, flush=True)

            sink = RetryingSink(RedisCommandQueue(settings.redis_url, cluster=settings.cluster),
                                on_retry=warn)
            sink.setup()
    except ServiceUnavailable as e:
        print(f"aegis worker: {e}", file=sys.stderr)
        return 3
    except (AegisError, OSError) as e:
        print(f"aegis worker: {e}", file=sys.stderr)
        return 2
    metrics = None
    if settings.metrics_port:
        from sinks.metrics import Metrics, start_metrics_server

        metrics = Metrics()
        _, port = start_metrics_server(settings.metrics_port, registry=metrics)
        print(f"aegis worker: metrics on http://127.0.0.1:{port}/metrics", file=sys.stderr, flush=True)
    from processors.faust_app import build_app

    app = build_app(settings, config, inventory, command_sink=sink, metrics=metrics)
    print(f"aegis worker: {settings!r}", file=sys.stderr, flush=True)
    import faust

    worker = faust.Worker(app, loglevel=a.loglevel, quiet=True)
    worker.execute_from_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
