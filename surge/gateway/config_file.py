"""Config files: a whole GatewayConfig (JSON or TOML) and the reloadable upstreams file.

Both are read with blocking file I/O: the CLI reads them before the event loop starts, the
upstreams watcher through `asyncio.to_thread`.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from surge.batch.config import BatchConfig
from surge.gateway.config import (
    BreakerConfig,
    DegradeConfig,
    GatewayConfig,
    HealthConfig,
    LimitConfig,
    PrefixConfig,
    RetryConfig,
    TimeoutConfig,
    UpstreamConfig,
)
from surge.gateway.epp.config import EppConfig
from surge.gateway.kv_config import KvConfig

SECTIONS: dict[str, type] = {
    "prefix": PrefixConfig,
    "kv": KvConfig,
    "breaker": BreakerConfig,
    "retry": RetryConfig,
    "timeouts": TimeoutConfig,
    "health": HealthConfig,
    "limits": LimitConfig,
    "degrade": DegradeConfig,
    "epp": EppConfig,
    "batch": BatchConfig,
}
UPSTREAM_LISTS = ("upstreams", "fallback_upstreams")


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A JSON or TOML file (by extension) holding one table/object."""
    path = Path(path)
    text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object at the top level")
    return data


def config_from_mapping(data: Mapping[str, Any]) -> GatewayConfig:
    """GatewayConfig from nested plain data; unknown keys are errors (a typo must not pass)."""
    names = {f.name for f in dataclasses.fields(GatewayConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown gateway config keys: {unknown}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if name in SECTIONS:
            kwargs[name] = _section(SECTIONS[name], value, name)
        elif name in UPSTREAM_LISTS:
            kwargs[name] = upstream_list(value, name)
        else:
            kwargs[name] = _check_scalar(name, value, _default_of(GatewayConfig, name))
    return GatewayConfig(**kwargs)


def upstream_list(value: Any, where: str) -> tuple[UpstreamConfig, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{where}: expected a list of upstreams")
    return tuple(upstream_config(item, where) for item in value)


def upstream_config(item: Any, where: str) -> UpstreamConfig:
    """A url string, or a table {url, weight, max_in_flight}."""
    if isinstance(item, str):
        return UpstreamConfig(url=item)
    if isinstance(item, dict):
        return _section(UpstreamConfig, item, where)
    raise ValueError(f"{where}: an upstream is a url or a table, got {item!r}")


def read_upstreams_file(path: str | Path) -> tuple[tuple[UpstreamConfig, ...], ...]:
    """(primary, fallback) upstreams from a file.

    `.json` / `.toml`: `{"upstreams": [...], "fallback_upstreams": [...]}` (a bare JSON list is
    the primary list). Anything else: one upstream per line, `url [weight]`, `#` comments.
    """
    path = Path(path)
    if path.suffix == ".json":
        raw = json.loads(path.read_text())
        if isinstance(raw, list):
            return upstream_list(raw, str(path)), ()
    if path.suffix in (".json", ".toml"):
        data = read_mapping(path)
        unknown = sorted(set(data) - set(UPSTREAM_LISTS))
        if unknown:
            raise ValueError(f"{path}: unknown keys {unknown}")
        return tuple(upstream_list(data.get(k, []), str(path)) for k in UPSTREAM_LISTS)
    primary = []
    for num, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2:
            raise ValueError(f"{path}:{num}: expected `url [weight]`, got {line!r}")
        try:
            weight = float(fields[1]) if len(fields) == 2 else 1.0
        except ValueError as e:
            raise ValueError(f"{path}:{num}: bad weight {fields[1]!r}") from e
        primary.append(UpstreamConfig(url=fields[0], weight=weight))
    return tuple(primary), ()


def _section(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a table, got {value!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}")
    checked = {k: _check_scalar(f"{where}.{k}", v, _default_of(cls, k)) for k, v in value.items()}
    return cls(**checked)


def _default_of(cls: type, name: str) -> Any:
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    if field.default is not dataclasses.MISSING:
        return field.default
    return None


def _check_scalar(name: str, value: Any, default: Any) -> Any:
    """Reject a value of the wrong kind early, with the key's name (ints may stand for floats)."""
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        raise ValueError(f"{name}: expected {type(default).__name__}, got {value!r}")
    return value
