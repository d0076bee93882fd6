"""The benchmark's results: a section's table, goals and texts (`Section`), Markdown tables, the
details of the machine the figures were measured on, and RESULTS.md, rendered and written
atomically."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
from spmd_compare import REPO

RESULTS = Path(__file__).resolve().with_name("RESULTS.md")
MiB = 1 << 20


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, padded so that it also reads as plain text."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def goal(met: bool) -> str:
    return "met" if met else "NOT met"


def mib(n: float) -> str:
    return f"{n / MiB:,.0f}"


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    table: str
    meaning: str  # what each number means, for RESULTS.md
    goals: tuple[tuple[str, bool], ...] = ()  # (what, met)
    notes: tuple[str, ...] = ()  # lines printed under the table
    files: tuple[tuple[Path, str], ...] = ()  # other files the run writes (path, text)


def _first_line(path: str, prefix: str) -> str:
    """The rest of the first line of `path` that starts with `prefix`, or '?'."""
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if line.startswith(prefix):
                    return line.split(":", 1)[-1].split("=", 1)[-1].strip().strip('"')
    except OSError:
        pass
    return "?"


def _git(*args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else "?"


# A 1-minute load average above this at the start means other work shared the cores.
QUIET_LOAD = 0.5


def load_average() -> str:
    """Other work on the machine skews every timing; RESULTS.md records how much there was."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def busy_warning(load: float) -> list[str]:
    """A warning for the top of the goals when the machine was busy as the run began (`load`,
    the 1-minute load average): the ratios pair each side's runs in turn, but the seconds
    measured alone (GPT-3's compile, the plan searches) read high, by up to twice on two
    cores with a test suite beside them."""
    if load <= QUIET_LOAD:
        return []
    return [
        f"- WARNING: the machine was busy at the start (1-minute load {load:.2f} > "
        f"{QUIET_LOAD}): the seconds measured alone (compiles, plans) read high; rerun with "
        "nothing else running before reading them against their goals."
    ]


def machine() -> list[tuple[str, str]]:
    """What the figures were measured on."""
    ram_kib = _first_line("/proc/meminfo", "MemTotal").split()[0]
    ram = f"{int(ram_kib) / (1 << 20):.1f} GiB" if ram_kib.isdigit() else "?"
    changed = len(_git("status", "--porcelain", "--untracked-files=no").splitlines())
    commit = _git("rev-parse", "--short", "HEAD")
    return [
        ("CPU", _first_line("/proc/cpuinfo", "model name")),
        ("cores", f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)"),
        ("RAM", ram),
        ("OS", f"{_first_line('/etc/os-release', 'PRETTY_NAME')}, Linux {platform.release()}"),
        ("Python", platform.python_version()),
        ("jax / jaxlib", f"{jax.__version__} / {importlib.metadata.version('jaxlib')}"),
        ("ipujax", f"commit {commit}" + (f", {changed} files changed" if changed else "")),
        ("load average (1, 5, 15 min) at the start", load_average()),
        ("date", datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
    ]


def render(
    sections: Sequence[Section],
    about: Sequence[tuple[str, str]],
    command: str,
    timings: dict[str, float],
    warnings: Sequence[str] = (),
) -> str:
    """RESULTS.md; `warnings` head the goals (`busy_warning`)."""
    goals = [g for s in sections for g in s.goals]
    lines = [
        "# Benchmark results",
        "",
        "Written by `benchmarks/run.py` (`make bench`); rerun it rather than editing this file.",
        "",
        "## Machine",
        "",
        *(f"- {key}: {value}" for key, value in about),
        "",
        "## Command",
        "",
        f"    {command}",
        "",
        "Wall time: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
        + ". Sections run: "
        + ", ".join(s.name for s in sections)
        + ".",
        "",
        "## Goals",
        "",
        *warnings,
        *(f"- {goal(met)}: {what}" for what, met in goals),
    ]
    for section in sections:
        lines += ["", f"## {section.title}", "", section.table]
        lines += ["", *(f"- {note}" for note in section.notes)] if section.notes else []
    lines += ["", "## What each number means"]
    for section in sections:
        lines += ["", f"**{section.title}.** {section.meaning}"]
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """`text` to a temporary file beside `path`, then renamed over it: readers see the old
    file or the new one, never half of one."""
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as out:
        out.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(out.name, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
    os.replace(out.name, path)
