"""The published JSON Schemas: valid schemas, in step with the code, strict about types."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from attnfuzz.harness import schemas
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.testing import hand_case
from attnfuzz.reference.batch import FLOAT_DTYPES, Batch, EngineConfig


def _case_doc() -> dict:
    from attnfuzz.harness.casefile import case_document

    case = hand_case((2, 2), (5, 7), num_spec=1)
    # A JSON round trip: the document as a reader sees it.
    return json.loads(json.dumps(case_document("mtp-seq-lens", "triton", case, Verdict([]))))


def test_schemas_are_valid_draft_2020_12_schemas() -> None:
    from jsonschema import Draft202012Validator

    for name in schemas.SCHEMA_FILES:
        Draft202012Validator.check_schema(schemas.schema(name))


def test_case_schema_names_exactly_the_fields_of_the_case() -> None:
    case = schemas.schema("case")
    body, defs = case["properties"]["case"]["properties"], case["$defs"]
    trace = case["properties"]["trace"]["properties"]
    # A case and a trace's steps share the definitions of a config and a batch.
    assert body["config"] == trace["config"] == {"$ref": "#/$defs/config"}
    assert body["batch"] == trace["steps"]["items"] == {"$ref": "#/$defs/batch"}
    assert set(defs["config"]["properties"]) == {f.name for f in dataclasses.fields(EngineConfig)}
    assert set(defs["batch"]["properties"]) == {f.name for f in dataclasses.fields(Batch)}
    dtypes = schemas.schema("case")["properties"]["settings"]["properties"]["dtype"]["enum"]
    assert sorted(dtypes) == sorted(FLOAT_DTYPES)


def test_campaign_schema_enumerates_the_documents_kinds_and_statuses() -> None:
    from attnfuzz.harness.definitions import KINDS, STATUSES

    run = schemas.schema("campaign")["$defs"]["run"]["properties"]
    assert run["kind"]["enum"] == list(KINDS)
    assert run["status"]["enum"] == list(STATUSES)


def test_a_written_case_file_conforms() -> None:
    assert schemas.errors(_case_doc(), "case") == []


def test_a_trace_case_file_conforms_and_holds_a_case_or_a_trace() -> None:
    from attnfuzz.reference.trace import Trace

    doc = _case_doc()
    trace = Trace.of_case(hand_case((2, 2), (5, 7), num_spec=1)).to_dict()
    traced = {k: v for k, v in doc.items() if k != "case"} | {"trace": trace, "step": 0}
    assert schemas.errors(traced, "case") == []
    assert schemas.errors(doc | {"trace": trace}, "case") != []  # both
    assert schemas.errors({k: v for k, v in doc.items() if k != "case"}, "case") != []  # none


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d["case"]["config"].update(topk=True), "$.case.config.topk: True is not of"),
        (lambda d: d["case"]["config"].update(topk=2.0), "$.case.config.topk: 2.0 is not of"),
        (lambda d: d["case"]["batch"].update(q_lens="2"), "$.case.batch.q_lens: '2' is not of"),
        (lambda d: d["case"]["batch"].update(seeds=1), "('seeds' was unexpected)"),
        (lambda d: d["case"]["config"].update(block_size=2**31), "is greater than the maximum"),
        (lambda d: d["settings"].update(example_timeout=math.nan), "nan is not of type 'number'"),
        (lambda d: d["settings"].update(dtype="float64"), "'float64' is not one of"),
        (lambda d: d.update(engine={"name": "vllm"}), "'version' is a required property"),
        (lambda d: d.pop("target"), "$: 'target' is a required property"),
    ],
)
def test_a_broken_case_file_is_one_line_naming_where(edit, says: str) -> None:
    doc = _case_doc()
    edit(doc)
    with pytest.raises(UsageError) as err:
        schemas.validate(doc, "case", "bad.json")
    message = str(err.value)
    assert message.startswith("bad.json: $")
    assert says in message
    assert "\n" not in message


def test_a_long_offending_value_is_shortened() -> None:
    doc = _case_doc()
    doc["case"]["batch"]["q_lens"] = ["x" * 10_000]
    with pytest.raises(UsageError) as err:
        schemas.validate(doc, "case", "bad.json")
    assert len(str(err.value)) < 300
