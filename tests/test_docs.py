"""The docs say what the code does: figures, versions, limits and flags that README.md and docs/*.md
state are read back from the code they describe, so a change to either side that leaves the other
behind fails here.

The CLI is read through its public entry (`ipujax.__main__.main`, as `python -m ipujax` runs it),
the fidelity figures from the committed docs/fidelity.md (which `ipujax fidelity --markdown`
writes; nothing slow runs), and the Target's numbers from its presets.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from pathlib import Path
from typing import Any

import pytest

import ipujax
from ipujax import fidelity
from ipujax.__main__ import main
from ipujax.report import READABLE, VERSION
from lowering.loops import MAX_OPS, MAX_TRIPS
from partitioner import Target

ROOT = Path(__file__).resolve().parents[1]
_RANGE = re.compile(r"(\d+\.\d+)-(\d+\.\d+)x?")
_OPTION = re.compile(r"\[(--[\w-]+)(?: ([^\]]+))?\]|(?<![\w\[])(--[\w-]+)")


def _doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _flat(text: str) -> str:
    """Markdown text with its line breaks and runs of spaces as single spaces."""
    return " ".join(text.split())


def _one(pattern: str, text: str) -> re.Match[str]:
    matches = list(re.finditer(pattern, text))
    assert len(matches) == 1, f"expected one {pattern!r} in the doc, found {len(matches)}"
    return matches[0]


def _section(text: str, heading: str) -> str:
    """A markdown section: from `heading` to the next heading of its level."""
    start = text.index(heading)
    level = heading.split(" ")[0]
    end = text.find(f"\n{level} ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


# ---- docs/cli.md: the report's JSON version ---------------------------------------------------


def test_cli_doc_gives_the_report_version_the_code_writes() -> None:
    cli = _flat(_doc("docs/cli.md"))
    assert int(_one(r"The JSON report is version (\d+)", cli).group(1)) == VERSION
    older = _one(r"files of versions ([\d, and]+) still read", cli).group(1)
    assert {int(n) for n in re.findall(r"\d+", older)} == set(READABLE) - {VERSION}
    for version in READABLE[1:]:  # what each version added
        assert f"version {version}:" in cli, f"docs/cli.md does not say what {version} added"


# ---- docs/phases.md: unrolling and streaming ---------------------------------------------------


def test_docs_give_lowerings_unroll_limits() -> None:
    """Pipelines unroll counted loops within the limits (phases lay them out inline)."""
    target = _flat(_doc("docs/target.md"))
    assert int(_one(r"would pass ([\d,]+) ops", target).group(1).replace(",", "")) == MAX_OPS
    for name in ("docs/architecture.md", "docs/target.md"):
        trips = re.findall(r"up to (\d+) trips", _flat(_doc(name)))
        assert trips and {int(t) for t in trips} == {MAX_TRIPS}, name


def test_phases_doc_gives_the_streaming_constants() -> None:
    phases = _flat(_doc("docs/phases.md"))
    bow = Target.bow()
    rate = _one(r"`streaming_bytes_per_second` \((\d+) GB/s", phases).group(1)
    assert int(rate) * 10**9 == bow.streaming_bytes_per_second
    latency = _one(r"`streaming_latency_cycles` \(([\d,]+)", phases).group(1)
    assert int(latency.replace(",", "")) == bow.streaming_latency_cycles
    io_tiles = _one(r"by default PopXL's (\d+), at most an eighth", phases).group(1)
    assert int(io_tiles) == bow.phase_io_tiles == min(int(io_tiles), bow.tiles_per_ipu // 8)


# ---- fidelity: README and docs/cli.md against docs/fidelity.md and ipujax.fidelity --------------


@dataclasses.dataclass(frozen=True)
class _Row:
    name: str
    ratio: float
    band: tuple[float, float]


def _fidelity_rows() -> list[_Row]:
    """The table of the committed docs/fidelity.md, as `ipujax fidelity --markdown` wrote it."""
    rows = []
    for line in _doc("docs/fidelity.md").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| ") or cells[0] == "figure" or len(cells) < 4:
            continue
        ratio, _, band = cells[3].partition(" (band ")
        low, high = band.rstrip(")").split("-") if band else (fidelity.LOW, fidelity.HIGH)
        rows.append(_Row(cells[0], float(ratio), (float(low), float(high))))
    return rows


def _ranges(text: str) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in _RANGE.findall(text)]


def test_fidelity_doc_rows_are_the_codes_figures() -> None:
    rows = _fidelity_rows()
    assert [r.name for r in rows] == [f.name for f in fidelity.FIGURES]
    assert [r.band for r in rows] == [f.band for f in fidelity.FIGURES]
    assert f"The band is {fidelity.LOW}-{fidelity.HIGH}x" in _flat(_doc("docs/fidelity.md"))


def test_readme_quotes_the_fidelity_tables_ranges() -> None:
    readme = _flat(_doc("README.md"))
    start = readme.index("`ipujax fidelity` checks")
    quoted = _ranges(readme[start : readme.index("OutOfMemoryError", start)])
    rows = _fidelity_rows()
    chip = [r.ratio for r in rows if r.band == (fidelity.LOW, fidelity.HIGH)]
    system = [r for r in rows if r.band != (fidelity.LOW, fidelity.HIGH)]
    (system_band,) = {r.band for r in system}
    ratios = [r.ratio for r in system]
    expected = [
        (min(chip), max(chip)),
        (fidelity.LOW, fidelity.HIGH),
        (min(ratios), max(ratios)),
        system_band,
    ]
    assert quoted == expected, f"README quotes {quoted}; docs/fidelity.md has {expected}"


def test_cli_doc_gives_the_fidelity_bands() -> None:
    section = _flat(_section(_doc("docs/cli.md"), "## `fidelity`"))
    bands = {f.band for f in fidelity.FIGURES}
    assert set(_ranges(section)) == bands


# ---- docs/cli.md: the synopsis against the parser ----------------------------------------------


def _synopsis() -> dict[tuple[str, ...], dict[str, str | None]]:
    """docs/cli.md's opening code block: each command (its words after `ipujax`) and its flags
    with the value each shows (None for a switch)."""
    block = _doc("docs/cli.md").split("```")[1]
    entries: list[str] = []
    for line in block.strip().splitlines():
        if line.startswith("ipujax"):
            entries.append(line)
        else:
            entries[-1] += " " + line.strip()
    commands = {}
    for entry in entries:
        words = entry.split()[1:]
        command = tuple(w for w in words[:2] if re.fullmatch(r"[a-z][a-z-]*", w))
        commands[command] = _options(" ".join(words[len(command) :]))
    return commands


def _options(usage: str) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for bracketed, value, bare in _OPTION.findall(usage):
        found[bracketed or bare] = value or None
    found.pop("-h", None)
    return found


def _help(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    capsys.readouterr()
    assert main([*command, "--help"]) == 0
    return capsys.readouterr().out


def _usage(capsys: pytest.CaptureFixture[str], command: tuple[str, ...]) -> dict[str, str | None]:
    line = _help(capsys, *command).splitlines()[0]
    assert line.startswith("usage: ipujax"), line
    return _options(line.removeprefix("usage: ipujax"))


def _subcommands(capsys: pytest.CaptureFixture[str], *command: str) -> set[str]:
    """The subcommands a help page lists under its positional arguments."""
    text = _help(capsys, *command)
    listing = text.split("positional arguments:")[1].split("options:")[0]
    return set(re.findall(r"^ {4}(\S+)", listing, re.MULTILINE))


def _choices(value: str) -> tuple[frozenset[str], frozenset[str]]:
    """A value's literal alternatives (`auto`, `bow`) and the first word of its placeholders
    (`NAME` of `NAME,NAME,...`, `N`)."""
    words = value.split("|")
    literal = frozenset(w for w in words if w.islower())
    placeholders = frozenset(re.split(r"\W", w)[0] for w in words if not w.islower())
    return literal, placeholders


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse's usage on one line


@pytest.mark.usefixtures("wide")
def test_cli_synopsis_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    documented = _synopsis()
    commands = {c[0] for c in documented if c}
    assert commands == _subcommands(capsys)
    assert {c[1] for c in documented if c[:1] == ("report",)} == _subcommands(capsys, "report")


@pytest.mark.usefixtures("wide")
def test_cli_synopsis_flags_are_the_parsers(capsys: pytest.CaptureFixture[str]) -> None:
    for command, documented in _synopsis().items():
        parsed = _usage(capsys, command)
        assert set(documented) == set(parsed), f"ipujax {' '.join(command)}"
        for flag, value in documented.items():
            given = parsed[flag]
            assert (value is None) == (given is None), f"{flag}: {value!r} against {given!r}"
            if value and given and "|" in value and "|" in given:
                assert _choices(value) == _choices(given), f"{flag}: {value} against {given}"


def test_cli_doc_lists_the_jit_keywords() -> None:
    cli = _flat(_doc("docs/cli.md"))
    listed = _one(r"`jit_kwargs` are keyword arguments of `ipujax.jit` \(([^)]*)\)", cli).group(1)
    keywords = set(inspect.signature(ipujax.jit).parameters) - {"fun"}
    assert set(re.findall(r"`(\w+)`", listed)) == keywords


_SCOPED = """
import jax
import jax.numpy as jnp


