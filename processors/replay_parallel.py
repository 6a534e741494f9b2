"""Parallel replay: one process per (policy, detector), merged back in read order.

Each detector sees only its own topic's records (processors.pipeline), and within a record
the detectors of one topic run in a fixed order, each on its own state. So a replay splits
into independent tasks, one per policy and detector (logs: tree; telemetry: zscore; ccl:
alignment, tdn). Each task reads the recording, runs its detector over its topic's records
and returns what each record produced, tagged with the record's position in the file. The
parent then feeds those results in (position, detector) order through each policy's guard
and sinks (``Engine.take`` / ``Engine.route``), which is the order the serial replay
(``processors.replay.replay_entries``) routes them in: the outputs are the same, byte for byte
(tests/unit/test_replay_parallel.py).

One case cannot be split: when a detector crashes on a record, the serial pipeline turns the
whole record into one dead letter, dropping what the other detectors of that topic made of
it and never showing it to the ones after. If any task reports a crash, :func:`replay_parallel`
returns None and the caller replays serially.

Each task reads and decodes its topic's records itself (decoding is not shared), so the
split costs some CPU in total and pays off with two or more cores.
"""

from __future__ import annotations

import heapq
import multiprocessing
import os
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from processors.engine import Engine
from processors.pipeline import INPUT_KINDS, InputProcessor, Processed, detector_names, input_kind
from processors.progress import Progress
from processors.settings import PipelineConfig
from schemas.inventory import Inventory
from schemas.recording import entry_size, read_recording
from schemas.records import DeadLetter, Diagnosis

_PROGRESS_EVERY = 2000
_progress_slots: Any = None  # shared [records read, bytes read] per task, set in each worker


@dataclass(frozen=True)
class Task:
    """One detector of one input kind under one policy."""

    policy: int  # index into the configs
    kind: str
    detectors: tuple[str, ...]  # in the order a record passes through them
    order: int  # the first detector's place among its kind's (0 reports dead letters)
    slot: int  # progress counter index


@dataclass
class TaskResult:
    task: Task
    # (position in the selected entries, diagnoses, decode dead letter): only non-empty ones
    events: list[tuple[int, list[Diagnosis], DeadLetter | None]] = field(default_factory=list)
    rejections: dict[str, int] = field(default_factory=dict)
    flushed: dict[str, list[Diagnosis]] = field(default_factory=dict)  # job -> finish() output
    crashed: str = ""  # the first detector crash, if any
    records: int = 0  # every selected entry, whatever its topic
    # the totals of the selection: tallied by the first task only (slot 0)
    ignored: int = 0  # entries of topics that are not inputs
    first_ts: float | None = None
    last_ts: float | None = None
    jobs: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0  # the task's process CPU time (for benchmarks)


@dataclass(frozen=True)
class Selection:
    """What to read: the recording and the entry filter of ``replay.select_entries``."""

    path: str
    job: str | None = None
    t_from: float | None = None
    t_to: float | None = None


# the kinds whose detectors each cost about as much as decoding: worth a process apiece
# (telemetry's liveness check is a dict update per batch, so it rides with the Z-score)
_SPLIT_KINDS = ("ccl",)


def tasks_for(policies: int, by_detector: bool = True) -> list[Task]:
    """The tasks in routing order: one per (policy, kind), and with ``by_detector`` one per
    detector of the kinds in ``_SPLIT_KINDS``; a task decodes each of its records once."""
    out: list[Task] = []
    for p in range(policies):
        for kind in INPUT_KINDS:
            names = detector_names(kind)
            split = by_detector and kind in _SPLIT_KINDS
            groups = [(i, (n,)) for i, n in enumerate(names)] if split else [(0, tuple(names))]
            for order, dets in groups:
                out.append(Task(p, kind, dets, order, len(out)))
    return out


