"""The published JSON Schemas of attnfuzz's documents, and the one validator that reads them.

``case.schema.json`` describes a case file (``attnfuzz.case/1``) and
``campaign.schema.json`` a campaign document (``attnfuzz.campaign/1``); both
ship with the package, for other tools to validate against. The readers of
those documents (:func:`attnfuzz.harness.casefile.read_case`,
:func:`attnfuzz.reports.document.load_campaign`) check the structure with
:func:`validate`; what no schema can say (a run naming a finding that exists,
a case the engine could produce) stays in code next to them.

JSON's types are read strictly: an integer is a JSON integer (not ``true``,
not ``2.0``) and a number is finite, so that a value that would replay as
another case, or render as ``nan``, is refused before anything is built.
"""

from __future__ import annotations

import json
import math
import reprlib
from functools import cache
from importlib import resources
from typing import Any

from attnfuzz.harness.errors import UsageError

SCHEMA_FILES = {"case": "case.schema.json", "campaign": "campaign.schema.json"}

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60


@cache
def schema(name: str) -> dict[str, Any]:
    """The JSON Schema ``name`` (``"case"`` or ``"campaign"``) as a dict."""
    text = resources.files(__package__).joinpath(SCHEMA_FILES[name]).read_text()
    return json.loads(text)


def _is_integer(_checker: Any, value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(_checker: Any, value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@cache
def _validator(name: str) -> Any:
    from jsonschema import Draft202012Validator, validators  # on first use: imports are slow

    checker = Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_integer, "number": _is_number}
    )
    strict = validators.extend(Draft202012Validator, type_checker=checker)
    strict.check_schema(schema(name))
    return strict(schema(name))


def errors(doc: Any, name: str) -> list[str]:
    """Every way ``doc`` breaks schema ``name``, one line each (``$.path: message``)."""
    found = sorted(_validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [_line(e) for e in found]


def validate(doc: Any, name: str, where: str) -> None:
    """Raise a one-line :class:`UsageError` (``where: $.path: message``) for the most
    relevant way ``doc`` breaks schema ``name``; return quietly when it conforms."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator(name).iter_errors(doc))
    if error is not None:
        raise UsageError(f"{where}: {_line(error)}")


def _line(error: Any) -> str:
    # jsonschema quotes the whole offending value: keep the message to one short line,
    # the reason before the value (a line cut short keeps the reason).
    message = error.message
    if len(message) > 200:
        message = f"does not match the schema ({error.validator}): {_SHORT.repr(error.instance)}"
    return f"{error.json_path}: {message}".replace("\n", " ")
