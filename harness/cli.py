"""The ``attnfuzz`` command.

Exit status: 0 no failure, 1 a failure was found (or replays), 2 usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from attnfuzz.harness.definitions import (
    DEFAULT_CASES,
    DEFAULT_DB,
    DEFAULT_REGRESSIONS,
    DEFAULT_ZOO_OUT,
    EXIT_BROKEN_PIPE,
    EXIT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
)
from attnfuzz.harness.target import Implementation, UsageError


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def parse_duration(text: str) -> float:
    """``90`` (seconds), ``90s``, ``10m``, ``1h30m``, ``1.5h``: seconds, > 0."""
    s = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        value = float(s)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", s)
        if not parts or "".join(a + b for a, b in parts) != s:
            raise argparse.ArgumentTypeError(
                f"expected a duration such as 90s, 10m or 1h30m, got {text!r}"
            )
        value = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {text!r}")
    return value


DURATION_HELP = "a number of seconds, or with a unit: 90s, 10m, 1h30m"


def add_timeout_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--example-timeout",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help=f"{what} ({DURATION_HELP})",
    )


def _parser() -> argparse.ArgumentParser:
    from attnfuzz.strategies.batches import SCALES

    parser = argparse.ArgumentParser(
        prog="attnfuzz", description="Differential fuzzing of attention metadata."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="targets, implementations and mutants")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("run", help="fuzz one implementation of one target")
    p.add_argument("--target", required=True)
    p.add_argument("--impl", default="triton", help="registered name or module:attribute")
    p.add_argument("--max-examples", type=positive_int, default=200)
    p.add_argument("--seed", type=non_negative_int, default=None, help="derandomized run")
    p.add_argument("--out", type=Path, default=DEFAULT_CASES)
    p.add_argument(
        "--db",
        default=str(DEFAULT_DB),
        help="example database: a directory, or redis://HOST:PORT (unused with --seed)",
    )
    p.add_argument("--scale", choices=sorted(SCALES), default="small")
    p.add_argument("--device", default=None, help="cpu or cuda (default: where kernels run)")
    add_timeout_argument(p, "per example: a call without a verdict by then is a 'timeout'")

    p = sub.add_parser("repro", help="replay a case file")
    p.add_argument("case", type=Path)
    p.add_argument("--impl", default=None, help="another implementation to replay it on")
    p.add_argument("--device", default=None)
    add_timeout_argument(p, "for the replay (default: the case's, else 30s)")

    p = sub.add_parser("export", help="write a case file as a standalone pytest file")
    p.add_argument("case", type=Path)
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        default=DEFAULT_REGRESSIONS,
        help="a directory or a FILE.py (default: tests/regressions of the current directory)",
    )
    p.add_argument("--impl", default=None, help="the implementation the test judges")

    p = sub.add_parser("report", help="regression report: baseline vs current campaign")
    p.add_argument("--baseline", type=Path, required=True, help="OLD/campaign.json")
    p.add_argument("--current", type=Path, required=True, help="NEW/campaign.json")
    p.add_argument("--out", type=Path, default=None, help="directory (default: NEW's)")

    from attnfuzz.harness.campaign import add_arguments as add_campaign_arguments

    p = sub.add_parser("campaign", help="targets x implementations within a budget, N workers")
    add_campaign_arguments(p)

    p = sub.add_parser("zoo", help="every mutant of every target: the detection scoreboard")
    p.add_argument("--targets", nargs="+", default=None, help="default: every target")
    p.add_argument("--seeds", type=positive_int, default=5, help="derandomized runs per mutant")
    p.add_argument(
        "--budget",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds of search per mutant and seed: a plain number, in seconds (default 10)",
    )
    p.add_argument(
        "--shrink-budget",
        type=seconds,
        default=60.0,
        metavar="SECONDS",
        help="seconds of shrinking per run: a plain number, in seconds (default 60)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_ZOO_OUT)
    p.add_argument("--scale", choices=sorted(SCALES), default="small")
    p.add_argument("--device", default=None, help="cpu or cuda (default: where kernels run)")
    return parser


def seconds(text: str) -> float:
    """A plain number of seconds (no unit: ``10`` is ten seconds), finite; whether it
    is > 0 the command checks."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a plain number of seconds such as 10 or 2.5, got {text!r}"
        ) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return value


def _device(name: str | None) -> str:
    """``--device`` checked, with ``ATTNFUZZ_DTYPE``: a one-line :class:`UsageError`
    for an unknown or absent device or a dtype it cannot run (see harness/devices.py)."""
    from attnfuzz.harness.devices import check_device

    return check_device(name)


