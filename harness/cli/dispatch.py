"""``attnfuzz``'s parser and its dispatch to the subcommand modules (:func:`main`)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from attnfuzz.harness.cli import campaign, describe, export, listing, report, repro, run, zoo
from attnfuzz.harness.cli.args import MESSAGE_LIMIT, device, one_line
from attnfuzz.harness.definitions import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_USAGE,
    HARNESS_FAULT_NOTE,
    VERSION,
)
from attnfuzz.harness.errors import HarnessError, UsageError
from attnfuzz.harness.lifetime import sweep_stale_scratch

COMMANDS: dict[str, ModuleType] = {
    "list": listing,
    "describe": describe,
    "run": run,
    "repro": repro,
    "export": export,
    "report": report,
    "campaign": campaign,
    "zoo": zoo,
}
"""Each subcommand's module: ``HELP``, ``add_arguments(parser)``, ``command(args) -> int``,
and ``CHECKS_DEVICE = True`` where ``--device`` is checked before any work."""


def build_parser(config: Mapping[str, Any] | None = None) -> argparse.ArgumentParser:
    """The whole command line: ``attnfuzz [--version] COMMAND ...``.

    ``config`` is a project's ``[tool.attnfuzz]`` (:func:`attnfuzz.harness.config.defaults`):
    each key a subcommand lists in its ``CONFIG`` becomes that option's default,
    so an option given on the command line wins over it.
    """
    parser = argparse.ArgumentParser(
        prog="attnfuzz",
        description="Differential fuzzing of attention metadata.",
        epilog="defaults of run, campaign and zoo may come from [tool.attnfuzz] in the "
        "nearest pyproject.toml; options given here win",
    )
    parser.add_argument("--version", action="version", version=f"attnfuzz {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP)
        module.add_arguments(p)
        keys = getattr(module, "CONFIG", {})
        p.set_defaults(
            **{dest: (config or {})[key] for key, dest in keys.items() if key in (config or {})}
        )
    return parser


def _parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, its errors one line on stderr (exit status 2), like ours."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return parser.parse_args(argv)
    except SystemExit as stop:
        if stop.code in (0, None):  # --help: printed on stdout, nothing to say
            raise
        text = captured.getvalue()
        found = re.search(r"^attnfuzz(?: (\S+))?: error: (.*)\Z", text, re.M | re.S)
        command, message = found.groups() if found else (None, text)
        message = message.strip()
        hint = f"attnfuzz {command} --help" if command else "attnfuzz --help"
        where = f"{command}: " if command else ""
        print(
            f"attnfuzz: error: {where}{one_line(message, MESSAGE_LIMIT)} (see {hint})",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_USAGE) from None


def _stdout_closed() -> int:
    """The reader of our output went away (``attnfuzz list | head -1``): nothing more
    is written to it, and the exit status says so, without a traceback."""
    try:  # the recipe of Python's signal docs: what is still buffered goes nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass  # a stdout without a file descriptor (captured): nothing to redirect
    return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    """Run one command. Exit status: 0 no failure, 1 a failure was found, 2 a usage
    error (one line on stderr, before any work), 3 no verdict (see the package's
    docstring), 4 attnfuzz's own code failed while
    judging (one line naming the file and line in attnfuzz; no verdict, no case
    file), 141 stdout was closed early."""
    from attnfuzz.harness.config import defaults

    try:
        config = defaults()
    except UsageError as err:  # a broken [tool.attnfuzz]: nothing runs
        print(f"attnfuzz: error: {one_line(err, MESSAGE_LIMIT)}", file=sys.stderr)
        return EXIT_USAGE
    args = _parse_args(build_parser(config), argv)
    # ``--impl pkg.module:fn`` names the user's code, found from where they run us.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    # What killed attnfuzz processes left in the temporary directory goes first (their
    # owners are gone), then what this command's own children left that way (a campaign's
    # workers are killed once their units end; a spawned judging child never exits cleanly).
    sweep_stale_scratch()
    try:
        return _command(COMMANDS[args.command], args)
    finally:
        sweep_stale_scratch()


def _command(module: ModuleType, args: argparse.Namespace) -> int:
    """``module``'s command: its exit status, an error one line on stderr."""
    try:
        if getattr(module, "CHECKS_DEVICE", False):  # the device and dtype, before any work
            args.device = device(args.device)
        status = module.command(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return status
    except UsageError as err:
        print(f"attnfuzz: error: {one_line(err, MESSAGE_LIMIT)}", file=sys.stderr)
        return EXIT_USAGE
    except HarnessError as err:  # attnfuzz's fault: says nothing of the code under test
        print(f"attnfuzz: ERROR: {one_line(err, MESSAGE_LIMIT)}", file=sys.stderr)
        print(f"attnfuzz: {HARNESS_FAULT_NOTE}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:  # Ctrl-C before a command's own handling (run's) took over
        print("attnfuzz: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