def default_workers(policies: int = 1) -> int:
    """Processes to use: one per task, at most one per CPU this process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, len(tasks_for(policies, by_detector=cpus >= 4))))


def _init(slots: Any) -> None:
    global _progress_slots
    _progress_slots = slots


def _selected(sel: Selection) -> Iterator[tuple[str, str, float, bytes]]:
    from processors.replay import select_entries

    _header, entries = read_recording(sel.path)
    return select_entries(entries, sel.job, sel.t_from, sel.t_to)


def run_task(task: Task, sel: Selection, config: PipelineConfig, inventory: Inventory | None,
             finish: bool) -> TaskResult:
    """One detector over its topic's records of the selection (runs in a worker process)."""
    res = TaskResult(task)
    cpu0 = time.process_time()
    proc = InputProcessor(task.kind, config, inventory, only=task.detectors)
    kinds: dict[str, str | None] = {}
    offsets: dict[str, int] = {}
    events, rejections, jobs = res.events, res.rejections, res.jobs
    first: float | None = None
    last: float | None = None
    pos, seen_bytes = -1, 0
    tally = task.slot == 0
    for pos, (topic, key, ts, value) in enumerate(_selected(sel)):
        kind = kinds.get(topic, "?")
        if kind == "?":
            kind = kinds[topic] = input_kind(topic)
        if tally:
            seen_bytes += entry_size(topic, key, value)
            jobs[key] = jobs.get(key, 0) + 1
            if first is None or ts < first:
                first = ts
            if last is None or ts > last:
                last = ts
            res.ignored += kind is None
        if _progress_slots is not None and pos % _PROGRESS_EVERY == 0:
            _progress_slots[2 * task.slot], _progress_slots[2 * task.slot + 1] = pos, seen_bytes
        if kind != task.kind:
            continue
        offset = offsets[topic] = offsets.get(topic, -1) + 1
        out = proc.handle(value, topic=topic, partition=0, offset=offset)
        dl = out.dead_letter
        if dl is not None and dl.stage == "process":
            res.crashed = res.crashed or dl.error
            continue
        for rj in out.rejections:
            if rj.detector == task.kind and task.order != 0:
                continue  # the topic's own (job clock) refusal: every task of it makes one
            rejections[rj.reason] = rejections.get(rj.reason, 0) + 1
        if dl is not None and task.order == 0:
            events.append((pos, [], dl))
        elif out.diagnoses:
            events.append((pos, out.diagnoses, None))
    res.records, res.first_ts, res.last_ts = pos + 1, first, last
    if _progress_slots is not None:
        _progress_slots[2 * task.slot] = res.records
    if finish:
        res.flushed = {job: proc.flush(job) for job in proc.jobs()}
    res.cpu_s = time.process_time() - cpu0
    return res


def _route(engine: Engine, results: list[TaskResult], totals: TaskResult, finish: bool) -> None:
    """Feed one policy's task results to its engine in the serial replay's order
    (``totals``: the task that tallied the selection)."""
    streams = [[(pos, r.task.slot, diags, dl) for pos, diags, dl in r.events] for r in results]
    for _pos, _slot, diags, dl in heapq.merge(*streams, key=lambda e: (e[0], e[1])):
        engine.take(Processed(diagnoses=diags, dead_letter=dl))
    stats = engine.stats
    stats.messages, stats.ignored = totals.records, totals.ignored
    for r in results:
        for reason, n in r.rejections.items():
            stats.rejections[reason] = stats.rejections.get(reason, 0) + n
    if finish:  # Engine.finish: kinds in order, then jobs sorted, then detectors in order
        for kind in INPUT_KINDS:
            mine = [r for r in results if r.task.kind == kind]
            for job in sorted({j for r in mine for j in r.flushed}):
                for r in mine:
                    for d in r.flushed.get(job, []):
                        engine.route(d)
    engine.sink.flush()


# rough CPU seconds per 1,000-host event-second (bench/replay.py): longest first (LPT)
_COST = {"tdn": 4.1, "zscore": 3.6, "alignment": 2.9, "tree": 0.6, "liveness": 0.1}


def replay_parallel(sel: Selection, configs: list[PipelineConfig], engines: list[Engine],
                    inventory: Inventory | None, finish: bool = False,
                    workers: int | None = None, progress: Progress | None = None,
                    by_detector: bool | None = None) -> list[TaskResult] | None:
    """Run every task in ``workers`` processes and route the results into ``engines``
    (one per config, fresh). Returns the results, or None (nothing routed) when a detector
    crashed somewhere: replay serially then.

    ``by_detector`` (default: with 4 or more workers) gives each CCL detector its own
    process, which then decodes the CCL records again: faster only with spare CPUs.
    """
    workers = workers or default_workers(len(configs))
    if by_detector is None:
        by_detector = workers >= 4
    tasks = tasks_for(len(configs), by_detector)
    # fork: no re-import of the caller's main module (spawn would need a __main__ guard in
    # every script); the children only read the file and return results, then _exit
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    slots = ctx.Array("q", 2 * len(tasks), lock=False)
    size = max(1, os.path.getsize(sel.path))
    estimate = progress is not None and not progress.total
    order = sorted(tasks, key=lambda t: (-sum(_COST.get(d, 1.0) for d in t.detectors), t.slot))
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx,
                             initializer=_init, initargs=(slots,)) as pool:
        futures: list[Future[TaskResult]] = [
            pool.submit(run_task, t, sel, configs[t.policy], inventory, finish) for t in order]
        pending: set[Future[TaskResult]] = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_EXCEPTION)
            if progress is not None:
                n = min(slots[2 * t.slot] for t in tasks)
                if estimate and slots[1]:  # records in the file, from the first task's bytes
                    progress.total = max(n, int(size * slots[0] / slots[1]))
                progress.update(n)
            for f in done:
                exc = f.exception()
                if exc is not None:
                    for other in pending:
                        other.cancel()
                    raise exc
        results = sorted((f.result() for f in futures), key=lambda r: r.task.slot)
    if estimate and progress is not None:
        progress.total = results[0].records  # the count is known now
    if any(r.crashed for r in results):
        return None
    for p, engine in enumerate(engines):
        _route(engine, [r for r in results if r.task.policy == p], results[0], finish)
    return results
