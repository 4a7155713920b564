"""Profiling one scheduler node during the steady scenario, and the API's workers (and the
api-floor endpoint's) during the single creates of crud (and api-floor), with py-spy (a sampling profiler that
reads the process from outside; ``pip install -e '.[bench]'`` installs it; it needs ptrace
permission, which root has and a container gets with the SYS_PTRACE capability).

py-spy records collapsed stacks (``--format raw``); from them this module writes:
- ``<node>.collapsed``: the stacks themselves (input for flamegraph.pl, speedscope, inferno);
- ``<node>.svg``: a flame graph (root at the bottom, width = share of samples);
- ``<node>-top.txt``: what ``py-spy top`` shows, over the whole window: functions by own time
  and by total time, own time by library, and time by the innermost cronman frame.
"""

from __future__ import annotations

import hashlib
import html
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy_binary() -> str:
    here = Path(sys.executable).parent / "py-spy"
    found = str(here) if here.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("py-spy is not installed: pip install -e '.[bench]' (or pip install py-spy)")
    return found


@dataclass
class SpyRun:
    proc: subprocess.Popen[bytes]
    raw: Path
    out_dir: Path
    log: Path


def start_py_spy(pid: int, seconds: float, out_dir: Path, logs: Path, rate: int = 100) -> SpyRun:
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "py-spy.raw"
    log = logs / "py-spy.log"
    argv = [
        py_spy_binary(),
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, int(seconds))),
        "--rate",
        str(rate),
        "--format",
        "raw",
        "--threads",
        "--gil",
        "--output",
        str(raw),
    ]
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
    return SpyRun(proc, raw, out_dir, log)


def finish_py_spy(run: SpyRun, name: str, timeout: float = 60.0) -> dict[str, Any]:
    try:
        run.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        run.proc.kill()
        run.proc.wait(5)
    if not run.raw.exists():
        tail = run.log.read_text(errors="replace")[-1500:] if run.log.exists() else ""
        return {"error": f"py-spy wrote no profile (exit {run.proc.returncode}): {tail}"}
    stacks = read_collapsed(run.raw)
    collapsed = run.out_dir / f"{name}.collapsed"
    run.raw.replace(collapsed)
    summary = summarise(stacks)
    (run.out_dir / f"{name}-top.txt").write_text(render_top(summary, name))
    (run.out_dir / f"{name}.svg").write_text(flamegraph_svg(stacks, f"cronman scheduler node {name} (steady)"))
    summary["files"] = {
        "collapsed": str(collapsed),
        "svg": str(run.out_dir / f"{name}.svg"),
        "top": str(run.out_dir / f"{name}-top.txt"),
    }
    return summary


