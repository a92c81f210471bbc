"""Read config files strictly: UTF-8, no key given twice, and no NaN or infinite number."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import yaml

from gpuflow.errors import ConfigError, DataError

# libyaml's parser where PyYAML was built with it (its wheels are): ten times the pure one.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_yaml(source: str | IO[str]) -> Any:
    """YAML text or a stream read by SAFE_LOADER (`yaml.safe_load`, through libyaml)."""
    loader = SAFE_LOADER(source)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def duplicate_key(node: yaml.Node | None, prefix: str = "") -> tuple[str, int, int] | None:
    """(dotted key, first line, repeated line) of the first key given twice, else None."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                return key, seen[key], line
            seen[key] = line
            found = duplicate_key(value_node, key)
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found = duplicate_key(item, f"{prefix}.{index}" if prefix else str(index))
            if found is not None:
                return found
    return None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """One config file as a mapping; DataError naming the file for what YAML would let by."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(
            path,
            f"not UTF-8 text (byte {error.start} is {error.object[error.start]:#04x})",
            expected="a YAML file saved as UTF-8",
        ) from None
    except OSError as error:
        raise DataError(path, f"cannot read ({error.strerror})") from None
    loader = SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        repeated = duplicate_key(node)
        loaded = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as error:
        raise DataError(path, f"not valid YAML ({' '.join(str(error).split())})") from None
    finally:
        loader.dispose()
    if repeated is not None:
        key, first, again = repeated
        raise DataError(
            path,
            f"key '{key}' is given twice (lines {first} and {again}); YAML keeps only the last",
            expected="each key once",
        )
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise DataError(path, f"holds a {type(loaded).__name__}", expected="a mapping of keys")
    return loaded


def non_finite_key(node: Any, prefix: str = "") -> tuple[str, float] | None:
    """(dotted key, value) of the first NaN or infinite number in `node`, else None."""
    if isinstance(node, float) and not math.isfinite(node):
        return prefix or "<top level>", node
    items: Iterable[tuple[Any, Any]] = ()
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    for key, value in items:
        found = non_finite_key(value, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None


def check_finite_numbers(config: dict[str, Any], where: str = "") -> None:
    """Raise ConfigError naming the key of a NaN or infinite number in `config`."""
    found = non_finite_key(config)
    if found is not None:
        key, value = found
        source = f" in {where}" if where else ""
        raise ConfigError(key, f"{value} is not a finite number{source}", "a finite number")


def check_config_files(paths: Iterable[str | Path]) -> None:
    """Read each config file strictly (docs/settings.md); the first problem stops the run."""
    for path in paths:
        check_finite_numbers(read_config_file(path), str(path))
