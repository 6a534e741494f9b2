"""aegis-stream: ccl_hooks, the NCCL profiler plugin behind Aegis Phase 2 (§4.2, §5.2).

The plugin is C (``src/``, built by ``make -C ccl_hooks``); its datagrams are defined in
:mod:`schemas.ccl_snapshot` and read by :mod:`producers.agent.ccl_receiver`. See
docs/ccl-hooks.md.
"""

from __future__ import annotations

from pathlib import Path

LIBRARY = Path(__file__).resolve().parent / "build" / "libaegis_ccl_profiler.so"


def library_path() -> Path:
    """Path of the built plugin, for NCCL_PROFILER_PLUGIN. Raises FileNotFoundError with the
    build command when it has not been built."""
    if not LIBRARY.is_file():
        raise FileNotFoundError(f"{LIBRARY} not built: run `make -C {LIBRARY.parent.parent}`")
    return LIBRARY
