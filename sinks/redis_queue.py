"""The isolation queue: IsolationCommands on a Redis Stream with a consumer group.

Layout (docs/sinks.md), one set of keys per cluster ``C``; the braces are a Redis Cluster
hash tag, so the seen-keys and the stream share a slot and one script can touch both:

    aegis:{C}:commands        stream; fields cmd (JSON, schemas.codec), id, action, target, job
    aegis:{C}:seen:<cmd id>   "the command was enqueued" marker (value = stream entry id, TTL)
    aegis:{C}:commands:dead   commands a consumer gave up on (reason, consumer, deliveries)
    consumer group            "remediation" (created at id 0 by setup(), so nothing is missed)

Idempotency: each command goes through one Lua script that XADDs only if its seen-key is
absent and then sets it, atomically. A retried flush, a worker replaying after a crash, or a
second sink instance therefore never enqueues the same command id twice (while the seen-key
lives: ``seen_ttl_s``, default 7 days = the longest input-topic retention). A flush sends all
buffered commands in one MULTI/EXEC pipeline (practices §9).
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from schemas.codec import encode
from schemas.errors import ConfigError, ServiceUnavailable
from schemas.records import DeadLetter, IsolationCommand
from sinks.base import SinkItem

DEFAULT_GROUP = "remediation"
# ~100K entries: at the guard's default 20 isolations/h (plus restarts/netdiag) that is
# months of commands. Trimming is approximate (MAXLEN ~) and can drop un-acked entries, so
# keep it far above what consumers could ever fall behind by.
DEFAULT_MAXLEN = 100_000
DEFAULT_SEEN_TTL_S = 7 * 86400

_ENQUEUE_LUA = """
-- KEYS[1] seen-key, KEYS[2] stream; ARGV[1] ttl s, ARGV[2] maxlen, ARGV[3..] field, value
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local xadd = {'XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*'}
for i = 3, #ARGV do xadd[#xadd + 1] = ARGV[i] end
local entry = redis.call(unpack(xadd))
redis.call('SET', KEYS[1], entry, 'EX', ARGV[1])
return entry
"""


def stream_key(cluster: str) -> str:
    return f"aegis:{{{cluster}}}:commands"


def dead_key(cluster: str) -> str:
    return f"aegis:{{{cluster}}}:commands:dead"


def seen_key(cluster: str, command_id: str) -> str:
    return f"aegis:{{{cluster}}}:seen:{command_id}"


def mask_url(url: str) -> str:
    """``redis://user:secret@h:1/0`` -> ``redis://user:***@h:1/0`` (never print secrets)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True, slots=True)
class RedisOptions:
    """How to reach Redis. ``password`` (or one in the URL) is never shown by repr/str."""

    url: str = "redis://127.0.0.1:6379/0"
    password: str | None = None
    username: str | None = None
    tls_ca: str | None = None  # CA bundle for rediss://
    tls_cert: str | None = None  # client certificate (mutual TLS)
    tls_key: str | None = None
    tls_verify: bool = True
    connect_timeout_s: float = 2.0
    socket_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(f"redis: URL scheme {scheme!r} is not redis://, rediss:// or unix://"
                              f" ({mask_url(self.url)})")
        tls_given = self.tls_ca or self.tls_cert or self.tls_key or not self.tls_verify
        if tls_given and scheme != "rediss":
            raise ConfigError(f"redis: TLS options need a rediss:// URL, got {mask_url(self.url)}")

    @property
    def shown(self) -> str:
        """The URL with any password masked, for logs and errors."""
        return mask_url(self.url)

    def __repr__(self) -> str:
        pw = "***" if self.password else None
        return (f"RedisOptions(url={self.shown!r}, password={pw!r}, username={self.username!r}, "
                f"tls_ca={self.tls_ca!r}, tls_cert={self.tls_cert!r}, tls_verify={self.tls_verify})")

    __str__ = __repr__

    def connect(self) -> redis.Redis:
        """A client that fails fast (one quick retry): backoff belongs to sinks.delivery."""
        kw: dict[str, Any] = {"socket_connect_timeout": self.connect_timeout_s,
                              "socket_timeout": self.socket_timeout_s,
                              "retry": Retry(NoBackoff(), 1), "decode_responses": False}
        if self.password is not None:
            kw["password"] = self.password
        if self.username is not None:
            kw["username"] = self.username
        if urlsplit(self.url).scheme == "rediss":
            kw["ssl_cert_reqs"] = ssl.CERT_REQUIRED if self.tls_verify else ssl.CERT_NONE
            if self.tls_ca:
                kw["ssl_ca_certs"] = self.tls_ca
            if self.tls_cert:
                kw["ssl_certfile"] = self.tls_cert
            if self.tls_key:
                kw["ssl_keyfile"] = self.tls_key
        return redis.Redis.from_url(self.url, **kw)


