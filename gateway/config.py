"""The gateway's settings: one validated model, built from defaults < TOML file < DETGATE_* env < flags.

Layers are merged as plain dicts (later layers replace whole fields) and validated once,
so a bad value names its field whichever layer it came from.
"""
from __future__ import annotations

import os
import tomllib
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

Profile = Literal["openai", "generic-openai-compatible", "whitebox"]

OPENAI_URL = "https://api.openai.com/v1"


class UpstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    # The base URL exactly as an OpenAI client would take it (".../v1").
    url: str = Field(pattern=r"^https?://")
    api_key: SecretStr | None = None
    api_key_env: str | None = None
    profile: Profile = "generic-openai-compatible"
    models: tuple[str, ...] = ()  # fnmatch globs routed here

    @field_validator("url")
    @classmethod
    def _no_trailing_slash(cls, url: str) -> str:
        return url.rstrip("/")

    def authorization(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The Authorization header the gateway sends when it is not passing the client's on."""
        key = self.api_key.get_secret_value() if self.api_key else None
        if key is None and self.api_key_env:
            key = environ.get(self.api_key_env)
        return f"Bearer {key}" if key else None


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    upstreams: tuple[UpstreamConfig, ...] = ()
    passthrough_auth: bool = False
    # tenant name -> gateway API key; TOML-friendly direction, inverted at lookup.
    tenants: dict[str, SecretStr] = {}
    redis_url: str | None = None
    secret: SecretStr | None = None
    memory_store_bytes: int = Field(256 * 2**20, gt=0)
    # With --redis-url: how long a replica may reuse an entry it read (0: always ask Redis),
    # i.e. how late it may see a refresh made on another replica.
    near_cache_ttl_s: float = Field(1.0, ge=0)
    near_cache_bytes: int = Field(64 * 2**20, gt=0)
    max_body_bytes: int = Field(8 * 2**20, gt=0)
    upstream_timeout_s: float = Field(600.0, gt=0)
    # How long a replica's claim on filling a key lasts without renewal; when the holder
    # dies, the other replicas take over after at most this long.
    lock_lease_ms: int = Field(10_000, ge=100)
    log_level: str = "INFO"

    @field_validator("upstreams", mode="before")
    @classmethod
    def _parse_upstreams(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return tuple(parse_upstream(v, i) if isinstance(v, str) else v for i, v in enumerate(value))
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if not self.upstreams:
            default = UpstreamConfig(name="openai", url=OPENAI_URL, api_key_env="OPENAI_API_KEY", profile="openai")
            self.upstreams = (default,)
        names = [u.name for u in self.upstreams]
        if len(set(names)) != len(names):
            raise ValueError(f"upstream names must be unique, got {names}")
        if self.passthrough_auth and self.tenants:
            raise ValueError("passthrough_auth and tenants exclude each other: the client's key is either ours or the upstream's")
        keys = [k.get_secret_value() for k in self.tenants.values()]
        if len(set(keys)) != len(keys):
            raise ValueError("two tenants share one API key")
        return self


def parse_upstream(spec: str, index: int) -> dict[str, Any]:
    """`NAME=URL` or a bare `URL` (named "default" when first, else "upstream<i>")."""
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = ("default" if index == 0 else f"upstream{index}"), spec
    return {"name": name, "url": url}


# Fields whose env value is a list (comma separated) or a NAME=VALUE map.
_LIST_FIELDS = {"upstreams"}
_MAP_FIELDS = {"tenants"}


def from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """DETGATE_<FIELD> for every settings field; DETGATE_UPSTREAMS is comma separated,
    DETGATE_TENANTS is `name=key,name=key`."""
    out: dict[str, Any] = {}
    for field in Settings.model_fields:
        raw = environ.get(f"DETGATE_{field.upper()}")
        if raw is None:
            continue
        if field in _LIST_FIELDS:
            out[field] = [s.strip() for s in raw.split(",") if s.strip()]
        elif field in _MAP_FIELDS:
            out[field] = dict(_pair(s) for s in raw.split(",") if s.strip())
        else:
            out[field] = raw
    return out


def _pair(spec: str) -> tuple[str, str]:
    name, sep, value = spec.strip().partition("=")
    if not sep:
        raise ValueError(f"expected NAME=VALUE, got {spec!r}")
    return name, value


def from_file(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


def load(file: str | None, environ: Mapping[str, str], flags: Mapping[str, Any]) -> Settings:
    """Precedence flag > env > file > default, whole field by whole field."""
    merged: dict[str, Any] = {}
    if file:
        merged.update(from_file(file))
    merged.update(from_env(environ))
    merged.update({k: v for k, v in flags.items() if v is not None})
    return Settings.model_validate(merged)
