"""The compose file as `docker compose` would see it: variables interpolated from an env
file, following the Compose specification's rules for ${VAR}, ${VAR:-default},
${VAR-default}, ${VAR:?error}, ${VAR?error} and $$."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .promql import DEPLOY

COMPOSE = DEPLOY / "docker-compose.yml"
ENV_EXAMPLE = DEPLOY / ".env.example"

_REFERENCE = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


class MissingVariable(ValueError):
    pass


def raw() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip()
    return env


def referenced_variables(text: str) -> set[str]:
    return {m.group(2) or m.group(5) for m in _REFERENCE.finditer(text) if not m.group(1)}


def interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, str):
        return _REFERENCE.sub(lambda m: _resolve(m, env), value)
    return value


def _resolve(m: re.Match, env: dict[str, str]) -> str:
    if m.group(1):
        return "$"
    name = m.group(2) or m.group(5)
    op, arg = m.group(3), m.group(4) or ""
    value = env.get(name)
    # The ":" forms treat an empty value like an unset one.
    unset = value is None or (op is not None and op.startswith(":") and value == "")
    if op and op.endswith("-") and unset:
        return arg
    if op and op.endswith("?") and unset:
        raise MissingVariable(f"{name}: {arg}")
    return value or ""


def resolved(env: dict[str, str]) -> dict[str, Any]:
    return interpolate(raw(), env)
