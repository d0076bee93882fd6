"""The HTML report: one self-contained, well-formed page with inline SVG, its text escaped; and
rendered for real in headless Chromium (scripts/ensure_chromium.sh installs it)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from pngdecode import read_png

from ipujax.report import CostReport
from ipujax.views.html import render_html

CHROMIUM = Path("/usr/bin/chromium")
VOID = {"meta", "link", "br", "hr", "img", "input", "rect", "line", "polygon", "path", "circle"}


class StrictParser(HTMLParser):
    """Fails on an end tag that closes anything but the innermost open element."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.tags: dict[str, int] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID and (not self.stack or self.stack[-1] != tag):
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> StrictParser:
    parser = StrictParser()
    parser.feed(page)
    parser.close()
    assert not parser.problems, parser.problems[:5]
    assert parser.stack == [], parser.stack
    return parser


def test_page_is_well_formed_and_self_contained(gpt_files) -> None:
    page = gpt_files.html.read_text(encoding="utf-8")
    parser = parse(page)
    assert page.startswith("<!DOCTYPE html>")
    assert parser.tags.get("svg", 0) >= 4  # heatmap, profile, cycles by op, timeline
    assert parser.tags.get("table", 0) >= 8
    lowered = page.lower()
    for external in ("<script", "<link", "@import", "url(", "http://", "https://", "<img"):
        assert external not in lowered, external
    text = " ".join(parser.text)
    report = CostReport.from_json(gpt_files.json.read_text())
    assert f"{report.total_cycles:,}" in text
    for heading in ("Summary", "Memory", "Execution", "Communication", "Phases"):
        assert heading in text
    assert "none (phases=None)" in text and "cycles not hidden" in text  # host traffic
    assert page.count("<rect") >= report.tiles_per_ipu  # a square per tile in the heatmap


def test_report_text_is_escaped(gpt_files) -> None:
    report = CostReport.from_json(gpt_files.json.read_text())
    evil = '<script>alert("x")</script>'
    steps = tuple(
        dataclasses.replace(s, op=evil, source=f"/tmp/{evil}.py:1") for s in report.supersteps
    )
    page = render_html(dataclasses.replace(report, supersteps=steps, target=evil))
    parse(page)
    assert "<script" not in page
    assert "&lt;script&gt;" in page


def test_a_report_that_does_not_fit_is_marked(gpt_files) -> None:
    report = CostReport.from_json(gpt_files.json.read_text())
    full = report.tile_memory.copy()
    full[0, 7] = report.bytes_per_tile + 1
    page = render_html(dataclasses.replace(report, tile_memory=full))
    parse(page)
    assert "does NOT fit" in page
    assert "over the budget" in page
    assert 'fill="#d62728"><title>IPU 0 tile 7:' in page  # the tile over budget is red
    # Rows over budget are marked, and only rows: a table keeps its own class.
    assert '<tr class="over">' in page
    assert '<table class="over">' not in page
    assert page.count('<table class="kv">') == 1  # the summary's key-value table


def _chromium_or_skip() -> None:
    if CHROMIUM.exists():
        return
    message = f"{CHROMIUM} is missing; run scripts/ensure_chromium.sh (Debian's chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {message}")
    pytest.skip(message)


def test_page_renders_in_headless_chromium(gpt_files, tmp_path: Path) -> None:
    _chromium_or_skip()
    shot = tmp_path / "shot.png"
    page = tmp_path / "report.html"
    shutil.copy(gpt_files.html, page)
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1280,2000",
        f"file://{page}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert shot.exists(), f"no screenshot; chromium exited {done.returncode}: {done.stderr[-2000:]}"
    assert shot.stat().st_size > 20_000
    image = read_png(shot)
    assert (image.width, image.height) == (1280, 2000)
    rgb = image.pixels[..., :3].astype(int)
    assert rgb.std() > 10, "the screenshot is (nearly) one colour"
    colours = np.unique(rgb.reshape(-1, 3)[::7], axis=0)
    assert len(colours) > 100, f"only {len(colours)} colours: the page did not render"
    saturated = (rgb.max(axis=-1) - rgb.min(axis=-1)) > 80
    assert saturated.mean() > 0.02, "no coloured plots visible (heatmap, cards)"
    dark = rgb.max(axis=-1) < 90
    assert dark.mean() > 0.002, "no text visible"