def worker_pids(pid: int, expected: int = 1, timeout: float = 10.0) -> list[int]:
    """A server's worker processes (gunicorn's children), once ``expected`` of them are up (a server
    answers as soon as its first worker does), or as many as there are after ``timeout`` seconds;
    the process itself when it has none."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        try:
            children = [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return [pid]
        if len(children) >= expected or time.monotonic() > deadline:
            return children or [pid]
        time.sleep(0.1)


def start_py_spy_many(pids: list[int], seconds: float, out_dir: Path, logs: Path, rate: int = 100) -> list[SpyRun]:
    """One py-spy per process (a server's workers), each into a directory of its own."""
    return [start_py_spy(pid, seconds, out_dir / f"py-spy-{pid}", logs, rate) for pid in pids]


def finish_py_spy_many(
    runs: list[SpyRun], out_dir: Path, name: str, title: str, timeout: float = 60.0
) -> dict[str, Any]:
    """The stacks of every process of ``runs`` together (a server's workers as one), written as
    :func:`finish_py_spy` writes one node's."""
    stacks: list[tuple[list[str], int]] = []
    errors: list[str] = []
    for run in runs:
        try:
            run.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            run.proc.kill()
            run.proc.wait(5)
        if run.raw.exists():
            stacks.extend(read_collapsed(run.raw))
            run.raw.unlink()
        else:
            errors.append(f"py-spy wrote no profile (exit {run.proc.returncode})")
        shutil.rmtree(run.out_dir, ignore_errors=True)
    if not stacks:
        return {"error": "; ".join(errors) or "no samples"}
    collapsed = out_dir / f"{name}.collapsed"
    collapsed.write_text("".join(f"{';'.join(frames)} {n}\n" for frames, n in stacks))
    summary = summarise(stacks)
    (out_dir / f"{name}-top.txt").write_text(render_top(summary, name))
    (out_dir / f"{name}.svg").write_text(flamegraph_svg(stacks, title))
    summary["files"] = {
        "collapsed": str(collapsed),
        "svg": str(out_dir / f"{name}.svg"),
        "top": str(out_dir / f"{name}-top.txt"),
    }
    summary["processes"] = len(runs)
    if errors:
        summary["errors"] = errors
    return summary


# ---------------------------------------------------------------------------------------------
# Reading and summarising collapsed stacks


def read_collapsed(path: Path) -> list[tuple[list[str], int]]:
    out: list[tuple[list[str], int]] = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        out.append((stack.split(";"), int(count)))
    return out


def short_file(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3."):
        i = path.find(marker)
        if i >= 0:
            rest = path[i + len(marker) :]
            return rest.split("/", 1)[1] if marker.startswith("/lib") and "/" in rest else rest
    for marker in ("/scheduler_node/", "/cronman/", "/api/"):
        i = path.find(marker)
        if i >= 0:
            return path[i + 1 :]
    return path


def frame_key(frame: str) -> tuple[str, str]:
    """(function, short file) of a py-spy frame "func (file:line)"."""
    m = _FRAME.match(frame)
    if not m:
        return frame, ""
    return m.group("func"), short_file(m.group("file"))


def area_of(file: str) -> str:
    """The library (or cronman package) a file belongs to."""
    if not file:
        return "(thread)"
    top = file.split("/", 1)[0]
    if top.endswith(".py"):
        top = top[:-3]
    return {"scheduler_node": "scheduler_node", "cronman": "cronman"}.get(top, top)


def _is_product(file: str) -> bool:
    return file.startswith(("scheduler_node/", "cronman/"))


def summarise(stacks: list[tuple[list[str], int]], top: int = 30) -> dict[str, Any]:
    own: Counter[tuple[str, str]] = Counter()
    total: Counter[tuple[str, str]] = Counter()
    areas: Counter[str] = Counter()
    product: Counter[tuple[str, str]] = Counter()
    threads: Counter[str] = Counter()
    samples = 0
    for frames, n in stacks:
        samples += n
        thread = frames[0] if frames and frames[0].startswith(("thread ", "process ")) else ""
        body = frames[1:] if thread else frames
        threads[thread.split(":", 1)[-1].strip() or "(main)"] += n
        keys = [frame_key(f) for f in body]
        if not keys:
            continue
        own[keys[-1]] += n
        areas[area_of(keys[-1][1])] += n
        for k in set(keys):
            total[k] += n
        inner = next((k for k in reversed(keys) if _is_product(k[1])), None)
        product[inner or ("(outside cronman code)", "")] += n

    def rows(c: Counter[Any]) -> list[dict[str, Any]]:
        return [
            {
                "function": k[0] if isinstance(k, tuple) else k,
                "file": k[1] if isinstance(k, tuple) else "",
                "samples": v,
                "pct": round(100.0 * v / samples, 1) if samples else 0.0,
            }
            for k, v in c.most_common(top)
        ]

    return {
        "samples": samples,
        "threads": dict(threads.most_common()),
        "top_own": rows(own),
        "top_total": rows(total),
        "own_by_library": [
            {"library": k, "samples": v, "pct": round(100.0 * v / samples, 1) if samples else 0.0}
            for k, v in areas.most_common(top)
        ],
        "by_cronman_frame": rows(product),
    }


def render_top(summary: dict[str, Any], name: str) -> str:
    lines = [f"py-spy samples of {name}: {summary['samples']} (the thread holding the GIL, idle excluded)", ""]
    lines.append("threads: " + ", ".join(f"{k} {v}" for k, v in summary["threads"].items()))

    def table(title: str, rows: list[dict[str, Any]], label: str = "function") -> None:
        lines.extend(["", title, f"{'%':>6}  {'samples':>8}  {label}"])
        for r in rows:
            where = f"  ({r['file']})" if r.get("file") else ""
            lines.append(f"{r['pct']:>6.1f}  {r['samples']:>8}  {r.get(label) or r.get('function')}{where}")

    table("own time (the function itself, not what it calls)", summary["top_own"])
    table("total time (the function and what it calls)", summary["top_total"])
    table("own time by library", summary["own_by_library"], label="library")
    table(
        "time by the innermost cronman frame (cronman code plus the library code it calls)",
        summary["by_cronman_frame"],
    )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# A small flame graph renderer (root at the bottom; hover a frame for its name and share)


def flamegraph_svg(stacks: list[tuple[list[str], int]], title: str, width: int = 1400) -> str:
    tree: dict[str, Any] = {"n": 0, "c": {}}
    for frames, n in stacks:
        node = tree
        node["n"] += n
        for f in frames:
            fn, file = frame_key(f)
            label = f"{fn} ({file})" if file else fn
            node = node["c"].setdefault(label, {"n": 0, "c": {}})
            node["n"] += n
    total = tree["n"] or 1
    span = width - 20
    boxes: list[tuple[str, float, int, float, int]] = []  # name, x, depth, width, samples

    def walk(children: dict[str, Any], x: float, depth: int) -> None:
        for name, child in sorted(children.items()):
            w = child["n"] / total * span
            if w >= 0.5:
                boxes.append((name, x, depth, w, child["n"]))
                walk(child["c"], x, depth + 1)
            x += w

    walk(tree["c"], 10.0, 0)
    row_h = 16
    depth_max = max((b[2] for b in boxes), default=0)
    height = (depth_max + 1) * row_h + 50
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="monospace" font-size="11">',
        '<rect width="100%" height="100%" fill="#fdfdf6"/>',
        f'<text x="10" y="20" font-size="14">{html.escape(title)}: {total} samples</text>',
    ]
    for name, x, depth, w, n in boxes:
        y = height - 10 - (depth + 1) * row_h
        digest = hashlib.md5(name.split(" (")[0].encode(), usedforsecurity=False).digest()
        color = f"rgb({205 + digest[0] % 50},{80 + digest[1] % 130},{digest[2] % 60})"
        fit = int((w - 4) / 6.6)
        label = name if len(name) <= fit else (name[: fit - 2] + ".." if fit > 3 else "")
        tip = html.escape(f"{name}: {n} samples, {100.0 * n / total:.1f}%")
        parts.append(
            f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 1}" '
            f'fill="{color}"/><text x="{x + 2:.1f}" y="{y + 12}">{html.escape(label)}</text></g>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
