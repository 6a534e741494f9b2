"""How CBD reaches a host: a small HostTarget that runs commands there.

Host specs (``aegis cbd --hosts``), one per host:

- ``local``: this machine;
- ``netns:NS``: the network namespace NS on this machine, through ``ip netns exec NS``
  (tests, and containers whose network lives in a named namespace);
- ``ssh:[USER@]HOST``: through ``ssh -o BatchMode=yes``; an extension point (the command
  line is built and documented, but CBD's tests do not reach a real ssh host).

A spec may carry a name and options: ``h1=netns:cbd-a addr=10.200.0.1 port=29500
env.NCCL_IB_HCA=mlx5``. ``addr`` is the data-plane address peers use for probes and the
collective (default: the host's first global IPv4, from its facts). ``--hosts`` takes a
comma-separated list of specs, a text file with one spec per line (``#`` comments), or a
JSON file ``[{"name", "target", "addr", "port", "env"}]``.

On-host programs are this package's modules run with the host's Python (``python -m
producers.cbd.facts``): the package must be installed there (it is, for local and netns).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from schemas.errors import ConfigError

_ROOT = str(Path(__file__).resolve().parent.parent.parent)
KINDS = ("local", "netns", "ssh")


@dataclass(frozen=True, slots=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False


@dataclass(frozen=True)
class HostSpec:
    name: str
    kind: str  # local | netns | ssh
    arg: str = ""  # namespace name, or ssh destination
    addr: str | None = None
    port: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return self.kind if self.kind == "local" else f"{self.kind}:{self.arg}"


class HostTarget:
    """Runs argv on one host. Subclasses only say how to prefix a command."""

    def __init__(self, spec: HostSpec, python: str = "") -> None:
        self.spec = spec
        self.python = python or sys.executable

    @property
    def name(self) -> str:
        return self.spec.name

    def prefix(self) -> list[str]:
        return []

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.spec.env)
        env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
        return env

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*self.prefix(), *argv]

    def module_argv(self, module: str, *args: str) -> list[str]:
        """argv that runs one of CBD's on-host programs (``python -m MODULE ARGS``)."""
        return [self.python, "-m", module, *args]

    def run(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        t0 = time.monotonic()
        try:
            proc = self.start(argv)
        except OSError as e:
            return CommandResult(127, "", f"cannot start {argv[0]}: {e}", 0.0)
        try:
            out, err = proc.communicate(timeout=max(0.1, timeout_s))
            return CommandResult(proc.returncode, out, err, time.monotonic() - t0)
        except subprocess.TimeoutExpired:
            stop(proc)
            out, err = proc.communicate()
            return CommandResult(-9, out, err, time.monotonic() - t0, timed_out=True)

    def start(self, argv: Sequence[str]) -> subprocess.Popen[str]:
        """Start a long-running helper (probe responder, collective rank) in its own group."""
        return subprocess.Popen(self.command(argv), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.environ(), cwd=_ROOT, start_new_session=True)


class LocalTarget(HostTarget):
    pass


class NetnsTarget(HostTarget):
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.spec.arg]


class SshTarget(HostTarget):
    """Extension point: runs through ssh. The remote host needs this package installed and
    ``python`` set (CbdConfig.python) to its interpreter; env options are passed with
    ``env K=V``. Not exercised by the test suite."""

    def __init__(self, spec: HostSpec, python: str = "") -> None:
        super().__init__(spec, python or "python3")

    def command(self, argv: Sequence[str]) -> list[str]:
        env = [f"{k}={v}" for k, v in sorted(self.spec.env.items())]
        remote = shlex.join(["env", *env, *argv] if env else list(argv))
        return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", self.spec.arg, remote]

    def environ(self) -> dict[str, str]:
        return dict(os.environ)


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill a helper and everything it started (its own process group), and wait until it
    is gone: a SIGKILLed responder still held its port when the next check started on it."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)


def make_target(spec: HostSpec, python: str = "") -> HostTarget:
    cls = {"local": LocalTarget, "netns": NetnsTarget, "ssh": SshTarget}[spec.kind]
    return cls(spec, python)


def parse_spec(text: str) -> HostSpec:
    """One host spec: ``[NAME=]KIND[:ARG] [addr=IP] [port=N] [env.K=V]...``."""
    tokens = shlex.split(text)
    if not tokens:
        raise ConfigError("empty host spec")
    head, opts = tokens[0], tokens[1:]
    name = ""
    if "=" in head.split(":", 1)[0]:
        name, head = head.split("=", 1)
    kind, _, arg = head.partition(":")
    if kind not in KINDS:
        raise ConfigError(f"host spec {text!r}: kind {kind!r} not one of {KINDS}")
    if kind != "local" and not arg:
        raise ConfigError(f"host spec {text!r}: {kind} needs an argument ({kind}:NAME)")
    addr: str | None = None
    port: int | None = None
    env: dict[str, str] = {}
    for o in opts:
        k, sep, v = o.partition("=")
        if not sep:
            raise ConfigError(f"host spec {text!r}: option {o!r} is not KEY=VALUE")
        if k == "addr":
            addr = v
        elif k == "name":
            name = v
        elif k == "port":
            port = _port(text, v)
        elif k.startswith("env."):
            env[k[4:]] = v
        else:
            raise ConfigError(f"host spec {text!r}: unknown option {k!r} "
                              "(addr, name, port, env.KEY)")
    if not name:
        name = socket.gethostname() if kind == "local" else arg.rsplit("@", 1)[-1]
    return HostSpec(name, kind, arg, addr, port, env)


def _port(where: str, v: object) -> int:
    try:
        p = int(str(v))
    except ValueError:
        p = -1
    if not 0 < p < 65536:
        raise ConfigError(f"host spec {where!r}: port={v!r} is not a port number")
    return p


def _from_json(doc: object, where: str) -> list[HostSpec]:
    if not isinstance(doc, list):
        raise ConfigError(f"{where}: a JSON hosts file is a list of host objects")
    specs = []
    for i, d in enumerate(doc):
        if isinstance(d, str):
            specs.append(parse_spec(d))
            continue
        if not isinstance(d, dict) or not isinstance(d.get("target"), str):
            raise ConfigError(f"{where}[{i}]: needs a 'target' string (local, netns:NS, ...)")
        base = parse_spec(d["target"])
        env = d.get("env", {})
        if not isinstance(env, dict):
            raise ConfigError(f"{where}[{i}].env: not an object")
        specs.append(HostSpec(str(d.get("name") or base.name), base.kind, base.arg,
                              d.get("addr") or base.addr,
                              _port(where, d["port"]) if d.get("port") else base.port,
                              {**base.env, **{str(k): str(v) for k, v in env.items()}}))
    return specs


def load_hosts(value: str) -> list[HostSpec]:
    """``--hosts``: a file (JSON list, or one spec per line) or a comma-separated list."""
    path = Path(value)
    if path.is_file():
        text = path.read_text()
        if text.lstrip().startswith("["):
            try:
                specs = _from_json(json.loads(text), value)
            except ValueError as e:
                raise ConfigError(f"{value}: not valid JSON: {e}") from e
        else:
            lines = (ln.split("#", 1)[0].strip() for ln in text.splitlines())
            specs = [parse_spec(ln) for ln in lines if ln]
    else:
        specs = [parse_spec(p.strip()) for p in value.split(",") if p.strip()]
    if not specs:
        raise ConfigError(f"--hosts {value!r}: no hosts")
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"--hosts: duplicate host names {dupes}; name them (NAME=KIND:ARG)")
    return specs
