"""`aegis remediate` without Redis: argument checks, hooks, routing of deliveries."""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass, field

import orjson
import pytest

from schemas.errors import ConfigError
from schemas.records import IsolationCommand
from sinks.redis_consumer import Delivery
from sinks.remediate import Outcome, Remediator, ShellHook, command_env, main, parse_args

CMD = IsolationCommand(id="d:isolate_gpu:h1/gpu3", job="j1", action="isolate_gpu",
                       target="h1/gpu3", reason="slow_compute", diagnosis_id="d", issued_at=5.0)


def test_help_and_usage_errors(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--hook-cmd" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--once"])  # no action chosen
    assert e.value.code == 2


def test_bad_hook_template_is_a_usage_error(capsys) -> None:
    assert main(["--hook-cmd", "echo {nope}", "--once"]) == 2
    assert "placeholder" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        ShellHook("echo 'unclosed")


def test_shell_hook_gets_fields_json_and_env() -> None:
    script = ("import json,os,sys; c=json.load(sys.stdin); "
              "sys.exit(0 if (c['id'], sys.argv[1], sys.argv[2], os.environ['AEGIS_CMD_HOST'])"
              " == ('d:isolate_gpu:h1/gpu3', 'isolate_gpu', 'h1/gpu3', 'h1') else 5)")
    hook = ShellHook(f"{sys.executable} -c \"{script}\" {{action}} {{target}}")
    assert hook(CMD).ok
    assert not ShellHook("false")(CMD).ok


def test_shell_hook_does_not_use_a_shell() -> None:
    evil = IsolationCommand(id="x", job="j", action="isolate_host", target="h1; exit 0",
                            reason="r", diagnosis_id="d", issued_at=1.0)
    out = ShellHook(f"{sys.executable} -c \"import sys; sys.exit(len(sys.argv))\" {{target}}")(evil)
    assert not out.ok and "exit 2" in out.message  # one argument, not a shell command


def test_command_env() -> None:
    env = command_env(CMD)
    assert env["AEGIS_CMD_ACTION"] == "isolate_gpu" and env["AEGIS_CMD_ISSUED_AT"] == "5.000"


@dataclass
class FakeConsumer:
    max_deliveries: int = 3
    dead_stream: str = "dead"
    counts: dict = field(default_factory=dict)
    acked: list = field(default_factory=list)
    buried: list = field(default_factory=list)

    def deliveries(self, entry_id: str) -> int:
        return self.counts.get(entry_id, 1)

    def ack(self, entry_id: str) -> int:
        self.acked.append(entry_id)
        return 1

    def bury(self, d: Delivery, reason: str, attempts: int = 0) -> None:
        self.buried.append((d.entry_id, reason))


@pytest.mark.parametrize(("handlers", "count", "acked", "buried"), [
    ({"*": lambda c: Outcome(True, "ok")}, 1, ["1-0"], []),
    ({"*": lambda c: Outcome(False, "no")}, 1, [], []),
    ({"*": lambda c: Outcome(False, "no")}, 4, [], ["1-0"]),
    ({"isolate_host": lambda c: Outcome(True, "ok")}, 1, [], ["1-0"]),
])
def test_remediator_routes(handlers: dict, count: int, acked: list, buried: list) -> None:
    fc = FakeConsumer(counts={"1-0": count})
    rem = Remediator(fc, handlers, io.StringIO())  # type: ignore[arg-type]
    rem.handle(Delivery("1-0", CMD))
    assert fc.acked == acked and [b[0] for b in fc.buried] == buried


def test_undecodable_entries_are_buried() -> None:
    fc = FakeConsumer()
    rem = Remediator(fc, {"*": lambda c: Outcome(True, "")}, io.StringIO())  # type: ignore[arg-type]
    rem.handle(Delivery("2-0", None, {}, "not JSON"))
    assert fc.buried == [("2-0", "undecodable entry: not JSON")]


def test_parse_args_defaults() -> None:
    a = parse_args(["--dry-run"], "aegis remediate")
    assert (a.group, a.cluster, a.min_idle_ms, a.max_deliveries) == ("remediation", "default",
                                                                     60_000, 5)
    assert orjson.loads(orjson.dumps(vars(a)))  # plain values only


def test_kubectl_missing_is_a_usage_error(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sinks.remediate.shutil.which", lambda name: None)
    assert main(["--kubectl", "--once"]) == 2
    assert "kubectl is not on PATH" in capsys.readouterr().err