def _step(x):
    with jax.named_scope("first"):
        x = jnp.tanh(x @ x)
    with jax.named_scope("second"):
        x = jnp.sin(x @ x)
    return x.sum()


def work():
    return _step, (jax.ShapeDtypeStruct((64, 64), jnp.float32),)
"""


def test_cli_takes_the_phases_the_doc_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each form of `--phases` in the synopsis runs (NAME standing for the scopes' names); a
    count of phases, which the doc says is no setting, is a user error."""
    (workload := tmp_path / "scoped.py").write_text(_SCOPED)
    spec = f"{workload}:work"
    value = _synopsis()[("cost-report",)]["--phases"]
    assert value is not None
    forms = [w if w.islower() else "first,second" for w in value.split("|")]
    for form in [*forms, "4"]:
        capsys.readouterr()
        code = main(["cost-report", spec, "--phases", form])
        assert code == (2 if form == "4" else 0), (form, capsys.readouterr().err)


# ---- docs/target.md: every Target field, and its value per preset -------------------------------


def _number(cell: str) -> Any:
    text = cell.strip().strip("`").strip('"').replace(",", "")
    if text == "None":
        return None
    power = re.fullmatch(r"([\d.]+) x (\d+)\^(\d+)", text)
    if power:
        return float(power.group(1)) * int(power.group(2)) ** int(power.group(3))
    if re.fullmatch(r"\d+ kinds", text):
        return int(text.split()[0])
    return text if re.search(r"[a-z]", text.replace("e", "")) else float(text)


