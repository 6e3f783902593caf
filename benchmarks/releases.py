"""Real bugs in the engine releases that shipped them, and a sweep of every supported release.

    python benchmarks/releases.py --venvs DIR [bugs] [--markdown docs/releases.md]
    python benchmarks/releases.py --venvs DIR --engine sglang bugs [--markdown docs/releases.md]
    python benchmarks/releases.py --venvs DIR sweep [--markdown docs/releases.md]
    python benchmarks/releases.py --venvs DIR tests [--releases R ...] [--markdown docs/releases.md]

``bugs``: for each historical fix that shipped in a release (:data:`FIXES`), the
last release with the bug and the first with the fix are installed, one at a
time, into cached venvs under DIR (at most ``--keep`` of them on disk), and the
matching ``--impl vllm*`` runs with seeds 0, 1, 2 and 1000 examples on each
(kept in ``DIR/bugs.json``: ``--target`` and ``--rerun`` run parts again).
The table: the release, the fix, the seeds that found it, examples to the
first failure, the minimized case with its reachability, and whether the fixed
release passes. The reachability is the one ``attnfuzz run`` computed, never the
script's own: each stored run keeps its case file and a fingerprint of the
declarations reachability reads (:func:`reach_fingerprint`); where they have
changed since, the release's ``attnfuzz repro --json`` of that case file computes
it again (a run stored without its case file is run again).
``--engine sglang``: the same for SGLang's shipped bugs (``--impl sglang*``, each
release installed by ``adapters/sglang/install.sh``; its own markers,
``releases:bugs-sglang``); ``sweep`` and ``tests`` are vLLM's only.

``sweep``: every release 0.21.0 to 0.33.0, every target, ``attnfuzz run --impl
vllm --seed 0 --max-examples 200``: exit 0, a finding (triaged in docs/releases.md),
or unavailable (the target's computation is not in that release, with why);
never an attnfuzz error.

``tests``: the adapters' own tests (``pytest -m vllm``) in each release's venv
(pytest added to it): each release-aware test passes or skips saying why.

Each venv: torch (the CPU build), attnfuzz from this checkout (editable), and
the release with its range's pinned list (``adapters/vllm/install.sh``). The
runs are subprocesses of that venv's python; nothing here imports vLLM.
``--markdown FILE`` (or ``--write FILE``) replaces the table between this
script's markers in FILE, ``<!-- releases:MODE:begin -->`` and ``...:end -->``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from attnfuzz.adapters.sglang.shipped import SHIPPED_BUGS as SGLANG_SHIPPED_BUGS
from attnfuzz.adapters.vllm.plugin import SHIPPED_BUGS
from attnfuzz.harness.engines import ShippedBug

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "adapters" / "vllm" / "install.sh"
TORCH = os.environ.get("ATTNFUZZ_TORCH", "torch==2.13.0")

RELEASES = (
    "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0",
    "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
)  # fmt: skip
"""Every release of the supported range on the package index."""

EXAMPLE_TIMEOUT = "10m"
"""Per example: generous, so that a loaded machine (runs side by side, a vLLM import
per run) reads as slow, never as a ``timeout`` finding."""

SECTIONS = {
    ("vllm", "bugs"): "bugs",
    ("vllm", "sweep"): "sweep",
    ("vllm", "tests"): "tests",
    ("sglang", "bugs"): "bugs-sglang",
}
"""The section of the docs page each (engine, mode) writes (``releases:SECTION``)."""

# Exit codes of ``attnfuzz run`` (harness.definitions).
PASS, FOUND, USAGE, ERROR, LATENT = 0, 1, 2, 4, 5


FIXES = SHIPPED_BUGS
"""vLLM's own defects that shipped, as the vLLM plugin declares them."""

ENGINE_FIXES: dict[str, tuple[ShippedBug, ...]] = {
    "vllm": FIXES,
    "sglang": SGLANG_SHIPPED_BUGS,
}
"""Each engine's shipped bugs (``--engine``), as its plugin declares them."""

