"""Where a finding on engine code can happen in production: per model runner and cudagraph mode.

A target says where its engine code runs (``Target.runs_in``):

- ``builder``: a metadata builder or helper of one; it runs eagerly, in Python,
  every step, before any graph replays;
- ``runner``: the model runner's own preparation (padding, slot mappings, block
  tables); it too runs every step;
- ``forward``: attention or indexer glue inside the model's forward; its Python
  runs on eager (NONE) and PIECEWISE steps (attention is a splitting op there)
  and while a FULL graph is captured, never when a FULL graph replays.

For each (runner, cudagraph mode) the backend's support keeps, the case's step
is planned by the engine's own decision code where the engine is installed
(its plugin's :attr:`~attnfuzz.harness.engines.Engine.planner`), else by
:mod:`attnfuzz.reference.runner`,
and the implementation is judged where its Python runs on that step: on the
step itself, or, for ``forward`` code on a FULL step, on the dummy step the
graph is captured on. A finding is **live** when some such judgement fails,
**latent** when it fails only on metadata that only a FULL replay sees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnfuzz.harness import engines
from attnfuzz.harness.callers import (
    Callee,
    admitted_runners,
    callers_of,
    describe_refusal,
    mode_limits,
    package_root,
    runner_limits,
)
from attnfuzz.harness.errors import PlannerRefuses, PlannerUnbound
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner import (
    RUNNERS,
    StepPlan,
    allowed_modes,
    capture_batches,
    separate_routine,
    step_plan,
)

RUNS_IN = ("builder", "runner", "forward")
LIVE, LATENT, UNKNOWN = "live", "latent", "unknown"
_REPLAY_NOTE = "a FULL graph replays: the Python of forward does not run"
_WHERE_PYTHON_RUNS = (
    "vllm/v1/cudagraph_dispatcher.py (CudagraphDispatcher: PIECEWISE graphs split at "
    "attention, FULL graphs replay it); vllm/v1/worker/gpu_model_runner.py: "
    "GPUModelRunner._dummy_run (capture on uniform dummy steps)"
)


@dataclass(frozen=True)
class Pair:
    """One (runner, cudagraph mode): the step the engine runs there and the verdict."""

    runner: str
    cudagraph_mode: str
    step: str  # NONE, PIECEWISE, FULL (code run every step), FULL replay, FULL capture
    python_runs: bool
    fails: bool | None  # None: not judged (the Python does not run)
    note: str = ""

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if not self.note:
            del d["note"]
        return d


@dataclass(frozen=True)
class Reachability:
    status: str  # LIVE, LATENT or UNKNOWN
    runs_in: str
    pairs: tuple[Pair, ...]
    reason: str
    decided_by: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "runs_in": self.runs_in,
            "reason": self.reason,
            "decided_by": list(self.decided_by),
            "pairs": [p.to_dict() for p in self.pairs],
        }

    def lines(self) -> list[str]:
        """What ``run`` and ``repro`` print under a finding."""
        return reachability_lines(self.to_dict())


def is_latent(reach: Reachability | dict | None) -> bool:
    """A reachability (or its ``to_dict``, as case files hold it) that is latent."""
    if isinstance(reach, Reachability):
        return reach.status == LATENT
    return reach is not None and reach["status"] == LATENT


def reachability_lines(d: dict) -> list[str]:
    """The printed form of a reachability (``Reachability.to_dict``, as case files hold it)."""
    out = [f"reachability: {d['status'].upper()}: {d['reason']}"]
    for p in d["pairs"]:
        verdict = "-" if p["fails"] is None else ("fails" if p["fails"] else "passes")
        note = f"  ({p['note']})" if p.get("note") else ""
        out.append(f"  {p['runner']} {p['cudagraph_mode']:<18} {p['step']:<13} {verdict}{note}")
    out.extend(f"  decided by {x}" for x in d.get("decided_by", ()))
    return out


def engine_planner(engine: str | None) -> Callable[[object, Batch], StepPlan]:
    """The engine's own step planner where it is installed, else the reference's;
    :class:`PlannerUnbound` where it is installed but its planner cannot bind."""
    declared = engines.get(engine) if engine is not None else None
    if declared is None or declared.planner is None or declared.unavailable() is not None:
        return step_plan
    return declared.planner()


def _capture_case(case: Case, step: StepPlan) -> Case | None:
    """The dummy step the FULL graph of ``step`` is captured on (every request new)."""
    for key, q_lens in capture_batches(case.config):
        if key.num_tokens == step.num_tokens_padded and key.num_reqs in (
            None,
            step.num_reqs_padded,
        ):
            batch = Batch((0,) * len(q_lens), q_lens, seed=case.batch.seed)
            return dataclasses.replace(case, batch=batch)
    return None


def reachability(
    case: Case,
    runs_in: str,
    judge_fails: Callable[[Case], bool],
    refused: Callable[[Case], bool],
    engine: str | None = None,
    callee: Callee | None = None,
    version: str | None = None,
    as_run: Callable[[EngineConfig, Batch], Batch] | None = None,
) -> Reachability:
    """The (runner, mode) pairs in which the engine runs the faulting code on this
    step's metadata; ``judge_fails(case)`` judges the implementation, ``refused(case)``
    says a case is not one the target can judge (its invariants, its backends). A pair
    the engine's planner refuses (:class:`PlannerRefuses`) is left out, named in the reason.
    ``callee``: the engine function whose arguments the case draws; only the runners and
    cudagraph modes under which some call in the installed release (``version``, where
    given) passes the case's values are planned, a FULL step is judged unpadded where
    that configuration pads no request, and the configuration those calls need is named
    (:mod:`attnfuzz.harness.callers`). ``as_run``: the step as the engine runs it
    (:attr:`Implementation.as_run`), which each pair's mode is planned on."""
    plan = engine_planner(engine)
    config = case.config
    ran = case.batch if as_run is None else as_run(config, case.batch)
    pairs: list[Pair] = []
    not_run: list[str] = []  # pairs the installed engine does not run, with why
    runners: list[str] = list(RUNNERS)
    found = None
    if callee is not None and package_root(callee.package) is not None:
        params = dict(case.params)
        found = callers_of(callee, params, version)
        if not found.admitting:
            why = describe_refusal(found, params) + ": no configuration reaches this case"
            return Reachability(UNKNOWN, runs_in, (), why, (f"{callee.package} call sites",))
        runners = admitted_runners(found, RUNNERS)
        for runner in RUNNERS:
            if runner not in runners:
                not_run.append(
                    f"{runner} (the calls that pass these arguments need "
                    f"{' or '.join(runner_limits(found))}, which runs on "
                    f"{', '.join(runners) or 'no runner'} only)"
                )
    refused_modes: dict[str, list[str]] = {}  # per runner, the modes the calls' config refuses
    for runner in runners:
        for mode in allowed_modes(config.cg_support, config.next_n):
            varlen = config.varlen_decode and runner == "v2" and separate_routine(mode)
            cfg = dataclasses.replace(
                config, runner=runner, cudagraph_mode=mode, varlen_decode=varlen
            )
            here = dataclasses.replace(case, config=cfg)
            if refused(here):
                continue
            if found is not None and not found.allows(runner, mode):
                refused_modes.setdefault(runner, []).append(mode)
                continue
            try:
                step = plan(cfg, case.batch if as_run is None else as_run(cfg, case.batch))
            except PlannerRefuses as err:
                not_run.append(f"{runner} {mode} ({err})")
                continue
            if (
                step.mode == "FULL" and found is not None and not found.pads_requests(runner, mode)
            ):  # the step runs at the graph's sizes, its request count unpadded
                unpadded = dataclasses.replace(case.batch, use_cudagraph=False)
                alone = dataclasses.replace(here, batch=unpadded)
                note = "the calls' configuration pads no request there"
                pairs.append(Pair(runner, mode, "FULL unpadded", True, judge_fails(alone), note))
            elif step.mode == "FULL" and runs_in == "forward":
                pairs.append(Pair(runner, mode, "FULL replay", False, None, _REPLAY_NOTE))
                captured = _capture_case(here, step)
                if captured is not None and not refused(captured):
                    pairs.append(
                        Pair(
                            runner,
                            mode,
                            "FULL capture",
                            True,
                            judge_fails(captured),
                            "the graph's dummy step",
                        )
                    )
            else:
                pairs.append(Pair(runner, mode, step.mode, True, judge_fails(here)))
    for runner, modes in refused_modes.items():
        not_run.append(f"{runner} {', '.join(modes)} ({_modes_refused(found, runner)})")
    live = [p for p in pairs if p.python_runs and p.fails]
    served = _served(engine, {p.runner for p in live})
    if live:
        where = ", ".join(f"{p.runner} {p.cudagraph_mode} ({p.step})" for p in live)
        reason = f"the engine runs the faulting {runs_in} code on this step in {where}"
        reason += f"; {served[1]}" if served else ""
        status = LIVE
    elif refused_modes and not any(p.step == "FULL replay" for p in pairs):
        reason = (
            f"on every step where the engine runs this {runs_in} code with these arguments "
            "(under the cudagraph modes their configuration is accepted with) it passes"
        )
        status = LATENT
    else:
        reason = (
            f"the {runs_in} code fails only on metadata built for a FULL graph replay, where "
            "its Python does not run; on every step where it runs (eager, PIECEWISE, the "
            "capture's dummy steps) it passes"
        )
        status = LATENT
    if found is not None:
        release = f" ({callee.package} {found.version})" if found.version else ""
        reason += f"; with {' or '.join(found.configurations())}{release}"
    if not_run:
        engine_here = "the installed engine"
        if found is not None and found.version:
            engine_here = f"{found.callee.package} {found.version}"
        skipped = f"{engine_here} does not run {'; '.join(not_run)}"
        reason, status = (f"{reason}; {skipped}", status) if pairs else (skipped, UNKNOWN)
    decided = (plan.__module__ + "." + plan.__qualname__,)
    decided += (served[0],) if served else ()
    if found is not None:
        decided += tuple(found.decided_by())
    decided += tuple(step_plan(config, ran).decided_by)
    if runs_in == "forward":
        decided += (_WHERE_PYTHON_RUNS,)
    return Reachability(status, runs_in, tuple(pairs), reason, decided)