def cmd_list(args: argparse.Namespace) -> int:
    from attnfuzz.harness.registry import get_target, target_names

    rows = []
    for name in target_names():
        target = get_target(name)
        rows.append(
            {
                "target": name,
                "summary": target.summary,
                "implementations": [
                    {
                        "name": i.name,
                        "kind": i.kind,
                        "description": i.description,
                        "engine": i.engine,
                        # Why it cannot run here (an engine not installed), or null.
                        "unavailable": i.why_unavailable(),
                    }
                    for i in target.implementations.values()
                ],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    reasons: dict[str, None] = {}
    for row in rows:
        print(f"{row['target']}: {row['summary']}")
        for impl in row["implementations"]:
            mark = ""
            if impl["unavailable"] is not None:
                mark = " (unavailable)"
                reasons[impl["unavailable"]] = None
            print(f"  {impl['name']:<28} {impl['kind']:<9} {impl['description']}{mark}")
    for reason in reasons:
        print(f"unavailable: {reason}")
    return EXIT_OK


def _print_failure(doc: dict, path: Path | None, shrunk: bool = True) -> None:
    print(f"FAIL {doc['target']} / {doc['implementation']}  [{doc['verdict']['key']}]")
    for m in doc["verdict"]["mismatches"][:8]:
        # An implementation's exception text may hold anything: one printable line each.
        print(
            "  "
            + one_line(f"[{m['check']}] {m['where']}: expected {m['expected']}, got {m['got']}")
        )
    print("minimized case:" if shrunk else "case:")
    print(
        "  " + json.dumps(doc["case"] if isinstance(doc["case"], dict) else doc["case"].to_dict())
    )
    print("  derived: " + json.dumps(doc["derived"]))
    if path is not None:
        print(f"written to {path}")
        print(f"replay: attnfuzz repro {path}")


def _save_case(path: Path, doc: dict) -> Path | None:
    """Write a case file; if that fails, the case goes to the terminal, never lost."""
    from attnfuzz.harness.casefile import write_case

    try:
        return write_case(path, doc)
    except OSError as err:
        print(
            f"attnfuzz: could not write {path} ({err.strerror or err}); the case:", file=sys.stderr
        )
        print(json.dumps(doc, indent=2), file=sys.stderr)
        return None


class _Signals:
    """SIGINT and SIGTERM end a run as Ctrl-C does (``KeyboardInterrupt``), and are
    remembered: what was found is still written, and the exit status is 128 + signal."""

    def __init__(self) -> None:
        self.signum = signal.SIGINT
        self._got = False
        self._previous: dict[int, Any] = {}

    def received(self) -> bool:
        return self._got

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signum, self._got = signum, True
        raise KeyboardInterrupt

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def cmd_run(args: argparse.Namespace) -> int:
    from attnfuzz.harness.casefile import case_document
    from attnfuzz.harness.isolation import DEFAULT_TIMEOUT_S, IsolatedJudge
    from attnfuzz.harness.registry import get_target
    from attnfuzz.harness.runner import fuzz
    from attnfuzz.harness.storage import (
        check_database,
        database_spec,
        prepare_out,
        private_hypothesis_home,
    )
    from attnfuzz.strategies.batches import SCALES

    private_hypothesis_home()
    target = get_target(args.target)
    device = args.device  # checked by main() before any work
    # Paths first, before any user code runs (it may change directory).
    out = prepare_out(args.out, create=False)
    db = database_spec(args.db)
    if args.seed is None:  # a derandomized run neither reads nor writes the database
        check_database(db)
    impl = target.resolve(args.impl)
    timeout = args.example_timeout or DEFAULT_TIMEOUT_S
    with IsolatedJudge(target, impl, device, timeout) as isolated, _Signals() as signals:
        result = fuzz(
            target,
            impl,
            max_examples=args.max_examples,
            rng_seed=args.seed,
            database=db,
            scale=SCALES[args.scale],
            device=device,
            judge=isolated.judge,
            stop_requested=signals.received,
        )
    rate = result.examples / result.seconds if result.seconds else 0.0
    print(
        f"{target.name} / {impl.name}: {result.examples} examples in {result.seconds:.1f}s "
        f"({rate:.1f}/s)" + (" (interrupted)" if result.interrupted else "")
    )
    if result.statistics:
        print("statistics: " + ", ".join(f"{k} {v}" for k, v in sorted(result.statistics.items())))
    if not result.failed:
        if result.interrupted:
            print("INTERRUPTED: no failure found so far")
            return 128 + signals.signum
        print("PASS: no failure found")
        return EXIT_OK
    assert result.case is not None and result.verdict is not None
    doc = case_document(
        target.name, impl.name, result.case, result.verdict, device, example_timeout=timeout
    )
    name = f"{target.name}--{impl.name.replace(':', '_').replace('/', '_')}--{result.verdict.key}"
    path = _save_case(out / f"{name.replace(':', '_')}.json", doc)
    print(
        f"first failure after {result.examples_to_failure} examples, "
        f"{result.seconds_to_failure:.2f}s"
    )
    if not result.shrunk:
        print(f"the case that failed as it ran (a {result.verdict.key} is not shrunk)")
    elif result.interrupted:
        print("interrupted while shrinking: the smallest failing case so far")
    _print_failure(doc, path, shrunk=result.shrunk and not result.interrupted)
    return 128 + signals.signum if result.interrupted else EXIT_FOUND


def cmd_repro(args: argparse.Namespace) -> int:
    from attnfuzz.harness.export import load_case
    from attnfuzz.harness.isolation import DEFAULT_TIMEOUT_S, IsolatedJudge

    # A case file is data: it never makes attnfuzz import a module (see load_case).
    target, impl, case, doc = load_case(args.case, args.impl)
    device = args.device  # checked by main() before any work
    _note_engine_version(doc, impl)
    # The timeout the case was found under, so that a hang replays as a hang.
    timeout = args.example_timeout or doc["settings"].get("example_timeout") or DEFAULT_TIMEOUT_S
    with IsolatedJudge(target, impl, device, timeout) as isolated:
        verdict = isolated.judge(case)
    lines = str(verdict).splitlines()
    print(f"{target.name} / {impl.name}: {lines[0]}")
    for line in lines[1:]:
        print("  " + one_line(line.strip()))
    return EXIT_OK if verdict.ok else EXIT_FOUND


def _note_engine_version(doc: dict, impl: Implementation) -> None:
    """Say so when a case found on an engine's code replays on another version of it."""
    from attnfuzz.harness.casefile import engine_versions

    found = doc.get("engine")
    if found is None or impl.engine != found["name"]:
        return
    installed = engine_versions().get(found["name"], "absent")
    if installed != found["version"]:
        note = (
            f"this case was found on {found['name']} {found['version']}; "
            f"{found['name']} {installed} is installed here, and replays it"
        )
        print(f"attnfuzz: note: {one_line(note)}", file=sys.stderr)


def cmd_export(args: argparse.Namespace) -> int:
    from attnfuzz.harness.export import export_case

    path = export_case(args.case, args.out, args.impl)
    print(one_line(f"wrote {path}", PATH_LIMIT))
    # The interpreter that has attnfuzz, whatever ``pytest`` on the PATH is.
    command = f"{shlex.quote(sys.executable)} -m pytest {shlex.quote(str(path))}"
    print(one_line(f"run: {command}", PATH_LIMIT))
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from attnfuzz.reports.regression import main_report

    return main_report(args.baseline, args.current, args.out)


MESSAGE_LIMIT = 500
"""Characters of a message to the terminal that quotes input (an error, a note)."""
PATH_LIMIT = 4096


def one_line(text: object, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` as one line of printable characters, at most ``limit`` long.

    Control characters, line breaks and other non-printables are escaped as
    ``repr`` writes them (``\\x1b``, ``\\n``); a longer text is cut and ends
    with ``...``. Whatever an input held, it never reaches the terminal raw.
    """
    out: list[str] = []
    length = 0
    for c in str(text):
        piece = c if c.isprintable() else repr(c)[1:-1]
        out.append(piece)
        length += len(piece)
        if length > limit:
            return "".join(out)[: max(limit - 3, 0)] + "..."
    return "".join(out)


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
        print(f"attnfuzz: error: {where}{one_line(message)} (see {hint})", file=sys.stderr)
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
    error (one line on stderr, before any work), 141 stdout was closed early."""
    args = _parse_args(_parser(), argv)
    # ``--impl pkg.module:fn`` names the user's code, found from where they run us.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from attnfuzz.harness.campaign import command as cmd_campaign
    from attnfuzz.harness.zoo import cmd_zoo

    try:
        if args.command in ("run", "repro", "zoo"):  # the device and dtype, before any work
            args.device = _device(args.device)
        commands = {
            "list": cmd_list,
            "run": cmd_run,
            "repro": cmd_repro,
            "export": cmd_export,
            "report": cmd_report,
            "zoo": cmd_zoo,
            "campaign": cmd_campaign,
        }
        status = commands[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return status
    except UsageError as err:
        print(f"attnfuzz: error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return _stdout_closed()


if __name__ == "__main__":
    sys.exit(main())
