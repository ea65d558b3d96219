"""`detgate`: the command line. `serve` runs the gateway; `backend` the whitebox server.

Every `serve` flag can also come from a TOML file (`--config`) or a DETGATE_* environment
variable; a flag beats the environment, which beats the file, which beats the default.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from pydantic import ValidationError

from gateway.commands import add_commands, refuse, run_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="detgate", description="Deterministic LLM calls.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the caching gateway",
                                description="Run the gateway. Every flag is also DETGATE_<NAME> in the "
                                            "environment and <name> in the --config file.")
    serve.add_argument("--config", metavar="FILE.toml", help="settings file (flags and env override it)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8080)")
    serve.add_argument("--upstream", dest="upstreams", action="append", metavar="[NAME=]URL",
                       help="an upstream's base URL (ending in /v1), repeatable; the first is the default; "
                            "#PROFILE appended picks its profile (openai, anthropic, whitebox, ...). Without any: "
                            "openai=https://api.openai.com/v1 with $OPENAI_API_KEY for OpenAI's routes and "
                            "anthropic=https://api.anthropic.com/v1 with $ANTHROPIC_API_KEY for /v1/messages. An "
                            "upstream with the openai or anthropic profile (named, or taken from the provider's "
                            "own host) reads that provider's key variable unless the config file names its key")
    serve.add_argument("--tenant", dest="tenants", action="append", metavar="NAME=KEY",
                       help="a gateway API key and the tenant it stands for, repeatable")
    serve.add_argument("--passthrough-auth", action="store_true", default=None,
                       help="forward the client's Authorization (and OpenAI-Organization / OpenAI-Project) upstream; "
                            "their digest is the tenant")
    serve.add_argument("--refresh-unlisted", action="store_true", default=None,
                       help="let clients no tenant entry names (no --tenant, or --passthrough-auth) send "
                            "x-detgate-cache-control no-cache / no-store; named tenants get it by `refresh = true`")
    serve.add_argument("--operator-token", help="/metrics and /detgate/status then answer only to "
                                                "'Authorization: Bearer <token>'")
    serve.add_argument("--redis-url", help="shared store, e.g. redis://127.0.0.1:6379/0 (default: in-process store)")
    serve.add_argument("--secret", help="key that signs cache keys; required with --redis-url")
    serve.add_argument("--near-cache-ttl-s", type=float,
                       help="with --redis-url: seconds a replica reuses an entry it read; the longest it may take "
                            "to see a refresh made elsewhere (default 1, 0 disables)")
    serve.add_argument("--near-cache-bytes", type=int, help="byte budget of that reuse (default 64 MiB)")
    serve.add_argument("--memory-store-bytes", type=int, help="byte budget of the in-process store (default 256 MiB)")
    serve.add_argument("--store-finish", dest="store_finish", action="append",
                       choices=("stop", "length", "content_filter"),
                       help="a finish reason class whose answers are stored, repeatable (default: stop and length; "
                            "an answer not stored is still served, with a warning)")
    serve.add_argument("--ttl-s", type=float, help="seconds an entry is kept (default 0: until evicted or refreshed)")
    serve.add_argument("--model-ttl-s", dest="model_ttl_s", action="append", metavar="GLOB=SECONDS",
                       help="--ttl-s for the pinned models a glob matches, repeatable; the first match wins")
    serve.add_argument("--max-body-bytes", type=int, help="largest request body accepted (default 8 MiB)")
    serve.add_argument("--upstream-timeout-s", type=float, help="time allowed for a whole upstream answer, retries included, or for a stream until its first event (default 600)")
    serve.add_argument("--lock-lease-ms", type=int,
                       help="lease of a replica's fill lock; a dead holder is taken over after this (default 10000)")
    serve.add_argument("--cache-failure", choices=("fail-open", "fail-closed"),
                       help="when the store is down: answer uncached (fail-open, the default; x-detgate-cache: "
                            "bypass) or refuse with a 503 (fail-closed, which also refuses to start without it)")
    serve.add_argument("--store-timeout-s", type=float, help="longest one store operation may take (default 1)")
    serve.add_argument("--upstream-connect-timeout-s", type=float, help="time to connect to an upstream (default 10)")
    serve.add_argument("--upstream-idle-timeout-s", type=float,
                       help="silence allowed from a streaming upstream before its first byte or between chunks (default 120)")
    serve.add_argument("--upstream-max-attempts", type=int,
                       help="attempts per upstream call on connection errors, timeouts, 429 and 5xx (default 3)")
    serve.add_argument("--upstream-concurrency", type=int, help="calls in flight per upstream (default 512)")
    serve.add_argument("--upstream-queue", type=int, help="calls that may wait for one of those (default 1024)")
    serve.add_argument("--upstream-queue-timeout-s", type=float, help="longest such a wait (default 10)")
    serve.add_argument("--breaker-failures", type=int,
                       help="failures in a row that open an upstream's circuit (default 5, 0 disables)")
    serve.add_argument("--breaker-open-s", type=float, help="how long an open circuit refuses calls (default 5)")
    serve.add_argument("--max-messages", type=int, help="most messages in one chat request (default 2048)")
    serve.add_argument("--rate-limit", dest="rate_limits", action="append", metavar="TENANT=RATE/BURST",
                       help="requests per second and burst for a tenant ('*': every tenant without its own), "
                            "repeatable; shared by all replicas through --redis-url when there is one")
    serve.add_argument("--shared-cache-tenant", dest="shared_cache_tenants", action="append", metavar="NAME",
                       help="a tenant whose identical requests share cache entries with the other tenants so named, "
                            "repeatable (default: every tenant's entries are its own)")
    serve.add_argument("--shutdown-timeout-s", type=float,
                       help="on SIGTERM, how long requests in flight may take to finish (default 30)")
    serve.add_argument("--log-level", help="default INFO")
    serve.add_argument("--otlp-endpoint", metavar="URL",
                       help="send traces over OTLP/HTTP to this collector (e.g. http://127.0.0.1:4318; needs the "
                            "[otel] extra); W3C traceparent is then accepted and sent on upstream (default: no tracing)")
    serve.add_argument("--mode", choices=("normal", "record", "replay"),
                       help="record: always call upstream and store, replacing, and keep agent sessions; replay: "
                            "answer only from the cache (a session turn whose tool outputs changed too), a miss is a "
                            "400 replay_miss naming the nearest recording, and no upstream is called (default normal)")
    serve.add_argument("--agent-key-rules", choices=("auto", "on", "off"),
                       help="the built-in key rules of a recognised coding agent: in record and replay modes (auto), "
                            "in every mode, or never (default auto; docs/key-rules.md)")
    serve.add_argument("--drift-policy", choices=("keep", "rotate"),
                       help="on a new system_fingerprint: keep serving cached answers, or rotate that model's keys "
                            "to a fresh namespace (default keep)")
    serve.add_argument("--canary-interval-s", type=float,
                       help="run the configured canaries about this often (default 0: only by `detgate probe`)")
    add_commands(commands)

    backend = commands.add_parser("backend", help="run the whitebox inference backend (needs the [backend] extra)",
                                  add_help=False)
    backend.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["backend"]:
        # Imported here so that the gateway never needs torch.
        from local_backend.cli import main as backend_main
        return backend_main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    if args.command != "serve":
        return run_command(args)
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from gateway import config
    from gateway.app import ConfigError, create_app
    from gateway.ops import logs

    flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    for name, flag in (("tenants", "--tenant"), ("rate_limits", "--rate-limit"), ("model_ttl_s", "--model-ttl-s")):
        if flags[name] is not None:
            try:
                flags[name] = dict(config.parse_pair(spec) for spec in flags[name])
            except ValueError as exc:
                return refuse(f"{flag}: {exc}")
    try:
        settings = config.load(args.config, os.environ, flags)
    except (ValidationError, ValueError, OSError) as exc:
        return refuse(f"invalid settings: {exc}")
    logs.setup(settings.log_level)
    log_credentials(settings)
    try:
        web.run_app(create_app(settings), host=settings.host, port=settings.port, access_log=None, print=None,
                    shutdown_timeout=settings.shutdown_timeout_s)
    except ConfigError as exc:
        return refuse(str(exc))
    return 0


def log_credentials(settings) -> None:
    """Say at start, per upstream, where its key comes from (never the key): a user who named
    an upstream by flag and expected a key would otherwise meet only 401s."""
    import logging

    log = logging.getLogger("detgate")
    for upstream in settings.upstreams:
        if settings.passthrough_auth:
            source, missing = "the client's own Authorization (--passthrough-auth)", False
        else:
            source = upstream.credential(os.environ)
            missing = upstream.key_env is not None and upstream.key(os.environ) is None
        (log.warning if missing else log.info)("upstream %s (%s, profile %s): credential from %s",
                                               upstream.name, upstream.url, upstream.profile, source)