def _served(engine: str | None, runners: set[str]) -> tuple[str, str] | None:
    """Where every runner a finding is live on is one the installed release serves only
    when configured so (:attr:`Engine.runners`): the function that read it, and what
    the reason adds (each runner's configuration, the default named)."""
    declared = engines.get(engine) if engine is not None else None
    if not runners or declared is None or declared.runners is None:
        return None
    if declared.unavailable() is not None:
        return None
    how = declared.runners()
    if not how or any(how.get(r) == engines.DEFAULT_RUNNER for r in runners):
        return None
    release = f"{declared.name} {declared.installed_version()}"
    default = [r for r, h in how.items() if h == engines.DEFAULT_RUNNER]
    said = "; ".join(f"{release} serves {r} only with {how.get(r, 'no known configuration')}"
                     for r in sorted(runners))  # fmt: skip
    if default:
        said += f" ({' and '.join(default)} unless told otherwise)"
    getter = declared.runners
    return f"{getter.__module__}.{getter.__qualname__}", said


def _modes_refused(found: Any, runner: str) -> str:
    """Why no call that passes the case's arguments runs under a mode on ``runner``."""
    kept = found.modes_on(runner)
    need = " or ".join(mode_limits(found)) or "their configuration"
    where = f"{found.callee.package} {found.version}" if found.version else "the engine"
    return f"the calls that pass these arguments need {need}, with which {where} accepts " + (
        f"cudagraph_mode {', '.join(kept)} only" if kept else "no cudagraph mode"
    )