_TRANSIENT_REPLIES = ("LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "BUSY ")


@contextlib.contextmanager
def unavailable_as(where: str, step: str) -> Iterator[None]:
    """Map redis-py's connection-level errors to ServiceUnavailable (retryable) and
    authentication errors to ConfigError (not retryable), naming step and (masked) URL."""
    try:
        yield
    except (redis.AuthenticationError, redis.exceptions.AuthorizationError) as e:
        raise ConfigError(f"redis {where}: {step}: authentication failed: {e}") from e
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise ServiceUnavailable(f"redis {where}: {step}: unreachable: {e}") from e
    except redis.ResponseError as e:
        if str(e).upper().startswith(_TRANSIENT_REPLIES):
            raise ServiceUnavailable(f"redis {where}: {step}: {e}") from e
        raise


def command_fields(cmd: IsolationCommand) -> dict[str, bytes]:
    """The stream entry of one command."""
    return {"cmd": encode(cmd), "id": cmd.id.encode(), "action": cmd.action.encode(),
            "target": cmd.target.encode(), "job": cmd.job.encode()}


def ensure_group(client: redis.Redis, stream: str, group: str) -> bool:
    """Create the consumer group at id 0 (MKSTREAM); False if it already existed."""
    try:
        client.xgroup_create(stream, group, id="0", mkstream=True)
        return True
    except redis.ResponseError as e:
        if "BUSYGROUP" in str(e):
            return False
        raise


class RedisCommandQueue:
    """Sink: ``add`` buffers IsolationCommands (other items are ignored), ``flush`` enqueues
    them once each, or raises ServiceUnavailable keeping the buffer (wrap it in
    :class:`sinks.delivery.RetryingSink` to retry with backoff)."""

    def __init__(self, options: RedisOptions | str, *, cluster: str = "default",
                 group: str | None = DEFAULT_GROUP, maxlen: int = DEFAULT_MAXLEN,
                 seen_ttl_s: int = DEFAULT_SEEN_TTL_S, client: redis.Redis | None = None) -> None:
        self.options = RedisOptions(options) if isinstance(options, str) else options
        if not cluster or any(c in cluster for c in "{}: "):
            raise ConfigError(f"redis queue: cluster name {cluster!r} must be non-empty "
                              "without braces, colons or spaces")
        if maxlen < 1000 or seen_ttl_s < 60:
            raise ConfigError(f"redis queue: maxlen={maxlen} (>= 1000) or seen_ttl_s="
                              f"{seen_ttl_s} (>= 60) too small to be safe")
        self.cluster, self.group = cluster, group
        self.maxlen, self.seen_ttl_s = int(maxlen), int(seen_ttl_s)
        self.stream = stream_key(cluster)
        self._client = client
        self._script: Any = None
        self._buf: list[IsolationCommand] = []
        self.enqueued = 0  # new stream entries written
        self.duplicates = 0  # commands whose id was already enqueued
        self.last_entry_ids: list[str | None] = []  # per command of the last flush (None = dup)

    def __repr__(self) -> str:
        return f"RedisCommandQueue({self.options.shown!r}, cluster={self.cluster!r})"

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = self.options.connect()
        return self._client

    @property
    def pending(self) -> int:
        return len(self._buf)

    def setup(self) -> None:
        with unavailable_as(self.options.shown, "setup"):
            self.client.ping()
            self._script = self.client.register_script(_ENQUEUE_LUA)
            if self.group:
                ensure_group(self.client, self.stream, self.group)

    def add(self, item: SinkItem) -> None:
        if isinstance(item, IsolationCommand):
            self._buf.append(item)

    def add_dead_letter(self, dead: DeadLetter) -> None:
        return None  # dead letters go to Kafka, not to the remediation queue

    def flush(self) -> None:
        if not self._buf:
            return
        if self._script is None:
            self._script = self.client.register_script(_ENQUEUE_LUA)
        batch = list(self._buf)
        with unavailable_as(self.options.shown, f"enqueue {len(batch)} command(s)"):
            pipe = self.client.pipeline(transaction=True)
            for cmd in batch:
                args: list[Any] = [self.seen_ttl_s, self.maxlen]
                for k, v in command_fields(cmd).items():
                    args += [k, v]
                self._script(keys=[seen_key(self.cluster, cmd.id), self.stream], args=args,
                             client=pipe)
            results = pipe.execute()
        del self._buf[:len(batch)]
        self.last_entry_ids = [r.decode() if isinstance(r, bytes) else r for r in results]
        new = sum(1 for r in results if r is not None)
        self.enqueued += new
        self.duplicates += len(results) - new

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
