"""``aegis replay``: re-run the detectors over a job's recorded topics, in event time.

    aegis replay --job job-007 --from 2026-01-01T00:00:00Z --to 2026-01-01T01:00:00Z -o out.jsonl
    aegis replay job-007.aegis --policy candidate.toml --diff-json diff.json --report job.html

The records go through the same in-process :class:`~processors.engine.Engine` (the
:class:`~processors.pipeline.InputProcessor` per topic and the guard) as the live worker and
the outputs are written as JSONL (``sinks.jsonl``): diagnoses, commands, guard refusals and
dead letters. Nothing is sent to Redis or to the live topics.

From Kafka the job's range is first dumped (``processors.dump``) to a temporary recording
(``--keep-dump FILE`` keeps it); each topic keeps its own offset order, which is all the
detectors depend on (per-topic watermarks), so the diagnoses equal the live worker's.

By default open windows are NOT closed at the end (what the live worker had emitted by the
last record); ``--finish`` closes them, as ``aegis diagnose`` does.

Exit codes: 0 done; 1 bad input, or ``--fail-on-diff`` and the what-if differs; 2 usage or
policy errors; 3 Kafka unreachable.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from processors.diagnose import load_inventory
from processors.dump import dump_job, parse_time
from processors.engine import Engine
from processors.progress import Progress
from processors.replay_parallel import default_workers
from processors.settings import PipelineConfig
from schemas.errors import AegisError, ConfigError, ServiceUnavailable
from schemas.inventory import Inventory
from schemas.recording import RecordingEntry, entry_size, read_header, read_recording
from sinks.base import SinkItem
from sinks.delivery import FanoutSink


class ListSink:
    """Keeps every item in the order it was added (the engine's emission order)."""

    def __init__(self) -> None:
        self.items: list[SinkItem] = []

    def setup(self) -> None:
        return None

    def add(self, item: SinkItem) -> None:
        self.items.append(item)

    def flush(self) -> None:
        return None


TeeSink = FanoutSink  # the same items to several sinks


def select_entries(entries: Iterable[RecordingEntry], job: str | None = None,
                   t_from: float | None = None, t_to: float | None = None
                   ) -> Iterator[RecordingEntry]:
    """The entries of one job (message key) within ``[t_from, t_to)``, in file order."""
    for e in entries:
        if job is not None and e.key != job:
            continue
        if t_from is not None and e.ts < t_from:
            continue
        if t_to is not None and e.ts >= t_to:
            continue
        yield e


@dataclass
class ReplayRun:
    """The outputs of one or more engines fed the same records in one pass."""

    engines: list[Engine]
    outputs: list[list[SinkItem]]
    records: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    jobs: dict[str, int] = field(default_factory=dict)  # records per job key


def new_run(configs: list[PipelineConfig], inventory: Inventory | None,
            sinks: list[Any] | None = None) -> ReplayRun:
    """One fresh engine per config, each writing to a list (and to ``sinks[i]`` if given)."""
    lists = [ListSink() for _ in configs]
    engines = []
    for i, cfg in enumerate(configs):
        extra = sinks[i] if sinks is not None and i < len(sinks) and sinks[i] is not None else None
        engines.append(Engine(cfg, inventory, TeeSink(lists[i], extra) if extra else lists[i]))
    return ReplayRun(engines, [s.items for s in lists])


def replay_file(path: str, configs: list[PipelineConfig], inventory: Inventory | None,
                sinks: list[Any] | None = None, finish: bool = False, job: str | None = None,
                t_from: float | None = None, t_to: float | None = None, workers: int = 1,
                progress: Progress | None = None) -> ReplayRun:
    """Replay a recording's selected entries: in ``workers`` processes when above 1
    (processors.replay_parallel; same outputs; 0 or less: ``default_workers``), else in
    this one. The parallel path falls back to the serial one when a detector crashes on
    some record."""
    if workers <= 0:
        workers = default_workers(len(configs))
    if workers > 1:
        from processors.replay_parallel import Selection, replay_parallel

        run = new_run(configs, inventory, sinks)
        results = replay_parallel(Selection(path, job, t_from, t_to), configs, run.engines,
                                  inventory, finish, workers, progress)
        if results is not None:
            r0 = results[0]
            run.records, run.first_ts, run.last_ts, run.jobs = (r0.records, r0.first_ts,
                                                                r0.last_ts, r0.jobs)
            if progress is not None:
                progress.update(run.records)
            return run
        # a detector crashed on some record: only the serial pipeline handles that exactly
    _header, entries = read_recording(path)
    if progress is not None:
        entries = counting(entries, path, progress)
    return replay_entries(select_entries(entries, job, t_from, t_to), configs, inventory,
                          sinks, finish=finish)


def replay_entries(entries: Iterable[RecordingEntry], configs: list[PipelineConfig],
                   inventory: Inventory | None = None, sinks: list[Any] | None = None,
                   finish: bool = False, progress: Progress | None = None) -> ReplayRun:
    """Feed every entry to one engine per config, in the given order; pure given the input.

    ``sinks[i]`` (optional) also receives engine i's outputs (e.g. a JsonlSink). With
    ``finish`` the engines close their open windows at the end (``Engine.finish``).
    """
    run = new_run(configs, inventory, sinks)
    engines = run.engines
    n, first, last, jobs = 0, None, None, run.jobs
    feeds = [e.feed for e in engines]
    for entry in entries:
        topic, key, ts, value = entry
        for feed in feeds:
            feed(topic, value)
        n += 1
        jobs[key] = jobs.get(key, 0) + 1
        if first is None or ts < first:
            first = ts
        if last is None or ts > last:
            last = ts
        if progress is not None and n % 2000 == 0:
            progress.update(n)
    for eng in engines:
        if finish:
            eng.finish()
        else:
            eng.sink.flush()
    run.records, run.first_ts, run.last_ts = n, first, last
    if progress is not None:
        progress.update(n)
    return run


def expected_records(path: str, header: dict[str, Any]) -> int | None:
    """The record count a header states (dumps do), else None."""
    meta = header.get("meta", {})
    n = meta.get("records") if isinstance(meta, dict) else None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) else None


