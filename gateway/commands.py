"""The one-shot commands beside `serve`: `detgate probe`, `detgate cache export|import` and
`detgate cache ls|show|rm` (gateway/ops/cache_cli.py).

They read the same settings as `serve` (--config file, DETGATE_* environment, flags), so
a deployment's config file is all they need. Heavy imports wait until a command runs, so
that `detgate --help` stays quick.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys

from gateway.ops import cache_cli

ROUTES = ("chat.completions", "completions", "embeddings", "messages", "responses")
NO_STORE = ("needs --redis-url (or redis_url in --config): without one the cache lives inside a `detgate serve` "
            "process and goes with it, so there is nothing to {what}")


def _shared(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="the settings file `detgate serve` uses")
    parser.add_argument("--redis-url", help="the gateway's Redis")
    parser.add_argument("--secret", help="the gateway's signing secret (or DETGATE_SECRET)")
    parser.add_argument("--log-level", help="default WARNING")


def _shared_with_upstreams(parser: argparse.ArgumentParser, why: str) -> None:
    """The shared flags, and --upstream for a command that sends or keys requests as serve would."""
    _shared(parser)
    parser.add_argument("--upstream", dest="upstreams", action="append", metavar="[NAME=]URL",
                        help=f"an upstream, as for `detgate serve`{why}")


def add_commands(commands: argparse._SubParsersAction) -> None:
    probe = commands.add_parser("probe", help="run the configured canaries once and print a table",
                                description="Send every canary from the settings once, compare each answer with "
                                            "its reference digest, print a table. Exit status 1 when any canary "
                                            "mismatched or failed.")
    _shared_with_upstreams(probe, "")

    cache = commands.add_parser("cache", help="list, show, delete, export or import cache entries; diff a request "
                                              "against the recordings")
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="write every entry this secret vouches for to FILE, sorted by key; "
                                               "say how many were skipped, and why")
    export.add_argument("file", metavar="FILE")
    _shared(export)
    load = actions.add_parser("import", help="store every entry of FILE, replacing what is there")
    load.add_argument("file", metavar="FILE")
    _shared(load)
    load.add_argument("--reseal", action="store_true",
                      help="seal entries anew with this secret instead of checking their MACs (for a golden file "
                           "edited on purpose)")
    cache_cli.add_actions(actions, _shared)
    diff = actions.add_parser("diff", help="say whether --mode replay answers a request body, and print every "
                                           "difference from the nearest recorded request when it would not",
                              description="Exit status 0 when replay answers the request (exactly, or as a session "
                                          "turn whose tool outputs differ), 1 when it would miss.")
    diff.add_argument("file", metavar="FILE", nargs="?", default="-", help="the request body (default: stdin)")
    diff.add_argument("--route", choices=ROUTES, help="the surface it is sent to (default: guessed from the body)")
    diff.add_argument("-H", "--header", dest="headers", action="append", default=[], metavar="'NAME: VALUE'",
                      help="a request header as the client sends it: its key (Authorization, x-api-key) picks the "
                           "tenant, a session header the session, keyed headers (anthropic-version, anthropic-beta) "
                           "count; repeatable")
    _shared_with_upstreams(diff, " (it picks the model's upstream, part of the key)")


def run_command(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    if args.command == "cache" and args.action in cache_cli.ACTIONS:
        return cache_cli.run(args, refuse)

    from gateway import config
    from gateway.ops import logs

    flags = {k: v for k, v in vars(args).items()
             if k not in ("command", "action", "config", "file", "reseal", "route", "headers")}
    flags["log_level"] = flags.get("log_level") or "WARNING"
    try:
        settings = config.load(args.config, os.environ, flags)
    except (ValidationError, ValueError, OSError) as exc:
        return refuse(f"invalid settings: {exc}")
    logs.setup(settings.log_level)
    if args.command == "probe":
        return asyncio.run(_probe(settings))
    if not settings.redis_url:
        return refuse(f"cache {args.action} " + NO_STORE.format(what=args.action))
    if settings.secret is None:
        return refuse(f"cache {args.action} needs --secret (or DETGATE_SECRET): the one the gateway signs keys with")
    if args.action == "diff":
        return asyncio.run(_diff(args, settings))
    return asyncio.run(_cache(args.action, args.file, settings, args.action == "import" and args.reseal))


async def _probe(settings) -> int:
    from aiohttp import web

    from gateway.app import ConfigError, create_app
    from gateway.ops.canary import table
    from gateway.ops.watch import CANARIES

    if not settings.canaries:
        return refuse("no canaries configured: add [[canaries]] tables (name, model, body) to the --config file")
    # The app's own resources, started without a listener and without the schedule: the
    # probe's canaries are built exactly as the serving gateway's are.
    try:
        runner = web.AppRunner(create_app(settings.model_copy(update={"canary_interval_s": 0.0})))
        await runner.setup()
    except ConfigError as exc:
        return refuse(str(exc))
    try:
        probes = await runner.app[CANARIES].run_all()
    finally:
        await runner.cleanup()
    print(table(probes))
    if not settings.redis_url and not all(c.expect for c in settings.canaries):
        print("note: without --redis-url a first answer's digest is not kept between runs; pin it as `expect` "
              "in the canary's config to compare against it")
    return 1 if any(p.failed for p in probes) else 0


async def _cache(action: str, path: str, settings, reseal: bool) -> int:
    from gateway.cache.export import export_entries, import_entries
    from gateway.cache.redis_store import RedisStore
    from gateway.cache.session_store import RedisSessions
    from gateway.cache.store import StoreError
    from gateway.ops.drift import EPOCHS
    from gateway.ops.ledger import RedisLedger

    store = RedisStore(settings.redis_url, settings.store_timeout_s)
    ledger = RedisLedger(settings.redis_url, settings.store_timeout_s)
    secret = settings.secret.get_secret_value().encode()
    sessions = RedisSessions(store.client)
    try:
        if action == "export":
            epochs = {name: int(value) for name, value in (await ledger.read(EPOCHS)).items()}
            partial = path + ".partial"
            try:
                with open(partial, "wb") as out:  # renamed when complete: a failed export leaves no half file
                    counts = await export_entries(store, out, secret, epochs, sessions=sessions)
                os.replace(partial, path)
            finally:
                if os.path.exists(partial):
                    os.unlink(partial)
            print(f"exported {counts.written} entries{counts.recorded()} to {path}{counts.skips()}")
            return 0
        with open(path, "rb") as source:
            counts = await import_entries(store, source, secret, reseal=reseal, sessions=sessions)
        for name, epoch in counts.epochs.items():
            await ledger.raise_to(EPOCHS, name, epoch)
        print(f"imported {counts.written} entries{counts.recorded()} from {path}"
              + (f"; namespace epochs at least {counts.epochs}" if counts.epochs else "") + counts.skips()
              + (f"; rejected {counts.rejected}:\n  " + "\n  ".join(counts.problems) if counts.rejected else ""))
        return 1 if counts.rejected else 0
    except StoreError as exc:
        return refuse(f"the store failed: {exc}")
    except OSError as exc:
        return refuse(str(exc))
    finally:
        await store.close()
        await ledger.close()


async def _diff(args: argparse.Namespace, settings) -> int:
    import orjson

    from gateway.cache.redis_store import RedisStore
    from gateway.cache.request_diff import diff_request, header_lines
    from gateway.cache.session_store import RedisSessions
    from gateway.cache.store import StoreError
    from gateway.errors import ApiError
    from gateway.ops.drift import EPOCHS
    from gateway.ops.ledger import RedisLedger

    try:
        headers = header_lines(args.headers)
        if args.file == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as source:
                raw = source.read()
    except (ValueError, OSError) as exc:
        return refuse(str(exc))
    store = RedisStore(settings.redis_url, settings.store_timeout_s)
    ledger = RedisLedger(settings.redis_url, settings.store_timeout_s)
    secret = settings.secret.get_secret_value().encode()
    try:
        epochs = {name: int(value) for name, value in (await ledger.read(EPOCHS)).items()}
        return await diff_request(raw, args.route, headers, settings, store, RedisSessions(store.client), secret,
                                  epochs, print)
    except ApiError as exc:
        return refuse(f"the gateway would refuse this request ({exc.status}): {exc.message}")
    except (ValueError, orjson.JSONDecodeError) as exc:
        return refuse(str(exc))
    except RecursionError:
        return refuse("the request is nested deeper than the comparison walks")
    except StoreError as exc:
        return refuse(f"the store failed: {exc}")
    finally:
        await store.close()
        await ledger.close()


def refuse(message: str) -> int:
    """Why a command will not run, on stderr; its exit status."""
    print(f"detgate: {message}", file=sys.stderr)
    return 2