def site_reachability(
    case: Case,
    runs_in: str,
    judge_fails: Callable[[Case], bool],
    sites: Any,
    refused: Callable[[Case], bool] = lambda c: False,
) -> Reachability:
    """Reachability for an engine that declares where its code runs (:class:`Site`):
    a site holds where the installed release's caller still names the callee; the
    case is judged as the step that site runs."""
    import importlib
    import inspect

    pairs: list[Pair] = []
    gone: list[tuple[Any, str]] = []
    decided: list[str] = []
    for site in sites:  # alternatives for one (runner, step): each release's caller
        module, _, qualname = site.caller.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for name in qualname.split("."):
                obj = getattr(obj, name)
            holds = site.callee in inspect.getsource(obj)
        except (ImportError, AttributeError, OSError, TypeError) as err:
            gone.append((site, f"{site.caller} ({type(err).__name__}: {err})"))
            continue
        if not holds:
            gone.append((site, f"{site.caller} no longer calls {site.callee}"))
            continue
        decided.append(f"{site.caller} calls {site.callee}")
        here = case
        if site.graph is not None:
            batch = dataclasses.replace(case.batch, use_cudagraph=site.graph)
            here = dataclasses.replace(case, batch=batch)
        if refused(here):  # a step this target cannot be: that site never sees this case
            continue
        mode = {True: "graph", False: "eager", None: "as drawn"}[site.graph]
        pairs.append(Pair(site.runner, mode, site.step, True, judge_fails(here), site.note))
    live = [p for p in pairs if p.fails]
    if live:
        where = ", ".join(f"{p.runner} ({p.step})" for p in live)
        status, reason = (
            LIVE,
            f"the engine runs the faulting {runs_in} code on this step in {where}",
        )
    elif pairs:
        status = LATENT
        reason = "it passes at every site where the engine runs this code on such a step"
    else:
        status, reason = UNKNOWN, "no site of this code holds in the installed release"
    held = {(p.runner, p.step) for p in pairs}
    gone_here = [why for site, why in gone if (site.runner, site.step) not in held]
    if gone_here:  # another release's site of a step that holds here is not named
        reason += "; not a site in the installed release: " + "; ".join(gone_here)
    return Reachability(status, runs_in, tuple(pairs), reason, tuple(decided))