def counting(entries: Iterable[RecordingEntry], path: str, progress: Progress
             ) -> Iterator[RecordingEntry]:
    """Pass entries through, updating ``progress`` with the records read; without a known
    total (``progress.total``) it is estimated from the file size and the bytes read."""
    estimate = not progress.total
    size = max(1, os.path.getsize(path))
    seen_bytes, n = 0, 0
    for n, e in enumerate(entries, 1):
        if estimate:
            seen_bytes += entry_size(e.topic, e.key, e.value)
        if n % 2000 == 0:
            if estimate:
                progress.total = max(n, int(size * n / seen_bytes))
            progress.update(n)
        yield e
    if estimate:
        progress.total = n
    progress.update(n)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aegis replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", nargs="?", help="recording file (aegis dump / aegis simulate); "
                                           "omit to read --job from Kafka")
    p.add_argument("--job", help="job id (required for Kafka; filters a file)")
    p.add_argument("--from", dest="t_from", help="start of event time, epoch s or ISO-8601 UTC")
    p.add_argument("--to", dest="t_to", help="end of event time (exclusive)")
    p.add_argument("--brokers", default=os.environ.get("AEGIS_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
                   help="Kafka bootstrap servers (env AEGIS_KAFKA_BOOTSTRAP)")
    p.add_argument("--topic-prefix", default="", help="prefix of every topic name")
    p.add_argument("-o", "--out", default="-", help="JSONL output, replaced if it exists (default: stdout)")
    p.add_argument("--inventory", help="inventory JSON (default: the recording header's)")
    p.add_argument("--policy", help="what-if: also replay under this TOML policy and diff; "
                                    "-o and --report then show the candidate's outputs")
    p.add_argument("--base-policy", help="the what-if base policy (default: built-in defaults)")
    p.add_argument("--diff-json", help="write the what-if diff as JSON to this file")
    p.add_argument("--fail-on-diff", action="store_true", help="exit 1 if the what-if differs")
    p.add_argument("--report", help="write a self-contained HTML postmortem report")
    p.add_argument("--truth", help="simulator ground truth JSON to show faults in the report")
    p.add_argument("--finish", action="store_true",
                   help="close open windows at the end (default: as the live worker, do not)")
    p.add_argument("--no-refusals", action="store_true", help="leave guard refusals out of -o")
    p.add_argument("--keep-dump", help="Kafka: keep the dumped recording at this path")
    p.add_argument("--slack", type=float, default=0.0, help="Kafka: read this many s past --to")
    p.add_argument("--workers", type=int, default=0,
                   help="processes: one per input topic and policy, or per detector with 4+ "
                        "(default 0: one per CPU, at most one per task; 1: this process "
                        "only); the outputs are the same (docs/replay.md)")
    p.add_argument("--progress", action="store_true", help="progress bar even when not a TTY")
    return p


def _fail(msg: str, code: int) -> int:
    print(f"aegis replay: {msg}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.file is None and not (a.job and a.t_from and a.t_to):
        return _fail("give a recording FILE, or --job, --from and --to to read Kafka", 2)
    if (a.diff_json or a.fail_on_diff or a.base_policy) and not a.policy:
        return _fail("--diff-json, --fail-on-diff and --base-policy need --policy", 2)
    try:
        t_from = parse_time(a.t_from) if a.t_from else None
        t_to = parse_time(a.t_to) if a.t_to else None
        if t_from is not None and t_to is not None and t_to <= t_from:
            raise ConfigError(f"--to {a.t_to} is not after --from {a.t_from}: the range is empty")
        base_cfg = PipelineConfig.from_toml(a.base_policy)
        configs = [base_cfg] + ([PipelineConfig.from_toml(a.policy)] if a.policy else [])
    except ConfigError as e:
        return _fail(str(e), 2)
    enabled = True if a.progress else None
    with tempfile.TemporaryDirectory(prefix="aegis-replay-") as tmp:
        path = a.file
        if path is None:
            assert a.job is not None and t_from is not None and t_to is not None
            path = a.keep_dump or os.path.join(tmp, "dump.aegis")
            reading = Progress("read", enabled=enabled)
            try:
                d = dump_job(a.brokers, a.job, t_from, t_to, path, topic_prefix=a.topic_prefix,
                             progress=reading, slack_s=a.slack)
            except ConfigError as e:
                return _fail(str(e), 2)
            except ServiceUnavailable as e:
                return _fail(str(e), 3)
            reading.done()
            print(f"aegis replay: read {d.kept} records of job {a.job} from Kafka ({d.read} "
                  f"read of {d.expected} in the offset ranges of {len(d.ranges)} partitions)",
                  file=sys.stderr)
        elif not os.path.exists(path):
            return _fail(f"{path}: no such file", 1)
        elif os.path.isdir(path):
            return _fail(f"{path}: is a directory, not a recording", 1)
        return _replay_file(a, path, configs, t_from, t_to, enabled)


def _replay_file(a: argparse.Namespace, path: str, configs: list[PipelineConfig],
                 t_from: float | None, t_to: float | None, enabled: bool | None) -> int:
    from sinks.jsonl import JsonlSink

    try:
        header = read_header(path)
        inventory = load_inventory(a.inventory, header)
    except ConfigError as e:  # --inventory FILE is not one
        return _fail(str(e), 2)
    except AegisError as e:
        return _fail(str(e), 1)
    except OSError as e:
        return _fail(str(e), 2)
    progress = Progress("replay", expected_records(path, header), enabled=enabled)
    what = len(configs) - 1  # the engine whose outputs -o and --report show
    try:
        with JsonlSink(a.out, include_refusals=not a.no_refusals, append=False) as out:
            sinks: list[Any] = [None] * len(configs)
            sinks[what] = out
            run = replay_file(path, configs, inventory, sinks, a.finish, a.job, t_from, t_to,
                              a.workers, progress)
    except ConfigError as e:
        return _fail(str(e), 2)
    except AegisError as e:
        return _fail(str(e), 1)
    except OSError as e:
        return _fail(str(e), 2)
    progress.done()
    s = run.engines[what].stats
    print(f"aegis replay: {run.records} records, {s.diagnoses} diagnoses, {s.commands} commands, "
          f"{s.refusals} refusals, {s.dead_letters} dead letters"
          + s.ignored_note(),
          file=sys.stderr)
    code, diff = 0, None
    if a.policy:
        from processors.whatif import compare, diff_doc, diff_lines

        diff = compare(run.outputs[0], run.outputs[1])
        base_name = a.base_policy or "default policy"
        stream = sys.stderr if a.out == "-" else sys.stdout
        print("\n".join(diff_lines(diff, base_name, a.policy)), file=stream)
        if a.diff_json:
            with open(a.diff_json, "wb") as fh:
                fh.write(orjson.dumps(diff_doc(diff, base_name, a.policy),
                                      option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        if a.fail_on_diff and not diff.empty:
            code = 1
    if a.report:
        from processors.report import ReportInput, write_report

        try:
            truth = _load_truth(a.truth) if a.truth else None
            write_report(a.report, ReportInput(
                path=path, items=run.outputs[what], config=configs[what], job=a.job,
                t_from=t_from, t_to=t_to, truth=truth, diff=diff,
                title=f"aegis replay {os.path.basename(path)}", header=header.get("meta", {}),
                inventory=inventory,
                span=(run.first_ts, run.last_ts) if run.first_ts is not None
                and run.last_ts is not None else None))
        except (AegisError, OSError, ValueError) as e:
            return _fail(f"report: {e}", 1)
        print(f"aegis replay: report -> {a.report}", file=sys.stderr)
    return code


def _load_truth(path: str) -> list[dict[str, Any]]:
    """Faults from a simulator truth file (``{"faults": [...]}``) or a bare list."""
    with open(path, "rb") as fh:
        doc = orjson.loads(fh.read())
    faults = doc.get("faults", []) if isinstance(doc, dict) else doc
    if not isinstance(faults, list):
        raise ConfigError(f"{path}: no list of faults")
    return [f for f in faults if isinstance(f, dict)]


if __name__ == "__main__":
    sys.exit(main())
