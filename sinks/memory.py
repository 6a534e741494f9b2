"""In-memory sink for the in-process engine (``aegis demo``/``diagnose``) and unit tests.

Same ``setup``/``add``/``flush`` contract as the Redis and Kafka sinks (practices §9): ``add``
buffers, ``flush`` moves the buffer into the delivered lists. Commands are idempotent by id,
as in the Redis queue: a command id delivered once is never delivered again.
"""

from __future__ import annotations

from schemas.records import DeadLetter, Diagnosis, IsolationCommand
from sinks.base import GuardRefusal, SinkItem


class MemorySink:
    """Delivered outputs as lists: ``diagnoses``, ``commands``, ``refusals``, ``dead_letters``."""

    def __init__(self) -> None:
        self.diagnoses: list[Diagnosis] = []
        self.commands: list[IsolationCommand] = []
        self.refusals: list[GuardRefusal] = []
        self.dead_letters: list[DeadLetter] = []
        self.pending: list[SinkItem] = []
        self.duplicates = 0  # commands dropped because their id was already delivered
        self._command_ids: set[str] = set()
        self._diagnosis_ids: set[str] = set()

    def setup(self) -> None:
        return None

    def add(self, item: SinkItem) -> None:
        if not isinstance(item, Diagnosis | IsolationCommand | GuardRefusal | DeadLetter):
            raise TypeError(f"MemorySink.add: {type(item).__name__} is not a sink item")
        self.pending.append(item)

    def add_dead_letter(self, dead: DeadLetter) -> None:
        self.add(dead)

    def flush(self) -> None:
        items, self.pending = self.pending, []
        for item in items:
            if isinstance(item, IsolationCommand):
                if item.id in self._command_ids:
                    self.duplicates += 1
                    continue
                self._command_ids.add(item.id)
                self.commands.append(item)
            elif isinstance(item, Diagnosis):
                if item.id in self._diagnosis_ids:
                    continue
                self._diagnosis_ids.add(item.id)
                self.diagnoses.append(item)
            elif isinstance(item, GuardRefusal):
                self.refusals.append(item)
            else:
                self.dead_letters.append(item)

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]
