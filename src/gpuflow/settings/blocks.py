"""Step settings: one family's part of the schema, split into results and runtime keys."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from gpuflow.errors import ConfigError
from gpuflow.settings.validate import DefaultingValidator, config_error, config_schema, merge_config

KINDS = ("results", "runtime")


def family_schema(family: str) -> dict[str, Any]:
    """The schema of config[family], references inlined."""
    return config_schema()["properties"][family]


def _child(schema: dict[str, Any], name: str) -> dict[str, Any] | None:
    child = schema.get("properties", {}).get(name)
    if child is None and isinstance(schema.get("additionalProperties"), dict):
        child = schema["additionalProperties"]
    return child


def _is_object(schema: dict[str, Any]) -> bool:
    return "properties" in schema or isinstance(schema.get("additionalProperties"), dict)


def applies(child: dict[str, Any], siblings: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether key `child` is read, given its `siblings`' values (`x-applies-when`)."""
    properties = schema.get("properties", {})
    return all(
        siblings.get(name, properties.get(name, {}).get("default")) in allowed
        for name, allowed in child.get("x-applies-when", {}).items()
    )


def select(
    values: dict[str, Any],
    schema: dict[str, Any],
    kind: str,
    applicable_only: bool = True,
    inherited: str = "results",
) -> dict[str, Any]:
    """The part of `values` whose keys the schema marks `kind` (nested objects kept nested)."""
    inherited = schema.get("x-affects", inherited)
    kept: dict[str, Any] = {}
    for name, value in values.items():
        child = _child(schema, name)
        if child is None or (applicable_only and not applies(child, values, schema)):
            continue
        mark = child.get("x-affects", inherited)
        if _is_object(child) and isinstance(value, dict):
            part = select(value, child, kind, applicable_only, mark)
            if part or (mark == kind and not value):
                kept[name] = part
        elif mark == kind:
            kept[name] = value
    return kept


def keys_of_kind(
    schema: dict[str, Any], kind: str, prefix: tuple[str, ...] = (), inherited: str = "results"
) -> Iterator[tuple[str, ...]]:
    """Paths (tuples) of every leaf key the schema marks `kind` (`*`: any entry name)."""
    children = dict(schema.get("properties", {}))
    if isinstance(schema.get("additionalProperties"), dict):
        children["*"] = schema["additionalProperties"]
    for name, child in children.items():
        mark = child.get("x-affects", inherited)
        if _is_object(child):
            yield from keys_of_kind(child, kind, (*prefix, name), mark)
        elif mark == kind:
            yield (*prefix, name)


def results_of(family: str, values: dict[str, Any]) -> dict[str, Any]:
    """The part of config[family] `values` that a job's numbers depend on (results keys)."""
    return select(values, family_schema(family), "results")


def split_json(
    family: str, values: dict[str, Any], kind: str, job_settings: dict[str, Any] | None = None
) -> str:
    """The `kind` keys of a family's config part as sorted JSON, with its `telemetry` part."""
    kept = select(values, family_schema(family), kind)
    job_part = select(job_settings or {}, family_schema("telemetry"), kind)
    if job_part:
        kept["telemetry"] = job_part
    return json.dumps(kept, sort_keys=True, separators=(",", ":"))


def _parse(text: str, key: str) -> dict[str, Any]:
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(key, f"not valid JSON ({error})", "a JSON object") from None
    if not isinstance(values, dict):
        raise ConfigError(key, f"got {type(values).__name__}", "a JSON object")
    return values


def _check_kind(values: dict[str, Any], family: str, kind: str, option: str) -> None:
    schema = family_schema(family)
    other = select(values, schema, KINDS[1 - KINDS.index(kind)], applicable_only=False)
    if other:
        path = _first_path(other)
        raise ConfigError(
            f"{family}.{path}", f"is not a {kind} key", f"it belongs in the other of {option}"
        )


def _first_path(values: dict[str, Any]) -> str:
    name, value = next(iter(values.items()))
    return f"{name}.{_first_path(value)}" if isinstance(value, dict) and value else name


def family_settings(family: str, settings: str = "{}", runtime: str = "{}") -> dict[str, Any]:
    """config[family] from a step's `--settings` (results keys) and `--runtime` JSON, defaulted."""
    results_part = _parse(settings, f"{family} --settings")
    runtime_part = _parse(runtime, f"{family} --runtime")
    _check_kind(results_part, family, "results", "--settings/--runtime")
    _check_kind(runtime_part, family, "runtime", "--settings/--runtime")
    values = merge_config(results_part, runtime_part)
    defaulted(values, family)
    return values


def configuration(scaling: dict[str, Any], name: str) -> dict[str, Any]:
    """Configuration `name` of a defaulted config['scaling'], or a ConfigError naming it."""
    if name not in scaling["configurations"]:
        known = sorted(scaling["configurations"])
        raise ConfigError(f"scaling.configurations.{name}", "missing", f"one of {known}")
    return scaling["configurations"][name]


def defaulted(values: dict[str, Any], family: str) -> dict[str, Any]:
    """`values` of config[family] with the schema's defaults filled in (in place)."""
    errors = sorted(
        DefaultingValidator(family_schema(family)).iter_errors(values),
        key=lambda e: list(e.path),
    )
    if not errors:
        return values
    error = errors[0]
    where = ".".join([family, *map(str, error.absolute_path)])
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        known = sorted(error.schema.get("properties", {}))
        raise ConfigError(f"{where}.{unknown[0]}", "unknown key", f"one of {known}")
    named = config_error(error)
    raise ConfigError(where, named.problem, named.expected)


def block_settings(family: str, block: tuple[str, ...], text: str) -> dict[str, Any]:
    """One block of config[family] (e.g. `fluency.stats`) from its JSON, defaulted."""
    key = ".".join((family, *block))
    nested = _parse(text, key)
    for name in reversed(block):
        nested = {name: nested}
    defaulted(nested, family)
    for name in block:
        nested = nested[name]
    return nested
