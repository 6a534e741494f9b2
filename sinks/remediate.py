"""``aegis remediate``: the reference remediation consumer of the isolation queue.

Reads ``aegis:{C}:commands`` through consumer group ``remediation`` and acts through a
swappable hook; acks on success, leaves the entry pending on failure (it is retried by
XAUTOCLAIM once idle for ``--min-idle-ms``), and moves it to ``aegis:{C}:commands:dead``
after ``--max-deliveries`` attempts or when no hook handles its action.

Hooks:
- ``--hook-cmd 'CMD {action} {target}'``: run CMD (no shell; placeholders {id} {action}
  {target} {host} {job} {reason} {diagnosis_id} {issued_at} are filled per argument) with
  the command's JSON on stdin and AEGIS_CMD_* environment variables; exit 0 = done.
- ``--kubectl``: ``kubectl cordon <node>`` for isolate_host (node = --node-format, default
  the host name); other actions go to --hook-cmd if given.
- ``--dry-run``: print what would be done; claims and acks nothing.

Exit codes: 0 done; 1 some command failed (--once); 2 usage; 3 Redis unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from schemas.codec import encode
from schemas.errors import AegisError, ConfigError, ServiceUnavailable
from schemas.records import IsolationCommand
from sinks.delivery import RetryPolicy
from sinks.guard import host_of
from sinks.redis_consumer import CommandConsumer, Delivery, default_consumer_name
from sinks.redis_queue import DEFAULT_GROUP, RedisOptions

PLACEHOLDERS = ("id", "action", "target", "host", "job", "reason", "diagnosis_id", "issued_at")


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    message: str


Handler = Callable[[IsolationCommand], Outcome]


def command_values(cmd: IsolationCommand) -> dict[str, str]:
    return {"id": cmd.id, "action": cmd.action, "target": cmd.target,
            "host": host_of(cmd.target), "job": cmd.job, "reason": cmd.reason,
            "diagnosis_id": cmd.diagnosis_id, "issued_at": f"{cmd.issued_at:.3f}"}


def command_env(cmd: IsolationCommand) -> dict[str, str]:
    return {f"AEGIS_CMD_{k.upper()}": v for k, v in command_values(cmd).items()}


def _run(argv: list[str], cmd: IsolationCommand, timeout_s: float) -> Outcome:
    try:
        r = subprocess.run(argv, input=encode(cmd), env={**os.environ, **command_env(cmd)},
                           capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return Outcome(False, f"{argv[0]} timed out after {timeout_s:g}s")
    except OSError as e:
        return Outcome(False, f"{argv[0]} could not run: {e}")
    tail = (r.stderr or r.stdout or b"").decode("utf-8", "replace").strip()[-300:]
    return Outcome(r.returncode == 0, f"{shlex.join(argv)} -> exit {r.returncode}"
                   + (f": {tail}" if tail else ""))


class ShellHook:
    """Run a command template per IsolationCommand (argv split once, filled per argument)."""

    def __init__(self, template: str, timeout_s: float = 120.0) -> None:
        try:
            self.argv = shlex.split(template)
        except ValueError as e:
            raise ConfigError(f"--hook-cmd {template!r}: {e}") from e
        if not self.argv:
            raise ConfigError("--hook-cmd is empty")
        probe = dict.fromkeys(PLACEHOLDERS, "x")
        for arg in self.argv:
            try:
                arg.format_map(probe)
            except (KeyError, IndexError, ValueError) as e:
                raise ConfigError(f"--hook-cmd: bad placeholder in {arg!r} ({e}); "
                                  f"use {', '.join('{' + p + '}' for p in PLACEHOLDERS)}") from e
        self.timeout_s = timeout_s

    def __call__(self, cmd: IsolationCommand) -> Outcome:
        values = command_values(cmd)
        return _run([a.format_map(values) for a in self.argv], cmd, self.timeout_s)


class KubectlHook:
    """``kubectl cordon <node>`` for isolate_host."""

    def __init__(self, kubectl: str = "kubectl", node_format: str = "{host}",
                 timeout_s: float = 60.0) -> None:
        self.kubectl, self.node_format, self.timeout_s = kubectl, node_format, timeout_s

    def __call__(self, cmd: IsolationCommand) -> Outcome:
        node = self.node_format.format_map(command_values(cmd))
        return _run([self.kubectl, "cordon", node], cmd, self.timeout_s)


def describe(cmd: IsolationCommand) -> str:
    return (f"{cmd.action} {cmd.target} (job {cmd.job}, command {cmd.id}, "
            f"issued at {cmd.issued_at:.3f}): {cmd.reason[:200]}")


@dataclass
class Remediator:
    """Route each delivery to a handler; ack, leave pending, or bury."""

    consumer: CommandConsumer
    handlers: dict[str, Handler]  # action -> handler; "*" = any other action
    out: TextIO = sys.stdout
    done: int = 0
    failed: int = 0
    buried: int = 0

    def handle(self, d: Delivery) -> None:
        if d.command is None:
            self._bury(d, f"undecodable entry: {d.error}", 0)
            return
        attempts = self.consumer.deliveries(d.entry_id)
        if attempts > self.consumer.max_deliveries:
            self._bury(d, f"gave up after {attempts - 1} failed deliveries", attempts)
            return
        handler = self.handlers.get(d.command.action) or self.handlers.get("*")
        if handler is None:
            self._bury(d, f"no handler for action {d.command.action!r}", attempts)
            return
        result = handler(d.command)
        if result.ok:
            self.consumer.ack(d.entry_id)
            self.done += 1
            print(f"done  {d.entry_id} {describe(d.command)} | {result.message}", file=self.out)
        else:
            self.failed += 1
            print(f"FAIL  {d.entry_id} {describe(d.command)} | {result.message} "
                  f"(left pending, attempt {attempts}/{self.consumer.max_deliveries})",
                  file=self.out)

    def _bury(self, d: Delivery, reason: str, attempts: int) -> None:
        self.consumer.bury(d, reason, attempts)
        self.buried += 1
        print(f"dead  {d.entry_id} -> {self.consumer.dead_stream}: {reason}", file=self.out)

    def start(self) -> None:
        """Finish what this consumer name held when it last stopped."""
        for d in self.consumer.history():
            self.handle(d)

    def drain(self) -> None:
        """Reclaim idle entries, then take everything available, without blocking."""
        for d in self.consumer.reclaim():
            self.handle(d)
        while batch := self.consumer.claim(block_ms=None):
            for d in batch:
                self.handle(d)

    def step(self, block_ms: int) -> None:
        for d in self.consumer.reclaim():
            self.handle(d)
        for d in self.consumer.claim(block_ms=block_ms):
            self.handle(d)


def parse_args(argv: list[str], prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=(
        "Reference remediation consumer: read isolation commands from the Redis Streams queue "
        "(consumer group), act through a hook, ack on success."), epilog=(
        "hook placeholders: " + " ".join("{" + x + "}" for x in PLACEHOLDERS)
        + "; env: AEGIS_CMD_<NAME>; the command's JSON is on stdin. "
        "Exit codes: 0 ok, 1 a command failed (--once), 2 usage, 3 Redis unreachable."))
    p.add_argument("--redis", default=os.environ.get("AEGIS_REDIS_URL", "redis://127.0.0.1:6379/0"),
                   help="redis:// or rediss:// URL (env AEGIS_REDIS_URL)")
    p.add_argument("--password", default=None,
                   help="Redis password (prefer env AEGIS_REDIS_PASSWORD; never printed)")
    p.add_argument("--tls-ca", help="CA bundle for rediss://")
    p.add_argument("--tls-cert", help="client certificate for rediss://")
    p.add_argument("--tls-key", help="client key for rediss://")
    p.add_argument("--cluster", default="default", help="cluster name (stream aegis:{C}:commands)")
    p.add_argument("--group", default=DEFAULT_GROUP, help="consumer group (default %(default)s)")
    p.add_argument("--consumer", default=default_consumer_name(),
                   help="this consumer's name (default host-pid)")
    p.add_argument("--dry-run", action="store_true", help="print what would be done; ack nothing")
    p.add_argument("--hook-cmd", help="command template, e.g. 'isolate.sh {action} {target}'")
    p.add_argument("--hook-timeout", type=float, default=120.0, help="seconds per hook run")
    p.add_argument("--kubectl", action="store_true", help="kubectl cordon <node> for isolate_host")
    p.add_argument("--node-format", default="{host}", help="node name for kubectl (default {host})")
    p.add_argument("--once", action="store_true", help="process what is pending, then exit")
    p.add_argument("--min-idle-ms", type=int, default=60_000,
                   help="reclaim entries idle this long from dead consumers (XAUTOCLAIM)")
    p.add_argument("--max-deliveries", type=int, default=5,
                   help="attempts before an entry is moved to the dead stream")
    p.add_argument("--block-ms", type=int, default=2000, help="wait for new entries (follow mode)")
    args = p.parse_args(argv)
    if not (args.dry_run or args.hook_cmd or args.kubectl):
        p.error("choose what to do: --hook-cmd CMD, --kubectl, or --dry-run")
    return args


def _handlers(args: argparse.Namespace) -> dict[str, Handler]:
    handlers: dict[str, Handler] = {}
    if args.hook_cmd:
        handlers["*"] = ShellHook(args.hook_cmd, args.hook_timeout)
    if args.kubectl:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise ConfigError("--kubectl: kubectl is not on PATH")
        handlers["isolate_host"] = KubectlHook(kubectl, args.node_format, args.hook_timeout)
    return handlers


def _dry_run(consumer: CommandConsumer, args: argparse.Namespace, out: TextIO) -> int:
    seen = consumer.peek()
    last = seen[-1].entry_id if seen else "0-0"
    while True:
        for d in seen:
            what = describe(d.command) if d.command else f"bury (undecodable: {d.error})"
            print(f"would {d.entry_id} {what}", file=out)
        if args.once:
            return 0
        seen = consumer.follow(last, args.block_ms)
        last = seen[-1].entry_id if seen else last


def main(argv: list[str] | None = None, prog: str = "aegis remediate") -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv), prog)
    out = sys.stdout
    try:
        options = RedisOptions(args.redis, password=args.password
                               or os.environ.get("AEGIS_REDIS_PASSWORD") or None,
                               tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key)
        consumer = CommandConsumer(options, cluster=args.cluster, group=args.group,
                                   consumer=args.consumer, min_idle_ms=args.min_idle_ms,
                                   max_deliveries=args.max_deliveries)
        handlers = {} if args.dry_run else _handlers(args)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        if args.dry_run:
            return _dry_run(consumer, args, out)
        consumer.setup()
        rem = Remediator(consumer, handlers, out)
        rem.start()
        if args.once:
            rem.drain()
            return 1 if rem.failed else 0
        return _follow(rem, args.block_ms, prog)
    except ServiceUnavailable as e:
        print(f"{prog}: {e}", file=sys.stderr)  # names the (masked) URL and the step
        return 3
    except AegisError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    finally:
        consumer.close()


def _follow(rem: Remediator, block_ms: int, prog: str) -> int:
    """Run until SIGTERM/SIGINT; ride out Redis outages with capped backoff."""
    stop: list[int] = []
    with contextlib.suppress(ValueError):  # not the main thread: rely on KeyboardInterrupt
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    policy, attempt = RetryPolicy(base_s=0.5, cap_s=30.0), 0
    rng = random.Random()
    while not stop:
        try:
            rem.step(block_ms)
            attempt = 0
        except ServiceUnavailable as e:
            attempt += 1
            wait = policy.delay(attempt, rng)
            print(f"{prog}: {e}; retrying in {wait:.1f}s", file=sys.stderr)
            time.sleep(wait)
    return 0
