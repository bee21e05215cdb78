"""Every command the README and docs/ show with its output is run, and prints what they show.

The convention, for whoever writes a page: a fenced block marked ``console`` holds commands, each after
a ``$ `` prompt, and under each the lines it prints on stdout. A line that is exactly ``...`` stands for
any number of lines (none included); ``...`` inside a line stands for any text on that line (a port
number, a path that depends on the build). Everything else must match exactly, line by line, the whole
output: the first line to the last. The commands of one block run in order in one bash shell, from the
repository root, with this interpreter's folder first on ``PATH`` (so ``python`` is the interpreter
running the tests); ``$ echo $?`` after a command prints that command's exit code. Blocks marked ``bash``
are shown, not run: installs, GPU, torchrun and srun runs, nox, benchmarks.

The matching rule itself is tested here on made-up text (fast, in the default run); running the blocks
starts fresh interpreters and real worlds (seconds each), so those tests are marked ``integration``.
Generated pages (``docs/semantics.md``, ``docs/matrix.md``) are written by code and hold no commands.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

pytestmark = pytest.mark.not_a_fact("checks the commands the documentation shows, not a fact about DDP")

ROOT = Path(__file__).resolve().parents[3]
GENERATED = {"semantics.md", "matrix.md"}
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in GENERATED)]
#: Seconds one block may run (an audit is two worlds: about 10 s on 2 shared cores).
BLOCK_TIMEOUT_S = 300
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclasses.dataclass(frozen=True)
class Command:
    """One ``$ `` command of a console block and the lines shown under it."""

    line: int  # 1-based line of the ``$ `` prompt in its page
    command: str
    expected: tuple


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    commands: tuple

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fenced_blocks(text: str) -> list:
    """``[(language, first_line, [lines])]`` for every fenced block of a Markdown text (1-based line of the
    opening fence). Raises ``ValueError`` for a fence left open."""
    blocks, current = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line)
        if current is None and fence:
            current = (fence.group(1), number, [])
        elif current is not None and line.rstrip() == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current[2].append(line)
    if current is not None:
        raise ValueError(f"the fenced block opened at line {current[1]} is never closed")
    return blocks


def console_blocks(page: Path) -> list:
    """The ``console`` blocks of ``page`` as :class:`Block`\\ s. Raises ``ValueError`` for a console block
    whose first line is not a ``$ `` command."""
    out = []
    for language, first, lines in fenced_blocks(page.read_text(encoding="utf-8")):
        if language != "console":
            continue
        commands = []
        for offset, line in enumerate(lines, start=first + 1):
            if line.startswith("$ "):
                commands.append([offset, line[2:], []])
            elif not commands:
                raise ValueError(f"{page.name}:{first}: a console block must start with a '$ ' command, got {line!r}")
            else:
                commands[-1][2].append(line)
        out.append(Block(page, first, tuple(Command(n, c, tuple(e)) for n, c, e in commands)))
    return out


def mismatch(expected, actual) -> Optional[str]:
    """None when the ``actual`` lines match the ``expected`` ones (``...`` lines and in-line ``...`` as in
    the module docstring), else a unified diff of the two."""
    pattern = ""
    for line in expected:
        if line == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += "[^\n]*?".join(re.escape(piece) for piece in line.split("...")) + r"\n"
    text = "".join(line + "\n" for line in actual)
    if re.fullmatch(pattern, text):
        return None
    return "\n".join(difflib.unified_diff(list(expected), list(actual), "shown", "printed", lineterm=""))


#: Printed after each command (with its exit code restored), to cut the block's stdout into one output
#: per command.
MARK = "@@ddpprobe-docs-command-done@@"


def run_block(block: Block) -> list:
    """Run the block's commands in one bash shell from the repository root; return each one's stdout
    lines. Raises ``subprocess.TimeoutExpired`` past :data:`BLOCK_TIMEOUT_S`."""
    script = "".join(f"{c.command}\n__rc=$?; printf '\\n%s\\n' '{MARK}'; (exit $__rc)\n" for c in block.commands)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        start_new_session=True,
    )
    chunks = done.stdout.split(f"\n{MARK}\n")
    assert len(chunks) == len(block.commands) + 1 and chunks[-1] == "", (
        f"{block.id}: the commands did not all run\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )
    return [chunk.splitlines() for chunk in chunks[:-1]], done.stderr


ALL_BLOCKS = [block for page in PAGES for block in console_blocks(page)]


def test_the_matching_rule_accepts_the_shown_lines_and_rejects_a_changed_missing_or_extra_line():
    """Exact lines match; ``...`` spans lines (none included) and text within a line; a changed value,
    a missing last line and an extra line each fail, with a diff."""
    printed = ["val set: N=12; 2 ranks", "  port [127.0.0.1]:20395. Check", "row a", "row b", "exit code 1"]
    assert mismatch(printed, printed) is None
    assert mismatch(["val set: N=12; 2 ranks", "  port [127.0.0.1]:.... Check", "...", "exit code 1"], printed) is None
    assert mismatch(["...", "row a", "row b", "...", "exit code 1"], printed) is None
    assert (
        mismatch(["...", "val set: N=12; 2 ranks", "...", "row a", "...", "row b", "...", "exit code 1"], printed)
        is None
    )
    changed = mismatch(["val set: N=11; 2 ranks", "...", "exit code 1"], printed)
    assert changed and "-val set: N=11; 2 ranks" in changed and "+val set: N=12; 2 ranks" in changed
    assert mismatch(["...", "row b"], printed) is not None  # the last line is not shown
    assert mismatch([*printed, "exit code 0"], printed) is not None  # a line that is not printed
    assert mismatch(printed[:-1], printed) is not None  # an extra printed line


def test_every_transcript_in_the_docs_is_a_console_block_that_is_run():
    """A ``$ `` prompt in any other fenced block would be a transcript nobody checks: there are none; each
    console block has at least one command, and the README and docs/audit.md show some."""
    unchecked = []
    for page in PAGES:
        for language, first, lines in fenced_blocks(page.read_text(encoding="utf-8")):
            if language != "console" and any(line.startswith("$ ") for line in lines):
                unchecked.append(f"{page.relative_to(ROOT)}:{first} ({language or 'no language'})")
    assert not unchecked, f"transcripts outside console blocks (mark them ```console): {unchecked}"
    assert all(block.commands for block in ALL_BLOCKS)
    pages = {block.page.name for block in ALL_BLOCKS}
    assert {"README.md", "audit.md"} <= pages, pages


@pytest.mark.integration
@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[block.id for block in ALL_BLOCKS])
def test_each_console_command_prints_the_lines_the_docs_show(block):
    """Run the block; each command's stdout matches the lines shown under it (the matching rule above)."""
    outputs, stderr = run_block(block)
    failures = []
    for command, printed in zip(block.commands, outputs):
        diff = mismatch(command.expected, printed)
        if diff is not None:
            failures.append(f"{block.page.name}:{command.line}: $ {command.command}\n{diff}")
    assert not failures, "\n\n".join(failures) + f"\n\nstderr of the block:\n{stderr[-3000:]}"