def finding_reachability(
    target: Any, impl: Any, case: Case, judge: Callable[[Case], Any]
) -> Reachability | None:
    """The reachability of a finding of ``impl`` on ``case``; None for attnfuzz's own
    code. ``judge(case)`` returns a verdict (the run's isolated judge). A fault of
    attnfuzz's while computing it leaves the finding as found, its reachability
    ``unknown`` with the reason; so does a time budget that ends first."""
    from attnfuzz.harness.isolation import OutOfTime
    from attnfuzz.harness.target import InvalidCase

    if impl.engine is None:
        return None

    def refused(c: Case) -> bool:
        try:
            target.refuse_invalid(c)
            target.refuse_unfixed(impl, c)
        except InvalidCase:
            return True
        return False

    def fails(c: Case) -> bool:
        return not judge(c).ok

    declared = engines.get(impl.engine)
    try:
        if declared is not None and declared.sites is not None:
            sites = declared.sites(target.name, impl.name)
            return site_reachability(case, target.runs_in, fails, sites, refused)
        callee = None
        if declared is not None and declared.callers is not None:
            callee = declared.callers(target.name, impl.name)
        return reachability(
            case, target.runs_in, fails, refused, impl.engine, callee, as_run=impl.as_run
        )
    except OutOfTime:
        why = "not computed: the time budget ended first (attnfuzz repro of the case computes it)"
        return Reachability(UNKNOWN, target.runs_in, (), why)
    except PlannerUnbound as err:
        why = f"not computed: the installed engine's step planning cannot be driven: {err}"
        return Reachability(UNKNOWN, target.runs_in, (), why)
    except Exception as err:  # noqa: BLE001 (the finding stands; only where it happens is unknown)
        why = f"not computed: attnfuzz error: {type(err).__name__}: {err}"
        return Reachability(UNKNOWN, target.runs_in, (), why)
