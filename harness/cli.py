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
import sys
from pathlib import Path

from attnfuzz.harness.target import UsageError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


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
    p.add_argument("--out", type=Path, default=Path(".attnfuzz") / "cases")
    p.add_argument("--db", type=Path, default=Path(".attnfuzz") / "db")
    p.add_argument("--scale", choices=sorted(SCALES), default="small")
    p.add_argument("--device", default=None, help="cpu or cuda (default: where kernels run)")

    p = sub.add_parser("repro", help="replay a case file")
    p.add_argument("case", type=Path)
    p.add_argument("--impl", default=None, help="another implementation to replay it on")
    p.add_argument("--device", default=None)

    p = sub.add_parser("export", help="write a case file as a standalone pytest file")
    p.add_argument("case", type=Path)
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        default=Path("tests") / "regressions",
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
    p.add_argument("--out", type=Path, default=Path(".attnfuzz") / "zoo")
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
                    {"name": i.name, "kind": i.kind, "description": i.description}
                    for i in target.implementations.values()
                ],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    for row in rows:
        print(f"{row['target']}: {row['summary']}")
        for impl in row["implementations"]:
            print(f"  {impl['name']:<28} {impl['kind']:<9} {impl['description']}")
    return EXIT_OK


def _print_failure(doc: dict, path: Path | None) -> None:
    print(f"FAIL {doc['target']} / {doc['implementation']}  [{doc['verdict']['key']}]")
    for m in doc["verdict"]["mismatches"][:8]:
        print(f"  [{m['check']}] {m['where']}: expected {m['expected']}, got {m['got']}")
    print("minimized case:")
    print(
        "  " + json.dumps(doc["case"] if isinstance(doc["case"], dict) else doc["case"].to_dict())
    )
    print("  derived: " + json.dumps(doc["derived"]))
    if path is not None:
        print(f"written to {path}")
        print(f"replay: attnfuzz repro {path}")


def cmd_run(args: argparse.Namespace) -> int:
    from attnfuzz.harness.casefile import case_document, write_case
    from attnfuzz.harness.registry import get_target
    from attnfuzz.harness.runner import fuzz
    from attnfuzz.strategies.batches import SCALES

    target = get_target(args.target)
    impl = target.resolve(args.impl)
    device = _device(args.device)
    result = fuzz(
        target,
        impl,
        max_examples=args.max_examples,
        rng_seed=args.seed,
        database=args.db,
        scale=SCALES[args.scale],
        device=device,
    )
    rate = result.examples / result.seconds if result.seconds else 0.0
    print(
        f"{target.name} / {impl.name}: {result.examples} examples in {result.seconds:.1f}s "
        f"({rate:.1f}/s)"
    )
    if result.statistics:
        print("statistics: " + ", ".join(f"{k} {v}" for k, v in sorted(result.statistics.items())))
    if not result.failed:
        print("PASS: no failure found")
        return EXIT_OK
    assert result.case is not None and result.verdict is not None
    doc = case_document(target.name, impl.name, result.case, result.verdict, device)
    name = f"{target.name}--{impl.name.replace(':', '_').replace('/', '_')}--{result.verdict.key}"
    path = write_case(args.out / f"{name.replace(':', '_')}.json", doc)
    print(
        f"first failure after {result.examples_to_failure} examples, "
        f"{result.seconds_to_failure:.2f}s"
    )
    _print_failure(doc, path)
    return EXIT_FAILURE


def cmd_repro(args: argparse.Namespace) -> int:
    from attnfuzz.harness.export import load_case

    # A case file is data: it never makes attnfuzz import a module (see load_case).
    target, impl, case, _ = load_case(args.case, args.impl)
    verdict = target.judge(impl, case, _device(args.device))
    print(f"{target.name} / {impl.name}: {verdict}")
    return EXIT_OK if verdict.ok else EXIT_FAILURE


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
EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a command killed by SIGPIPE


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
