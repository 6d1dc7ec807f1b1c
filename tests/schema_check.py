"""`validate(instance, schema)`: `jsonschema.validate` with each schema checked once per test process.

`jsonschema.validate` checks the schema itself against its meta-schema at every call, which costs
more than validating a document; a test validating each event of a `watch` stream paid it per
event. Here the schema is checked the first time it is seen (an invalid schema still raises
`jsonschema.SchemaError`), its validator kept, and an invalid instance raises the same
`jsonschema.ValidationError` (the best match of its errors) that `jsonschema.validate` raises.
"""

from __future__ import annotations

import json

import jsonschema
from jsonschema.exceptions import best_match

_VALIDATORS: dict[str, jsonschema.protocols.Validator] = {}


def validate(instance, schema: dict, cls: type | None = None) -> None:
    """Raise `jsonschema.ValidationError` when `instance` does not match `schema` (with `cls`, else the
    validator its `$schema` names)."""
    key = json.dumps([cls.__name__ if cls else None, schema], sort_keys=True)
    validator = _VALIDATORS.get(key)
    if validator is None:
        chosen = cls or jsonschema.validators.validator_for(schema)
        chosen.check_schema(schema)
        validator = _VALIDATORS[key] = chosen(schema)
    error = best_match(validator.iter_errors(instance))
    if error is not None:
        raise error
