"""The in-process engine: the worker's pipeline without services.

``aegis demo``, ``aegis diagnose FILE`` and replay feed recorded messages through the same
:class:`~processors.pipeline.InputProcessor` per topic and the same guard as the Faust
worker, and write to in-memory or JSONL sinks. Given the same records it produces the
same diagnoses and commands, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from processors.pipeline import INPUT_KINDS, InputProcessor, Processed, input_kind
from processors.settings import PipelineConfig
from schemas.inventory import Inventory
from schemas.records import Diagnosis
from sinks.base import Sink
from sinks.guard import Guard
from sinks.memory import MemorySink


@dataclass
class EngineStats:
    messages: int = 0
    ignored: int = 0  # messages of topics that are not inputs (e.g. diagnoses in a dump)
    dead_letters: int = 0
    diagnoses: int = 0
    commands: int = 0
    refusals: int = 0
    rejections: dict[str, int] = field(default_factory=dict)

    def ignored_note(self) -> str:
        """The summary line's mention of entries no detector reads ("" when there were none)."""
        return f", {self.ignored} of topics that are no input (ignored)" if self.ignored else ""


class Engine:
    """Detectors → guard → sink, in one process, in the order the messages are fed."""

    def __init__(self, config: PipelineConfig | None = None, inventory: Inventory | None = None,
                 sink: Sink | None = None) -> None:
        self.config = config or PipelineConfig()
        self.inventory = inventory
        self.sink: Any = sink if sink is not None else MemorySink()
        self.inputs = {k: InputProcessor(k, self.config, inventory) for k in INPUT_KINDS}
        job_sizes = {j: len(hs) for j, hs in (inventory.jobs.items() if inventory else [])}
        self.guard = Guard(self.config.section("guard"), job_hosts=lambda j: job_sizes.get(j, 0))
        self.stats = EngineStats()
        self._offsets: dict[str, int] = {}

    def feed(self, topic: str, value: bytes, partition: int = 0, offset: int | None = None) -> list[Diagnosis]:
        """Process one message of ``topic``; returns the diagnoses it produced."""
        self.stats.messages += 1
        kind = input_kind(topic)
        if not kind:
            self.stats.ignored += 1
            return []
        if offset is None:
            offset = self._offsets.get(topic, -1) + 1
        self._offsets[topic] = offset
        res = self.inputs[kind].handle(value, topic=topic, partition=partition, offset=offset)
        self.take(res)
        return res.diagnoses

    def take(self, res: Processed) -> None:
        """Route what one input message produced: its dead letter, rejection counts and
        diagnoses (each through the guard). Parallel replay calls this with results made
        in other processes, in the order the messages were read."""
        if res.dead_letter is not None:
            self.stats.dead_letters += 1
            self.sink.add(res.dead_letter)
        for rj in res.rejections:
            self.stats.rejections[rj.reason] = self.stats.rejections.get(rj.reason, 0) + 1
        for d in res.diagnoses:
            self.route(d)

    def route(self, d: Diagnosis) -> None:
        """One diagnosis to the sink, then through the guard (its commands and refusals)."""
        self.stats.diagnoses += 1
        self.sink.add(d)
        decision = self.guard.decide(d)
        for extra in decision.diagnoses:
            self.stats.diagnoses += 1
            self.sink.add(extra)
        for cmd in decision.commands:
            self.stats.commands += 1
            self.sink.add(cmd)
        for refusal in decision.refusals:
            self.stats.refusals += 1
            self.sink.add(refusal)

    def finish(self) -> None:
        """End of input: let detectors that keep open windows close them (``flush()``),
        route what that produces, and flush the sink. Only for finite inputs (files);
        the live worker never does this."""
        for proc in self.inputs.values():
            for job in proc.jobs():
                for d in proc.flush(job):
                    self.route(d)
        self.sink.flush()

    def run(self, entries: Iterable[tuple[str, Any, float, bytes]],
            progress: Callable[[int], None] | None = None, finish: bool = True) -> EngineStats:
        """Feed ``(topic, key, ts, value)`` entries (a recording), then :meth:`finish`
        (or only flush the sink when ``finish`` is False, as the live worker would be)."""
        for i, (topic, _key, _ts, value) in enumerate(entries):
            self.feed(topic, value)
            if progress is not None and i % 5000 == 0:
                progress(i)
        if finish:
            self.finish()
        else:
            self.sink.flush()
        return self.stats
