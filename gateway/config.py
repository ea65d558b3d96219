"""The gateway's settings: one validated model, built from defaults < TOML file < DETGATE_* env < flags.

Layers are merged as plain dicts (later layers replace whole fields) and validated once,
so a bad value names its field whichever layer it came from.
"""
from __future__ import annotations

import os
import tomllib
from urllib.parse import urlsplit
from functools import cached_property
from typing import Annotated, Any, Literal, Mapping

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from gateway.apis import SURFACES
from gateway.ingress.allowlist import parse_rule
from gateway.policy.capabilities import CapabilitySpec
from gateway.policy.key_rules import AgentRules, KeyRule
from gateway.policy.keys import tenant_from_api_key
from gateway.policy.rules import MAX_ATTEMPTS, ModelStrategy, Rules, compile_rules

OPENAI_URL = "https://api.openai.com/v1"
ANTHROPIC_URL = "https://api.anthropic.com/v1"
SHARED_NAMESPACE = "shared"  # the namespace the entries of shared_cache_tenants are signed under
# A provider's usual key variable, taken by an upstream with its profile unless the upstream
# names its own key (api_key, or api_key_env; api_key_env = "" sends none), as the providers'
# own SDKs and LiteLLM read them.
PROVIDER_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
# An upstream at a provider's own host gets that provider's profile when it names none.
PROVIDER_HOSTS = {"api.openai.com": "openai", "api.anthropic.com": "anthropic"}


class UpstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    # The base URL exactly as an OpenAI client would take it (".../v1"); for Anthropic's wire
    # also ".../v1" (https://api.anthropic.com/v1), where its SDK takes the URL without it.
    url: str = Field(pattern=r"^https?://")
    api_key: SecretStr | None = None
    api_key_env: str | None = None
    profile: str = "generic-openai-compatible"  # built in, or one of Settings.profiles
    mode: Literal["enforce", "reject", "off"] = "enforce"  # de-randomization; x-detgate-mode overrides
    # Canonicalization of the text the model reads (gateway/policy/canonical.py): "text" applies
    # the text rules, "json-only" sends text as written; x-detgate-canonical overrides.
    canonical: Literal["text", "json-only"] = "text"
    models: tuple[str, ...] = ()  # fnmatch globs routed here
    # The cached routes this upstream serves, by surface name ("chat.completions", "messages");
    # None: those of its profile's wire (gateway/policy/routing.py).
    surfaces: tuple[str, ...] | None = None
    # What the uncached proxy passes on to this upstream, "METHOD /path" below its base URL
    # (gateway/ingress/allowlist.py); None: the default of its profile's wire.
    proxy: tuple[str, ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _provider_profile(cls, data: Any) -> Any:
        if isinstance(data, dict) and "profile" not in data and isinstance(data.get("url"), str):
            host = urlsplit(data["url"]).hostname
            if host in PROVIDER_HOSTS:
                data = {**data, "profile": PROVIDER_HOSTS[host]}
        return data

    @field_validator("url")
    @classmethod
    def _no_trailing_slash(cls, url: str) -> str:
        return url.rstrip("/")

    @field_validator("proxy")
    @classmethod
    def _proxy_rules(cls, proxy: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for spec in proxy or ():
            parse_rule(spec)  # parsed here so that a bad rule refuses to start
        return proxy

    @property
    def key_env(self) -> str | None:
        """The environment variable the key is read from: api_key_env, else the profile's provider's."""
        if self.api_key_env is not None:
            return self.api_key_env or None
        return PROVIDER_KEY_ENV.get(self.profile)

    def key(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The operator's key for this upstream, sent when the gateway is not passing the client's on."""
        if self.api_key is not None:
            return self.api_key.get_secret_value() or None
        return (environ.get(self.key_env) if self.key_env else None) or None

    def credential(self, environ: Mapping[str, str] = os.environ) -> str:
        """Where this upstream's key comes from, for the start-up log: never the key itself."""
        if self.api_key is not None:
            return "api_key in the config file"
        if self.key_env is None:
            return "none (no api_key or api_key_env, and no provider profile to take one from)"
        how = "api_key_env" if self.api_key_env else f"the {self.profile} profile's default"
        state = "set" if environ.get(self.key_env) else "NOT SET: calls go without a key"
        return f"${self.key_env} ({how}; {state})"


class TenantConfig(BaseModel):
    """A gateway API key and what its holder is. `NAME = "KEY"` (or NAME=KEY in the
    environment and flags) is short for a table with only `key`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: SecretStr
    # The cache namespace: entries belong to the id, not the name, so a name given to a new
    # key never reads the old key's entries. Without an id, the key's digest is the id; with
    # one, a key rotated under it keeps the entries.
    id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]+$")
    refresh: bool = False  # may send x-detgate-cache-control no-cache (refresh) and no-store

    @property
    def namespace(self) -> str:
        return self.id if self.id is not None else tenant_from_api_key(self.key.get_secret_value())


class CanaryConfig(BaseModel):
    """A fixed request sent on a schedule (and by `detgate probe`) to notice when an
    upstream starts answering it differently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    model: str
    upstream: str | None = None  # an upstream name; default: the model's route
    route: str = "chat.completions"  # the surface it is sent to (gateway/apis: SURFACES)
    body: dict[str, Any] = {}  # the request without "model", e.g. {"messages": [...]}
    expect: str | None = None  # a reference digest; default: the first answer's, kept in the ledger


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    upstreams: tuple[UpstreamConfig, ...] = ()
    passthrough_auth: bool = False
    # tenant name -> its gateway API key and rights; TOML-friendly direction, inverted at lookup.
    tenants: dict[str, TenantConfig] = {}
    # Whether clients that no tenant entry names (everyone on a gateway without keys, each
    # key in passthrough mode) may refresh (no-cache) and bypass (no-store) the cache.
    refresh_unlisted: bool = False
    # When set, /metrics and /detgate/status answer only to "Authorization: Bearer <token>".
    operator_token: SecretStr | None = None
    # Tenants whose identical requests share cache entries (one namespace, "shared").
    # Every other tenant is isolated: its entries are signed under its own id.
    shared_cache_tenants: tuple[str, ...] = ()
    redis_url: str | None = None
    secret: SecretStr | None = None
    memory_store_bytes: int = Field(256 * 2**20, gt=0)
    # With --redis-url: how long a replica may reuse an entry it read (0: always ask Redis),
    # i.e. how late it may see a refresh made on another replica.
    near_cache_ttl_s: float = Field(1.0, ge=0)
    near_cache_bytes: int = Field(64 * 2**20, gt=0)
    # What the cache keeps (gateway/cache/storing.py): complete answers whose finish class is
    # listed (content_filter is not, by default), for ttl_s seconds, or those of the first
    # model_ttl_s glob matching the pinned model (0: until evicted or refreshed).
    store_finish: tuple[Literal["stop", "length", "content_filter"], ...] = ("stop", "length")
    ttl_s: float = Field(0.0, ge=0)
    model_ttl_s: dict[str, Annotated[float, Field(ge=0)]] = {}
    max_body_bytes: int = Field(8 * 2**20, gt=0)
    upstream_timeout_s: float = Field(600.0, gt=0)
    # How long a replica's claim on filling a key lasts without renewal; when the holder
    # dies, the other replicas take over after at most this long.
    lock_lease_ms: int = Field(10_000, ge=100)
    # Failure behaviour and limits (see gateway/upstream/resilience.py, gateway/ingress/limits.py).
    # fail-open answers from the upstream when the store is down (x-detgate-cache: bypass);
    # fail-closed refuses with a 503 rather than serve an answer it cannot store.
    cache_failure: Literal["fail-open", "fail-closed"] = "fail-open"
    store_timeout_s: float = Field(1.0, gt=0)  # one store operation; a hung Redis costs no more
    upstream_connect_timeout_s: float = Field(10.0, gt=0)
    upstream_idle_timeout_s: float = Field(120.0, gt=0)  # a stream's silence allowed before a first byte or between chunks
    upstream_max_attempts: int = Field(3, ge=1, le=10)
    upstream_concurrency: int = Field(512, ge=1)  # calls in flight per upstream
    upstream_queue: int = Field(1024, ge=0)  # calls waiting for one of those slots
    upstream_queue_timeout_s: float = Field(10.0, ge=0)
    breaker_failures: int = Field(5, ge=0)  # failures in a row that open an upstream's circuit; 0 disables
    breaker_open_s: float = Field(5.0, ge=0)
    max_messages: int = Field(2048, ge=1)
    # tenant (or "*" for every tenant without its own) -> "RATE/BURST": requests per second, bucket size.
    rate_limits: dict[str, str] = {}
    shutdown_timeout_s: float = Field(30.0, gt=0)  # SIGTERM: how long in-flight requests may take to finish
    log_level: str = "INFO"
    # OTLP/HTTP collector (e.g. http://127.0.0.1:4318) that traces go to; None: no tracing at all.
    otlp_endpoint: str | None = Field(None, pattern=r"^https?://")
    # Determinism rules (gateway/policy/rules.py): user profiles, the openai profile's alias
    # overrides (false un-pins), model capabilities by glob (gateway/policy/capabilities.py),
    # per-model-glob strategies, named schemas, schema-validated retries.
    profiles: tuple[dict[str, Any], ...] = ()
    aliases: dict[str, str | Literal[False] | None] = {}
    capabilities: dict[str, CapabilitySpec] = {}
    strategies: dict[str, ModelStrategy] = {}
    schemas: dict[str, dict[str, Any]] = {}
    schema_attempts: int = Field(3, ge=1, le=MAX_ATTEMPTS)
    schema_feedback: bool = False  # retries show the model its failed answer and the errors
    # normal: cache as usual; record: always call upstream and overwrite; replay: cache only.
    mode: Literal["normal", "record", "replay"] = "normal"
    # Key rules (gateway/policy/key_rules.py, docs/key-rules.md): the user's ([[key_rules]] in
    # TOML) apply always; a recognised agent's built-in ones in record and replay modes
    # ("auto"), in every mode ("on"), or never ("off").
    key_rules: tuple[KeyRule, ...] = ()
    agent_key_rules: AgentRules = "auto"
    # On a new system_fingerprint: keep serving cached answers, or rotate to a fresh key namespace.
    drift_policy: Literal["keep", "rotate"] = "keep"
    drift_sync_s: float = Field(1.0, gt=0)  # how soon a replica sees another's rotation
    canaries: tuple[CanaryConfig, ...] = ()
    canary_interval_s: float = Field(0.0, ge=0)  # 0: canaries run only by `detgate probe`

    @field_validator("upstreams", mode="before")
    @classmethod
    def _parse_upstreams(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return tuple(parse_upstream(v, i) if isinstance(v, str) else v for i, v in enumerate(value))
        return value

    @field_validator("tenants", mode="before")
    @classmethod
    def _short_tenants(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {name: {"key": v} if isinstance(v, (str, SecretStr)) else v for name, v in value.items()}
        return value

    @field_validator("tenants")
    @classmethod
    def _tenant_keys(cls, value: dict[str, TenantConfig]) -> dict[str, TenantConfig]:
        for name, tenant in value.items():
            key = tenant.key.get_secret_value()
            if not key.strip():
                raise ValueError(f"tenant {name!r} has an empty API key")
            if key != key.strip():
                raise ValueError(f"the API key of tenant {name!r} starts or ends with whitespace, "
                                 "which no Authorization header can carry")
        return value

    @field_validator("otlp_endpoint", mode="before")
    @classmethod
    def _no_endpoint(cls, value: Any) -> Any:
        return None if value == "" else value  # DETGATE_OTLP_ENDPOINT= (as compose passes an unset one): off

    @field_validator("operator_token")
    @classmethod
    def _operator_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and (not value.get_secret_value().strip()
                                  or value.get_secret_value() != value.get_secret_value().strip()):
            raise ValueError("the operator token must not be empty nor start or end with whitespace")
        return value

    @field_validator("rate_limits")
    @classmethod
    def _rate_limit_specs(cls, value: dict[str, str]) -> dict[str, str]:
        for tenant, spec in value.items():
            parse_rate_limit(spec, tenant)
        return value

    @model_validator(mode="after")
    def _sharing(self) -> Settings:
        unknown = set(self.shared_cache_tenants) - set(self.tenants)
        if unknown:
            raise ValueError(f"shared_cache_tenants names tenants that are not configured: {sorted(unknown)}")
        ids: dict[str, str] = {}
        for name, tenant in self.tenants.items():
            namespace = tenant.namespace
            if namespace == SHARED_NAMESPACE and name not in self.shared_cache_tenants:
                raise ValueError(f"tenant {name!r} with id {SHARED_NAMESPACE!r} would read the entries of "
                                 "shared_cache_tenants")
            if namespace in ids:
                raise ValueError(f"tenants {ids[namespace]!r} and {name!r} have one id (one cache namespace); "
                                 "list them in shared_cache_tenants to share entries")
            ids[namespace] = name
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if not self.upstreams:
            # OpenAI's routes from OpenAI, /v1/messages from Anthropic, each with its own key.
            self.upstreams = (
                UpstreamConfig(name="openai", url=OPENAI_URL, api_key_env="OPENAI_API_KEY", profile="openai"),
                UpstreamConfig(name="anthropic", url=ANTHROPIC_URL, api_key_env="ANTHROPIC_API_KEY", profile="anthropic"),
            )
        names = [u.name for u in self.upstreams]
        if len(set(names)) != len(names):
            raise ValueError(f"upstream names must be unique, got {names}")
        for upstream in self.upstreams:
            unknown = sorted(set(upstream.surfaces or ()) - set(SURFACES))
            if unknown:
                raise ValueError(f"upstream {upstream.name!r} lists surfaces {unknown}; known: {sorted(SURFACES)}")
        rule_names = [r.name for r in self.key_rules]
        if len(set(rule_names)) != len(rule_names):
            raise ValueError(f"key rule names must be unique, got {rule_names}")
        canaries = [c.name for c in self.canaries]
        if len(set(canaries)) != len(canaries):
            raise ValueError(f"canary names must be unique, got {canaries}")
        for canary in self.canaries:
            if canary.route not in SURFACES:
                raise ValueError(f"canary {canary.name!r}: unknown route {canary.route!r}; known: {sorted(SURFACES)}")
            if canary.upstream is not None and canary.upstream not in names:
                raise ValueError(f"canary {canary.name!r} names upstream {canary.upstream!r}, which is not configured")
        if self.passthrough_auth and self.tenants:
            raise ValueError("passthrough_auth and tenants exclude each other: the client's key is either ours or the upstream's")
        keys = [t.key.get_secret_value() for t in self.tenants.values()]
        if len(set(keys)) != len(keys):
            raise ValueError("two tenants share one API key")
        if self.operator_token is not None and self.operator_token.get_secret_value() in keys:
            raise ValueError("the operator token is also a tenant's API key")
        self.rules  # compiled here so that bad rules refuse to start
        return self

    @cached_property
    def rules(self) -> Rules:
        return compile_rules(profiles=self.profiles, aliases=self.aliases, capabilities=self.capabilities,
                             strategies=self.strategies,
                             schemas=self.schemas, attempts=self.schema_attempts, feedback=self.schema_feedback,
                             upstream_profiles=((u.name, u.profile) for u in self.upstreams))


def parse_upstream(spec: str, index: int) -> dict[str, Any]:
    """`NAME=URL` or a bare `URL` (named "default" when first, else "upstream<i>"), either
    with `#PROFILE` appended to pick the upstream's profile (`local=http://h:8000/v1#whitebox`)."""
    spec, hashed, profile = spec.partition("#")
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = ("default" if index == 0 else f"upstream{index}"), spec
    return {"name": name, "url": url, **({"profile": profile} if hashed else {})}


def parse_rate_limit(spec: str, tenant: str = "*") -> tuple[float, float]:
    """"RATE/BURST" (requests per second, bucket size) or a bare "RATE" (burst = max(1, rate))."""
    rate, sep, burst = str(spec).partition("/")
    try:
        r = float(rate)
        b = float(burst) if sep else max(1.0, r)
    except ValueError:
        raise ValueError(f"rate limit of {tenant!r} must be RATE/BURST, e.g. 10/20, not {spec!r}") from None
    if not (r > 0 and b >= 1 and r < float("inf") and b < float("inf")):
        raise ValueError(f"rate limit of {tenant!r}: RATE must be > 0 and BURST >= 1, got {spec!r}")
    return r, b


# Fields whose env value is a list (comma separated) or a NAME=VALUE map.
_LIST_FIELDS = {"upstreams", "shared_cache_tenants", "store_finish"}
_MAP_FIELDS = {"tenants", "rate_limits", "model_ttl_s"}


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
            out[field] = dict(parse_pair(s) for s in raw.split(",") if s.strip())
        else:
            out[field] = raw
    return out


def parse_pair(spec: str) -> tuple[str, str]:
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
