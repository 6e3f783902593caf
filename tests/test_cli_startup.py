"""``attnfuzz --help``, every ``attnfuzz COMMAND --help`` and ``attnfuzz list``'s own
parser start without torch, Triton, Hypothesis or NumPy: only the commands that
judge (and those that read a target's declaration, which imports torch) load them."""

from __future__ import annotations

import json
import subprocess
import sys

from attnfuzz.harness.cli.dispatch import COMMANDS

HEAVY = ("torch", "triton", "hypothesis", "numpy")
TIMEOUT_S = 300

# Calls main() with each command line in one process; after each, the heavy modules loaded.
PROBE = """
import contextlib, io, json, sys
from attnfuzz.harness.cli import main
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
    print(json.dumps([argv, [m for m in {heavy!r} if m in sys.modules]]))
"""


def test_help_of_every_command_loads_nothing_heavy() -> None:
    argvs = [["--help"], ["--version"], *[[name, "--help"] for name in COMMANDS]]
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    loaded = [json.loads(line) for line in done.stdout.splitlines()]
    assert [argv for argv, _ in loaded] == argvs
    assert [(argv, heavy) for argv, heavy in loaded if heavy] == []


def test_the_module_s_help_imports_no_torch() -> None:
    """``python -m attnfuzz.harness.cli --help``, as ``-X importtime`` lists its imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "attnfuzz.harness.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: attnfuzz" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "attnfuzz.harness.cli.dispatch" in imported  # the parser was built
    assert imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))


def test_the_names_the_parser_offers_are_those_the_runs_take() -> None:
    """The parser's choices come from definitions, without the modules that use them."""
    from attnfuzz.harness.definitions import PROFILE_NAMES, SCALE_NAMES
    from attnfuzz.harness.settings import PROFILES
    from attnfuzz.strategies.batches import SCALES

    assert SCALE_NAMES == tuple(SCALES) and PROFILE_NAMES == tuple(PROFILES)
