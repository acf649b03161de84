"""What every `seal bench` part shares: outside-load probe, statistics over
repeats, machine description, target checks, report writing and plots.

These machines are shared and noisy, so every part records how busy the rest
of the machine was while it ran (load averages before and after, and the CPU
time other processes took: /proc/stat minus our own process tree, sampled), and
reports repeated measurements as median with min and max, never a single run.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._report import to_json
from weights.precision import BF16_CPU_FLAGS, read_cpu_flags, resolve_dtype

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------ outside load
def _proc_stat_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from the aggregate cpu line."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already inside user/nice]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    return total - idle, total


def _process_cpu() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, own CPU jiffies = utime + stime) of every live process."""
    stats: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                rest = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # after "pid (comm)": state ppid ... utime(11) stime(12)
        stats[int(name)] = (int(rest[1]), int(rest[11]) + int(rest[12]))
    return stats


def _tree_cpu(root: int, stats: dict[int, tuple[int, int]] | None = None) -> dict[int, int]:
    """Own CPU jiffies of ``root`` and every live descendant, by pid (Ray's
    gcs, raylet and workers are descendants of the driver when it starts Ray
    itself)."""
    stats = _process_cpu() if stats is None else stats
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            tree[pid] = stats[pid][1]
        todo.extend(children.get(pid, []))
    return tree


class LoadProbe:
    """Outside CPU load over a measurement: ``with LoadProbe() as probe: ...; probe.result``.

    Our share is sampled every ``interval_s`` by a thread, per process that was
    ever in our tree: its last sample minus its first (or 0 if it was born
    during the probe). Sampled, not read from the parents' cutime, because
    Ray workers outlive the raylet that started them when a session shuts down
    and are reparented, so their time never reaches our tree's cutime (a first
    version did that and called 77% of the env benchmark's own Ray workers
    "outside load"). A process that exits between two samples loses at most
    one interval of its time to the outside figure."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s

    def _sample(self) -> None:
        stats = _process_cpu()
        for pid, jiffies in _tree_cpu(os.getpid(), stats).items():
            self._first.setdefault(pid, 0 if self._started else jiffies)
        for pid in self._first:  # ours once, ours while it lives (also after reparenting)
            if pid in stats:
                self._last[pid] = stats[pid][1]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> LoadProbe:
        self._first: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._started = False
        self._sample()  # baseline of what already runs
        self._started = True
        self.load_before = os.getloadavg()
        self.busy0, self.total0 = _proc_stat_jiffies()
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        busy1, total1 = _proc_stat_jiffies()
        d_total = max(total1 - self.total0, 1)
        ours = sum(max(0, self._last.get(pid, first) - first) for pid, first in self._first.items())
        others = max(0, (busy1 - self.busy0) - ours)
        self.result = {
            "loadavg_before": [round(x, 2) for x in self.load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            # share of the machine's total CPU capacity used by processes outside this benchmark
            "other_processes_cpu_share": round(min(1.0, others / d_total), 3),
            "ours_cpu_share": round(min(1.0, ours / d_total), 3),
            "our_processes_seen": len(self._first),
            "wall_s": round(time.perf_counter() - self.t0, 2),
            "cpus": os.cpu_count(),
        }


# ------------------------------------------------------------ statistics
def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median and spread of repeated measurements (None values are skipped)."""
    xs = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    mid = len(xs) // 2
    median = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    return {"median": median, "min": xs[0], "max": xs[-1], "n": len(xs)}


def median(values: Sequence[float]) -> float | None:
    return summary(values)["median"]


def target(name: str, measured: float | None, op: str, bound: float) -> dict[str, Any]:
    """A target from the issue, stated against the measured figure."""
    met = (
        None
        if measured is None
        else (measured >= bound if op == ">=" else measured < bound if op == "<" else measured <= bound)
    )
    return {"name": name, "target": f"{op} {bound:g}", "measured": measured, "met": met}


# ------------------------------------------------------------ machine
def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((l.split(":", 1)[1].strip() for l in fh if l.startswith("model name")), "")
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""

    # The flags that decide dtype auto (and the speed of bf16) go beside every figure.
    flags = read_cpu_flags()
    return {
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "cpu_flags": sorted(flags & {*BF16_CPU_FLAGS, "amx_tile", "amx_int8", "avx512f", "avx512_vnni", "avx2"}),
        "dtype_auto": resolve_dtype("auto", "cpu", flags)[0],
        "memory_gb": round(mem_gb, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit or "unknown",
    }


# ------------------------------------------------------------ output
def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_json(out_dir: Path, part: str, report: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench_{part.replace('-', '_')}.json"
    path.write_text(to_json(report) + "\n")
    return path


def figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    """A matplotlib figure on the Agg canvas (no display; imported lazily: it
    costs a second and only the plotting step needs it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, out_dir: Path, part: str, title: str) -> Path:
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = out_dir / f"bench_{part.replace('-', '_')}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def error_bars(stats: Sequence[dict[str, Any]]) -> tuple[list[float], list[list[float]]]:
    """Medians and [below, above] distances to min and max, for plt.bar(yerr=...)."""
    med = [s["median"] or 0.0 for s in stats]
    low = [m - (s["min"] if s["min"] is not None else m) for m, s in zip(med, stats)]
    high = [(s["max"] if s["max"] is not None else m) - m for m, s in zip(med, stats)]
    return med, [low, high]


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e5 else f"{value:.3g}"
    return str(value)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(h) for h in header]] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