def _target_rows() -> dict[str, dict[str, Any]]:
    """The field tables of docs/target.md: each field's value per preset."""
    rows: dict[str, dict[str, Any]] = {}
    in_table = False
    for line in _doc("docs/target.md").splitlines():
        if line.startswith("| field | mk1 | mk2 | bow |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            names = re.findall(r"`(\w+)`", cells[0])
            values = [c if c != "same" else cells[1] for c in cells[1:4]]
            for i, name in enumerate(names):
                parts = [v.split(", ")[i] if len(names) > 1 else v for v in values]
                rows[name] = dict(zip(("mk1", "mk2", "bow"), map(_number, parts), strict=True))
    return rows


def _same(documented: Any, actual: Any) -> bool:
    if isinstance(actual, tuple):
        return documented == len(actual)
    if isinstance(actual, (int, float)) and not isinstance(documented, str):
        return documented is not None and math.isclose(documented, actual, rel_tol=1e-9)
    return documented == actual


def test_target_doc_gives_every_field_its_presets_value() -> None:
    rows = _target_rows()
    presets = {"mk1": Target.mk1(), "mk2": Target.mk2(), "bow": Target.bow()}
    for field in dataclasses.fields(Target):
        assert field.name in rows, f"docs/target.md has no row for Target.{field.name}"
        for preset, target in presets.items():
            documented, actual = rows[field.name][preset], getattr(target, field.name)
            assert _same(documented, actual), f"{field.name} ({preset}): {documented} != {actual}"
