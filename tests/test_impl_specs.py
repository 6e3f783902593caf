"""``TARGET=IMPL`` names an implementation of one target, wherever one is named.

A user's ``module:attribute`` is written for one target's inputs: a campaign
over several targets must not run it on the others (each would read
``FAIL [exception:AttributeError]``), so there it needs its target.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from attnfuzz.harness import campaign as cp
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import EXIT_OK, EXIT_USAGE
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.registry import split_impl_spec

TESTS = Path(__file__).parent
ID = "indexer-decode"


@pytest.fixture
def impls(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


@pytest.mark.parametrize(
    "spec, pair",
    [
        ("triton", (None, "triton")),
        ("pkg.mod:fn", (None, "pkg.mod:fn")),
        ("slot-mapping=pkg.mod:fn", ("slot-mapping", "pkg.mod:fn")),
        ("indexer-decode=triton", ("indexer-decode", "triton")),
        ("pkg.mod:make(a=1)", (None, "pkg.mod:make(a=1)")),  # "=" after the ":" names no target
    ],
)
def test_split_impl_spec(spec, pair):
    assert split_impl_spec(spec) == pair


@pytest.mark.parametrize("spec", ["=triton", "indexer-decode="])
def test_a_half_pair_is_refused(spec):
    with pytest.raises(UsageError, match="expected TARGET=IMPL"):
        split_impl_spec(spec)


def test_a_named_user_implementation_runs_on_its_target_alone(impls):
    units = cp.plan_units(None, [f"{ID}=campaign_impls:raises"], zoo=False)
    assert units == [cp.Unit(ID, "campaign_impls:raises", "user")]
    units = cp.plan_units(None, [f"{ID}=campaign_impls:raises", "mtp-seq-lens=triton"], zoo=False)
    assert [(u.target, u.impl) for u in units] == [
        (ID, "campaign_impls:raises"),
        ("mtp-seq-lens", "triton"),
    ]


def test_a_bare_user_implementation_in_a_campaign_of_several_targets_is_refused(impls):
    with pytest.raises(UsageError, match=r"written for one target's inputs.*e\.g\. "):
        cp.plan_units(None, ["campaign_impls:raises"], zoo=False)
    # One selected target: the bare form is unambiguous.
    assert cp.plan_units([ID], ["campaign_impls:raises"], zoo=False)


def test_a_pair_outside_the_selected_targets_is_refused(impls):
    with pytest.raises(UsageError, match="not among --targets"):
        cp.plan_units(["mtp-seq-lens"], [f"{ID}=campaign_impls:raises"], zoo=False)


def test_campaign_command_line_refuses_the_bare_form_in_one_line(tmp_path, impls, capsys):
    code = main(["campaign", "--impls", "campaign_impls:raises", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE and len(err) == 1
    assert "e.g. decode-split=campaign_impls:raises" in err[0]


def test_run_takes_the_target_from_the_pair(tmp_path, capsys):
    code = main(
        ["run", "--impl", f"{ID}=reference", "--seed", "0", "--max-examples", "3",
         "--out", str(tmp_path / "cases"), "--db", str(tmp_path / "db")]
    )  # fmt: skip
    assert code == EXIT_OK
    assert capsys.readouterr().out.startswith(f"{ID} / reference: ")
    code = main(["run", "--target", "mtp-seq-lens", "--impl", f"{ID}=reference"])
    assert code == EXIT_USAGE
    assert "names target indexer-decode, --target mtp-seq-lens" in capsys.readouterr().err
