"""Validate a workflow config against src/gpuflow/settings/schemas/, filling in every default."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema

from gpuflow.errors import ConfigError
from gpuflow.settings.files import check_finite_numbers, read_config_file, safe_yaml
from gpuflow.settings.resources import check_resources

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"


def load_schema(path: str | Path) -> dict[str, Any]:
    """A schema file with every relative `$ref` inlined; a fresh copy each call."""
    return json.loads(_inlined_schema(Path(path).resolve()))


@cache
def config_schema() -> dict[str, Any]:
    """The config's schema, references inlined, read once per process (not to be changed)."""
    return load_schema(SCHEMA_DIR / "config.schema.yaml")


def schema_families() -> list[str]:
    """The experiment families the schema knows."""
    return list(config_schema()["properties"]["families"]["items"]["enum"])


def family_modules(name: str) -> list[ModuleType]:
    """Each family's `gpuflow.<family>.<name>` module, where it has one."""
    found = []
    for family in schema_families():
        package = f"gpuflow.{family}"
        if importlib.util.find_spec(package) and importlib.util.find_spec(f"{package}.{name}"):
            found.append(importlib.import_module(f"{package}.{name}"))
    return found


@cache
def _inlined_schema(path: Path) -> str:
    # through libyaml (safe_yaml): the pure-Python loader took 0.08 s of CPU per load of the
    # schema, paid by every Snakemake parse and every step that reads its settings.
    with open(path, encoding="utf-8") as handle:
        return json.dumps(_inline(safe_yaml(handle), path.parent))


def _inline(node: Any, base: Path) -> Any:
    if isinstance(node, list):
        return [_inline(item, base) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node and not str(node["$ref"]).startswith("#"):
        referenced = load_schema(base / node["$ref"])
        referenced.pop("$schema", None)
        siblings = {k: _inline(v, base) for k, v in node.items() if k != "$ref"}
        return {**referenced, **siblings}
    return {key: _inline(value, base) for key, value in node.items()}


def _is_integer(_checker: Any, instance: Any) -> bool:
    """Only an int is an integer (JSON Schema also counts 2.0)."""
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictIntegers = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def _set_defaults(validator, properties, instance, schema):  # type: ignore[no-untyped-def]
    if isinstance(instance, dict):
        for name, subschema in properties.items():
            if "default" in subschema:
                instance.setdefault(name, copy.deepcopy(subschema["default"]))
    yield from _StrictIntegers.VALIDATORS["properties"](validator, properties, instance, schema)


DefaultingValidator = jsonschema.validators.extend(_StrictIntegers, {"properties": _set_defaults})


def validate_config(config: dict[str, Any], schema_path: str | Path | None = None) -> None:
    """Validate `config` in place, filling defaults; raise ConfigError on the first problem."""
    check_finite_numbers(config)
    schema = load_schema(schema_path or SCHEMA_DIR / "config.schema.yaml")
    errors = sorted(DefaultingValidator(schema).iter_errors(config), key=lambda e: list(e.path))
    if errors:
        raise config_error(errors[0])
    check_resources(config)
    if schema_path is None:
        check_families(config)


def check_families(config: dict[str, Any]) -> None:
    """Run the `check` of each family of `config['families']` that has a `checks` module."""
    for module in family_modules("checks"):
        family = module.__name__.split(".")[1]
        if family in config["families"]:
            module.check(config[family])


def config_error(error: jsonschema.ValidationError) -> ConfigError:
    """A ConfigError naming the dotted key of a schema violation."""
    key = ".".join(str(part) for part in error.absolute_path) or "<top level>"
    expected = error.schema.get("description") if isinstance(error.schema, dict) else None
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        return ConfigError(key, error.message, f"one of the known keys {allowed}")
    return ConfigError(key, error.message, " ".join(str(expected).split()) if expected else None)


def load_config(*paths: str | Path) -> dict[str, Any]:
    """Read config files as Snakemake does (later files merged over earlier), then validate."""
    config: dict[str, Any] = {}
    for path in paths:
        config_path = Path(path)
        if not config_path.is_file():
            raise ConfigError("--configfile", f"no such file: {config_path}")
        loaded = read_config_file(config_path)
        check_finite_numbers(loaded, str(config_path))
        merge_config(config, loaded)
    validate_config(config)
    return config


def merge_config(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Merge `update` into `base` recursively, like Snakemake's --configfile."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_config(base[key], value)
        else:
            base[key] = value
    return base


def check_files_exist(key: str, paths: list[str]) -> None:
    """Raise ConfigError naming `key` when any of `paths` is not a readable file."""
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise ConfigError(key, f"no such file(s): {missing}", "existing files")
