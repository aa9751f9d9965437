"""The export's own peak memory: how far the process's resident memory rose above where it was
when ``export()`` started (the user's model already built, torch already imported).

A process's peak RSS counts the interpreter, torch (~0.4 GiB) and the model itself, which say
nothing about what exporting costs. On Linux the kernel's high-water mark (``VmHWM``) can be
reset (``/proc/self/clear_refs``, value 5), so the peak of one stretch of work is read exactly,
every short-lived copy included. Where the mark cannot be reset the measurement says so in its
``method`` (``exact=False``): with /proc, the process's peak over the resident memory at the start
(an upper bound: the peak may predate the export); without it, ``getrusage``'s process peak after
over before (a lower bound: only what the export added to an earlier peak).

Resetting the mark lowers what ``VmHWM`` and ``getrusage`` report for the process afterwards;
``process_peak()`` keeps the highest value seen before any reset, for a caller that wants the
process's peak as well. Threads share one address space, so memory another thread takes while an
export runs counts too. Stages nest: each reset first folds the mark into every open measurement.
"""
from __future__ import annotations

import re
import resource
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_FIELD = re.compile(r"^(VmHWM|VmRSS):\s+(\d+)\s+kB", re.MULTILINE)
_RUSAGE_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux


def _status() -> Dict[str, int]:
    """``VmHWM`` and ``VmRSS`` of this process in bytes, or {} where /proc is not there."""
    try:
        with open(_STATUS) as fh:
            return {k: int(v) * 1024 for k, v in _FIELD.findall(fh.read())}
    except OSError:
        return {}


def _rusage_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _RUSAGE_UNIT


class _Mark:
    """The process's high-water mark and whether it can be reset here (decided once, on first use)."""

    resettable: Optional[bool] = None
    highest = 0  # the process's peak before the last reset

    @classmethod
    def now(cls) -> int:
        status = _status()
        return status.get("VmHWM") or _rusage_peak()

    @classmethod
    def reset(cls, open_measures: List["PeakMemory"]) -> bool:
        """Fold the current mark into every open measurement and the process's peak, then reset it."""
        mark = cls.now()
        cls.highest = max(cls.highest, mark)
        for measure in open_measures:
            measure._fold(mark)
        if cls.resettable is False:
            return False
        try:
            with open(_CLEAR_REFS, "w") as fh:
                fh.write("5")
            cls.resettable = "VmHWM" in _status()
        except OSError:
            cls.resettable = False
        return cls.resettable


_open: List["PeakMemory"] = []


def resident() -> int:
    """This process's resident memory now (0 where it cannot be read)."""
    status = _status()
    if "VmRSS" in status:
        return status["VmRSS"]
    return 0


def process_peak() -> int:
    """The process's peak RSS since it started, resets by ``PeakMemory`` included."""
    return max(_Mark.highest, _Mark.now(), _rusage_peak())


@dataclass
class Peak:
    """One measured stretch: its peak above the resident memory at its start."""

    above_start: int  # bytes
    start: int  # resident bytes when it began (without /proc: the process's peak then)
    exact: bool  # False: the mark could not be reset here (``method`` says what was measured instead)
    stages: Dict[str, int]  # each stage's own peak above the start of the whole measurement, bytes

    @property
    def method(self) -> str:
        if self.exact:
            return "VmHWM reset"
        return "process peak over the start (upper bound)" if resident() else \
            "getrusage peak after over before (lower bound)"

    def to_dict(self, weights: int) -> dict:
        return {"bytes": self.above_start, "weights_bytes": weights,
                "over_weights": round(self.above_start / weights, 2) if weights else None,
                "start_bytes": self.start, "method": self.method,
                "stages": dict(self.stages)}


class PeakMemory:
    """``with PeakMemory() as m: ...`` then ``m.result()``; ``m.stage(name)`` starts a named stage
    (so the peak can be traced to the stage that set it)."""

    def __init__(self):
        self._start = 0
        self._seen = 0  # highest mark folded in from resets while open
        self._stage: Optional[str] = None
        self._stage_seen = 0
        self._stages: Dict[str, int] = {}
        self._exact = False
        self._result: Optional[Peak] = None

    def __enter__(self) -> "PeakMemory":
        self._start = resident() or _rusage_peak()
        self._exact = _Mark.reset(_open)
        self._seen = 0 if self._exact else _Mark.now()
        _open.append(self)
        return self

    def _fold(self, mark: int) -> None:
        self._seen = max(self._seen, mark)
        self._stage_seen = max(self._stage_seen, mark)

    def stage(self, name: str) -> None:
        """Close the current stage (its peak recorded) and open ``name``."""
        self._close_stage()
        self._stage, self._stage_seen = name, 0
        if self._exact:
            _Mark.reset(_open)
            self._stage_seen = 0

    def _close_stage(self) -> None:
        if self._stage is None:
            return
        peak = max(self._stage_seen, _Mark.now()) - self._start
        self._stages[self._stage] = max(self._stages.get(self._stage, 0), peak)

    def __exit__(self, *exc) -> None:
        self._close_stage()
        peak = max(self._seen, _Mark.now())
        _open.remove(self)
        _Mark.highest = max(_Mark.highest, peak)
        self._result = Peak(max(0, peak - self._start), self._start, self._exact,
                            {k: max(0, v) for k, v in self._stages.items()})

    def result(self) -> Peak:
        if self._result is None:
            raise RuntimeError("the measurement is still open")
        return self._result

    def telling(self, progress: Optional[Callable[[str], None]]) -> Callable[[str], None]:
        """A ``progress`` callback that starts a stage here, then tells ``progress``."""
        def tell(stage: str) -> None:
            self.stage(stage)
            if progress is not None:
                progress(stage)
        return tell
