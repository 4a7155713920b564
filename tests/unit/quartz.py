"""Quartz's own CronExpression (Debian's libquartz2-java), driven by tests/unit/java/QuartzNext.java:
one JVM answers every expression of a test, a batch of lines at a time.

When Java or the package is missing, the tests install them when they run as root with apt-get
(as CI does); otherwise they fail under CI and are skipped elsewhere, with the command to run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

JAR = Path("/usr/share/java/quartz2.jar")
SOURCE = Path(__file__).parent / "java" / "QuartzNext.java"
INSTALL = "apt-get update && apt-get install -y default-jdk-headless libquartz2-java"


def _present() -> bool:
    return JAR.exists() and shutil.which("javac") is not None and shutil.which("java") is not None


def ensure_quartz() -> None:
    if _present():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        done = subprocess.run(
            ["bash", "-c", INSTALL],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        if _present():
            return
        pytest.fail(f"installing Java and Quartz failed ({INSTALL}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    message = f"the Quartz differential test needs Java and Debian's Quartz; run as root: {INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class Quartz:
    """One JVM running QuartzNext; ``next_times`` answers a batch of questions in one exchange."""

    def __init__(self, workdir: Path) -> None:
        ensure_quartz()
        subprocess.run(["javac", "-nowarn", "-cp", str(JAR), "-d", str(workdir), str(SOURCE)], check=True, timeout=120)
        self._proc = subprocess.Popen(
            # one compiler thread, the serial collector: the JVM stays on about one core of the two
            ["java", "-XX:TieredStopAtLevel=1", "-XX:CICompilerCount=1", "-XX:+UseSerialGC", "-Xmx256m"]
            + ["-cp", f"{JAR}:{workdir}", "QuartzNext"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        assert self._proc.stdout is not None
        head = self._proc.stdout.readline().split()
        self.max_year = int(head[1])  # Quartz finds nothing past this year

    def next_times(self, questions: list[tuple[str, str, int, int]]) -> list[list[int] | str]:
        """For each (expression, zone, after ms, count): the next fire times (ms), or Quartz's error."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write("".join(f"{e}\t{z}\t{a}\t{n}\n" for e, z, a, n in questions) + "\n")
        self._proc.stdin.flush()
        out: list[list[int] | str] = []
        for _ in questions:
            line = self._proc.stdout.readline().rstrip("\n")
            if not line:
                raise RuntimeError("Quartz stopped answering")
            out.append(line[4:] if line.startswith("err ") else [int(t) for t in line.split()[1:]])
        return out

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