NOT_IN_RANGE = (
    "#36580 (V2 `_compute_slot_mappings_kernel` pads from `num_tokens`): last in 0.17.1, "
    "fixed in 0.18.0, both before the supported range; 0.17.1's `ModelConfig` also refuses "
    "the adapters' tiny model (pydantic validation), so it is caught by its upstream mutant "
    "(`upstream-pr36580-stale-padding`) on the supported releases instead."
)


# -- venvs, one or two at a time ---------------------------------------------------------


def install_script(engine: str) -> Path:
    """The engine's ``install.sh VENV RELEASE``."""
    return ROOT / "adapters" / engine / "install.sh"


def base_venv(root: Path, engine: str = "vllm") -> Path:
    """``root/base`` (vLLM; ``root/base-<engine>`` for another engine): torch (the CPU
    build), attnfuzz from this checkout (editable) and the engine's default pinned
    list, made once; each release's venv is a copy."""
    base = root / ("base" if engine == "vllm" else f"base-{engine}")
    ready = base / ".attnfuzz-ready"
    if not ready.is_file():
        shutil.rmtree(base, ignore_errors=True)
        print(f"making {base} (torch, attnfuzz) ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(base)], check=True)
        pip = [str(base / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, TORCH], check=True)
        subprocess.run([*pip, "-e", str(ROOT)], check=True)
        pinned = install_script(engine).with_name("requirements-cpu.txt")
        subprocess.run([*pip, "--no-deps", "-r", str(pinned)], check=True)
        ready.touch()
    return base


def release_venv(root: Path, release: str, keep: int, engine: str = "vllm") -> Path:
    """``root/<engine>-<release>``, created on first use (a copy of :func:`base_venv`
    with the release installed by the engine's ``install.sh``); the least recently
    used others beyond ``keep`` (of any engine) are removed first, so that the disk
    holds ``keep`` of them at most. Its programs are run as ``venv/bin/python -m ...``
    (a copied venv's scripts still name the base's interpreter)."""
    venv = root / f"{engine}-{release}"
    ready = venv / ".attnfuzz-ready"
    if ready.is_file():
        ready.touch()
        return venv
    base = base_venv(root, engine)
    others = sorted(
        (p for name in ENGINE_FIXES for p in root.glob(f"{name}-*") if p != venv),
        key=lambda p: (
            (p / ".attnfuzz-ready").stat().st_mtime if (p / ".attnfuzz-ready").exists() else 0.0
        ),
    )
    for old in others[: max(0, len(others) - keep + 1)]:
        shutil.rmtree(old)
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    print(f"installing {engine} {release} into {venv} ...", file=sys.stderr, flush=True)
    shutil.copytree(base, venv, symlinks=True)
    (venv / ".attnfuzz-ready").unlink()
    subprocess.run(["bash", str(install_script(engine)), str(venv), release], check=True)
    ready.touch()
    print(f"  done in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return venv


# -- one run -----------------------------------------------------------------------------


@dataclass
class Run:
    code: int
    examples: int | None  # examples to the first failure
    case: str  # the minimized case, in a line
    reach: str  # live / latent / unknown, for a finding: what attnfuzz run computed
    checks: tuple[str, ...]  # the checks the minimized case fails
    detail: str  # the run's last line worth quoting (an unavailable reason, an error)
    seconds: float
    casefile: dict | None = None  # the finding's case file, as attnfuzz run wrote it
    reach_by: str = ""  # reach_fingerprint(engine) when reach was computed


REACH_SOURCES = ("harness/reachability.py", "harness/callers.py", "harness/engines.py",
                 "reference/runner.py")  # fmt: skip
"""What reachability reads besides the engine's own adapters (its sites, callers,
per-release tables and step planning under ``adapters/<engine>/``)."""


def reach_fingerprint(engine: str) -> str:
    """A digest of the declarations a finding's reachability is computed from: a stored
    run whose ``reach_by`` differs was judged by other declarations than this checkout's."""
    digest = hashlib.sha256()
    paths = [ROOT / p for p in REACH_SOURCES]
    paths += sorted((ROOT / "adapters" / engine).rglob("*.py"))
    for path in paths:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def reach_current(stored: dict, engine: str) -> bool:
    """A stored run that is no finding, or whose reachability this checkout computed."""
    return stored["code"] not in (FOUND, LATENT) or stored.get("reach_by") == reach_fingerprint(
        engine
    )


def repro_reach(venv: Path, casefile: dict) -> str | None:
    """The reachability ``attnfuzz repro --json`` computes for a stored case file in the
    release's venv (the computation ``attnfuzz run`` uses); None: it did not say."""
    with tempfile.TemporaryDirectory(prefix="attnfuzz-release-repro-") as out:
        path = Path(out) / "case.json"
        path.write_text(json.dumps(casefile))
        cmd = [str(venv / "bin" / "python"), "-m", "attnfuzz", "repro", str(path), "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out)
        try:
            doc = json.loads(proc.stdout)
        except json.JSONDecodeError:
            return None
        if doc.get("ok", True):
            return None  # it passes on replay: no reachability to table
        return (doc.get("reachability") or {}).get("status", "")


def attnfuzz_run(venv: Path, target: str, impl: str, seed: int, examples: int) -> Run:
    with tempfile.TemporaryDirectory(prefix="attnfuzz-release-run-") as out:
        cmd = [str(venv / "bin" / "python"), "-m", "attnfuzz", "run", "--target", target,
               "--impl", impl, "--seed", str(seed), "--max-examples", str(examples),
               "--example-timeout", EXAMPLE_TIMEOUT, "--out", out]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out)
        seconds = time.monotonic() - started
        text = proc.stdout + proc.stderr
        found = re.search(r"first failure after (\d+) examples", text)
        case, reach, checks, casefile = "", "", (), None
        for path in Path(out).glob("*.json"):
            casefile = json.loads(path.read_text())
            case = describe_case(casefile)
            reach = (casefile.get("reachability") or {}).get("status", "")
            checks = tuple(m["check"] for m in casefile["verdict"].get("mismatches") or ())
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        # The line that says what happened: the verdict, or the refusal or error.
        said = [line for line in lines if line.startswith(("FAIL", "LATENT", "error", "attnfuzz"))]
        detail = "" if proc.returncode == PASS else (said or lines or [""])[0]
        return Run(proc.returncode, int(found.group(1)) if found else None, case, reach,
                   checks, detail, seconds, casefile)  # fmt: skip


def describe_case(doc: dict) -> str:
    """A case file's case in one line: the step, the engine's settings that matter,
    and the first thing that differed."""
    config, batch = doc["case"]["config"], doc["case"]["batch"]
    parts = [f"q_lens {batch['q_lens']}", f"computed {batch['num_computed_tokens']}"]
    # The target's own parameters (spec-indptr's topk, steps, ...): what the bug needs.
    parts += [f"{k} {v}" for k, v in sorted((doc["case"].get("params") or {}).items())]
    parts.append(f"next_n {config['num_spec'] + 1}, block {config['block_size']}")
    parts.append(f"max_model_len {config['max_model_len']}")
    if batch.get("use_cudagraph"):
        parts.append(f"graph {config['cudagraph_mode']} sizes {config['cudagraph_capture_sizes']}")
    mismatches = doc["verdict"].get("mismatches") or []
    if mismatches:
        first = mismatches[0]
        where = first.get("path") or first.get("where") or ""
        parts.append(f"{first['check']} {where}".strip())
    return "; ".join(parts)


def exit_word(code: int) -> str:
    return {PASS: "pass", FOUND: "found", LATENT: "found (latent)", USAGE: "unavailable",
            ERROR: "attnfuzz error"}.get(code, f"exit {code}")  # fmt: skip


# -- the two tables ----------------------------------------------------------------------


def bugs(args: argparse.Namespace) -> list[str]:
    from attnfuzz.harness.definitions import markdown_table

    engine = getattr(args, "engine", "vllm")
    fixes = FIXES if engine == "vllm" else ENGINE_FIXES[engine]
    store = args.venvs / ("bugs.json" if engine == "vllm" else f"bugs-{engine}.json")
    done: dict[str, dict] = json.loads(store.read_text()) if store.is_file() else {}
    rows = []
    # A defect no supported release fixes has no fixed release to run: its own tests and
    # the docs' findings hold it on the newest release.
    for fix in (f for f in fixes if f.first_fixed is not None):
        runs = {}
        for release in (fix.last_buggy, fix.first_fixed):
            keys = [f"{fix.ref} {fix.impl} {release} {seed} {args.max_examples}"
                    for seed in args.seeds]  # fmt: skip
            asked = args.target is None or fix.target in args.target
            # A finding whose reachability other declarations computed: its case file is
            # replayed for it (attnfuzz repro), or, stored without one, it is run again.
            stale = [k for k in keys if k in done and not reach_current(done[k], engine)]
            rerun = [k for k in keys if args.rerun or k not in done
                     or (k in stale and not done[k].get("casefile"))]  # fmt: skip
            if asked and (rerun or stale):
                venv = (
                    release_venv(args.venvs, release, args.keep)
                    if engine == "vllm"
                    else release_venv(args.venvs, release, args.keep, engine)
                )
                for key, seed in zip(keys, args.seeds, strict=True):
                    if key in rerun:
                        run = attnfuzz_run(venv, fix.target, fix.impl, seed, args.max_examples)
                        run.reach_by = reach_fingerprint(engine)
                        done[key] = {**asdict(run), "checks": list(run.checks)}
                    elif key in stale:
                        reach = repro_reach(venv, done[key]["casefile"])
                        if reach is not None:
                            done[key] |= {"reach": reach, "reach_by": reach_fingerprint(engine)}
                    store.write_text(json.dumps(done, indent=1, sort_keys=True))
            if any(key not in done for key in keys):
                break  # not run yet: no row
            runs[release] = [Run(**{**done[k], "checks": tuple(done[k]["checks"])}) for k in keys]
            for run, key in zip(runs[release], keys, strict=True):
                if not reach_current(done[key], engine):  # never tabled as if current
                    run.reach = f"{run.reach or 'unknown'} by earlier declarations"
        if len(runs) < 2:
            continue
        buggy, fixed = runs[fix.last_buggy], runs[fix.first_fixed]
        found = [s for s, r in zip(args.seeds, buggy, strict=True) if is_this_bug(fix, r)]
        first = next((r for r in buggy if is_this_bug(fix, r)), None)
        # The fixed release passes when none of its findings is this bug.
        # Passing is a verdict: a seed that ran no search (unavailable, an error) is none.
        judged = all(r.code in (PASS, FOUND, LATENT) for r in fixed)
        passes = judged and not any(is_this_bug(fix, r) for r in fixed)
        rows.append([
            f"{fix.last_buggy} / {fix.first_fixed}", f"{fix.ref} {fix.target} `{fix.impl}`",
            fix.what,
            f"{len(found)}/{len(args.seeds)} ({', '.join(map(str, found)) or '-'})",
            ", ".join(str(r.examples) for r in buggy if is_this_bug(fix, r)) or "-",
            f"{first.case} ({first.reach})" if first else _why_not(buggy),
            _fixed_cell(args.seeds, fixed, passes),
        ])  # fmt: skip
        print(f"{fix.ref} {fix.target}/{fix.impl}: {rows[-1][3]} found, "
              f"fixed passes: {rows[-1][6]}", file=sys.stderr, flush=True)  # fmt: skip
    header = ["releases (buggy / fixed)", "fix", "bug", "found (seeds)", "examples to failure",
              "minimized case (reachability)", "fixed release passes"]  # fmt: skip
    flag = "" if engine == "vllm" else f" --engine {engine}"
    return [
        f"Seeds {', '.join(map(str, args.seeds))}, {args.max_examples} examples each "
        f"(`python benchmarks/releases.py --venvs DIR{flag} bugs`).",
        "",
        *markdown_table(header, rows).splitlines(),
        "",
        *(f"- {fix.ref} ({fix.target}): {fix.note}." for fix in fixes if fix.note),
        *([f"- Not in the range: {NOT_IN_RANGE}"] if engine == "vllm" else []),
    ]


def is_this_bug(fix: ShippedBug, run: Run) -> bool:
    """A finding whose failed checks are ``fix``'s (any finding, where it names none)."""
    if run.code not in (FOUND, LATENT):
        return False
    return not fix.checks or bool(set(run.checks) & set(fix.checks))


def _fixed_cell(seeds: list[int], runs: list[Run], passes: bool) -> str:
    """'yes', or what the fixed release did at each seed that did not pass."""
    others = [
        f"seed {s}: {exit_word(r.code)} ({', '.join(r.checks) or r.detail})"
        for s, r in zip(seeds, runs, strict=True)
        if r.code != PASS
    ]
    if passes and not others:
        return "yes"
    if not all(r.code in (PASS, FOUND, LATENT) for r in runs):
        return "no verdict: " + "; ".join(others)
    return ("yes, of this bug; " if passes else "no: ") + "; ".join(others)


def _why_not(runs: list[Run]) -> str:
    seen = {f"{exit_word(r.code)} ({', '.join(r.checks) or r.detail})" for r in runs}
    return "not found: " + "; ".join(sorted(seen))


def _sweep_run(venv: Path, examples: int, target: str) -> Run:
    return attnfuzz_run(venv, target, "vllm", 0, examples)


def sweep(args: argparse.Namespace) -> list[str]:
    """Run what ``DIR/sweep.json`` does not hold yet (``--rerun``: all asked for) and
    table every result it holds: a sweep can be run in parts and resumed."""
    from attnfuzz.harness.definitions import markdown_table
    from attnfuzz.harness.registry import target_names

    store = args.venvs / "sweep.json"
    done: dict[str, dict] = json.loads(store.read_text()) if store.is_file() else {}
    releases = args.releases or RELEASES
    for release in releases:
        todo = [
            t for t in args.target or target_names() if args.rerun or f"{release} {t}" not in done
        ]
        if not todo:
            continue
        t0 = time.monotonic()
        venv = release_venv(args.venvs, release, args.keep)
        done[f"{release} install"] = {"seconds": time.monotonic() - t0}
        with ThreadPoolExecutor(args.jobs) as pool:  # each run is its own process
            runs = list(pool.map(functools.partial(_sweep_run, venv, args.sweep_examples), todo))
        for target, r in zip(todo, runs, strict=True):
            done[f"{release} {target}"] = {
                "code": r.code, "reach": r.reach, "checks": list(r.checks),
                "detail": r.detail, "seconds": r.seconds, "jobs": args.jobs,
            }  # fmt: skip
            if r.code != PASS:
                print(f"  {release} {target}: {exit_word(r.code)}: {r.detail}", file=sys.stderr)
        store.write_text(json.dumps(done, indent=1, sort_keys=True))
        print(f"{release}: {len(todo)} runs in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return sweep_table(done, target_names(), markdown_table, args.sweep_examples)


def sweep_table(done: dict[str, dict], targets: list[str], table: Any, examples: int) -> list[str]:
    """The sweep's results, a release per row, a target per column ("-": not run)."""
    rows, total = [], 0.0
    for release in RELEASES:
        cells = []
        for target in targets:
            r = done.get(f"{release} {target}")
            if r is None:
                cells.append("-")
                continue
            total += r["seconds"]
            cell = exit_word(r["code"])
            if r["code"] in (FOUND, LATENT):
                checks = ", ".join(dict.fromkeys(r["checks"]))  # each check once
                cell += f" ({checks}; {r['reach'] or 'no reachability'})"
            cells.append(cell)
        if any(c != "-" for c in cells):
            install = done.get(f"{release} install", {}).get("seconds", 0.0)
            rows.append([release, *cells, f"{install:.0f}s"])
    return [
        f"`attnfuzz run --target T --impl vllm --seed 0 --max-examples {examples}`; the runs' "
        f"times add up to {total / 60:.0f} minutes (`python benchmarks/releases.py --venvs DIR "
        "sweep`, one venv at a time; the install column is copying the base venv and "
        "installing the release; `-`: not run yet).",
        "",
        *table(["release", *targets, "install"], rows).splitlines(),
    ]


_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?)")


def adapter_tests(args: argparse.Namespace) -> list[str]:
    """Run the vllm-marked tests in each release's venv (results kept in
    ``DIR/tests.json``, like the sweep's) and table every result held."""
    store = args.venvs / "tests.json"
    done: dict[str, dict] = json.loads(store.read_text()) if store.is_file() else {}
    for release in args.releases or RELEASES:
        if release in done and not args.rerun:
            continue
        venv = release_venv(args.venvs, release, args.keep)
        python = str(venv / "bin" / "python")
        pip = [python, "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "pytest>=8", "pytest-xdist>=3.5"], check=True)
        started = time.monotonic()
        proc = subprocess.run(
            [python, "-m", "pytest", "-m", "vllm", "-q", "-p", "no:cacheprovider",
             "-n", str(args.jobs), "-rf", "tests"],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        text = proc.stdout + proc.stderr
        summary = text.splitlines()[-1] if text else ""
        counts = {word.rstrip("s"): int(n) for n, word in _COUNTS.findall(summary)}
        failed = re.findall(r"^FAILED (\S+)", text, flags=re.M)
        done[release] = {"code": proc.returncode, "counts": counts, "failed": failed,
                         "seconds": time.monotonic() - started, "jobs": args.jobs}  # fmt: skip
        store.write_text(json.dumps(done, indent=1, sort_keys=True))
        print(f"{release}: exit {proc.returncode} {counts}", file=sys.stderr, flush=True)
    from attnfuzz.harness.definitions import markdown_table

    rows = []
    for release in RELEASES:
        r = done.get(release)
        if r is None:
            continue
        c = r["counts"]
        rows.append([release, str(c.get("passed", 0)), str(c.get("skipped", 0)),
                     str(c.get("failed", 0) + c.get("error", 0)),
                     ", ".join(r["failed"]) or "-", f"{r['seconds'] / 60:.0f} min"])  # fmt: skip
    return [
        "`pytest -m vllm tests` in each release's venv (`python benchmarks/releases.py "
        "--venvs DIR tests`); a skip names the release difference that makes a test "
        "not apply.",
        "",
        *markdown_table(
            ["release", "passed", "skipped", "failed", "failing", "time"], rows
        ).splitlines(),  # fmt: skip
    ]


def write_section(path: Path, mode: str, lines: list[str]) -> None:
    """Replace the lines between ``<!-- releases:MODE:begin -->`` and ``...:end -->``."""
    from _markdown import write_section as write

    write(path, "releases", mode, lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=("bugs", "sweep", "tests"), default="bugs")
    parser.add_argument("--venvs", type=Path, required=True, help="cached venvs go here")
    parser.add_argument(
        "--engine", choices=tuple(ENGINE_FIXES), default="vllm", help="bugs: whose shipped bugs"
    )
    parser.add_argument("--keep", type=int, default=2, help="venvs kept on disk at most")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-examples", type=int, default=1000)
    parser.add_argument("--sweep-examples", type=int, default=200)
    parser.add_argument("--releases", nargs="+", choices=RELEASES, default=None)
    parser.add_argument("--target", action="append", default=None)
    parser.add_argument("--jobs", type=int, default=1, help="sweep, tests: runs at a time")
    parser.add_argument(
        "--rerun", action="store_true", help="sweep, tests: run again what is stored"
    )
    parser.add_argument(
        "--markdown", "--write", dest="write", type=Path, default=None, help="docs page to update"
    )
    args = parser.parse_args()
    if args.engine != "vllm" and args.mode != "bugs":
        parser.error(f"--engine {args.engine}: only the bugs mode (sweep and tests are vLLM's)")
    args.venvs.mkdir(parents=True, exist_ok=True)
    modes = {"bugs": bugs, "sweep": sweep, "tests": adapter_tests}
    lines = modes[args.mode](args)
    print("\n".join(lines))
    if args.write is not None:
        section = SECTIONS[args.engine, args.mode]
        write_section(args.write, section, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
