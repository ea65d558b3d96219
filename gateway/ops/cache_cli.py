"""`detgate cache ls|show|rm`: the operator's cache API from the command line.

With `--gateway URL` (and the operator token) the verbs go through a running gateway's API,
which is the only way into its in-process store; otherwise they open the Redis of the
settings (`--config`, `--redis-url`, `--secret`) directly. Either way the same code
(gateway/cache/admin.py) lists, shows and deletes.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson

ACTIONS = ("ls", "show", "rm")
FILTERS = ("tenant", "upstream", "model", "surface", "finish", "fingerprint", "older_than_s", "newer_than_s")
COLUMNS = ("key", "tenant", "upstream", "surface", "model", "finish", "age_s", "bytes")


def add_actions(actions: argparse._SubParsersAction, shared) -> None:
    ls = actions.add_parser("ls", help="list entries, a page at a time, with filters")
    _filters(ls)
    ls.add_argument("--cursor", default="", help="where the previous page ended (it prints the next one)")
    ls.add_argument("--limit", type=int, default=100, help="entries per page, about (default 100, at most 1000)")
    ls.add_argument("--json", action="store_true", help="print the API's JSON answer instead of a table")
    show = actions.add_parser("show", help="everything about one entry: request summary, key fields, record, "
                                           "fingerprint, who filled it and when (JSON)")
    show.add_argument("key", metavar="KEY")
    rm = actions.add_parser("rm", help="delete one entry by key, or every entry a filter matches")
    rm.add_argument("key", metavar="KEY", nargs="?")
    rm.add_argument("--all-matching", action="store_true", help="delete every entry the filters match")
    rm.add_argument("--all", action="store_true", help="with --all-matching and no filter: empty the cache")
    _filters(rm)
    for parser in (ls, show, rm):
        shared(parser)
        parser.add_argument("--gateway", metavar="URL", help="a running gateway to go through (its /detgate/cache API; "
                                                             "the only way into an in-process store)")
        parser.add_argument("--operator-token", help="that gateway's operator token (or DETGATE_OPERATOR_TOKEN)")


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", help="the tenant whose request filled it")
    parser.add_argument("--upstream", help="the upstream's name")
    parser.add_argument("--model", help="a glob over the pinned model, e.g. 'gpt-4o-2024-*'")
    parser.add_argument("--surface", help="chat.completions, completions, embeddings, responses, messages")
    parser.add_argument("--finish", help="the answer's finish class: stop, length, content_filter")
    parser.add_argument("--fingerprint", help="the answer's system_fingerprint (after a drift: the old build's)")
    parser.add_argument("--older-than-s", type=float, help="filled at least this many seconds ago")
    parser.add_argument("--newer-than-s", type=float, help="filled at most this many seconds ago")


def run(args: argparse.Namespace, refuse) -> int:
    filters = {name: str(getattr(args, name)) for name in FILTERS if getattr(args, name, None) is not None}
    if args.action == "rm":
        if (args.key is None) == (not args.all_matching):
            return refuse("cache rm takes a KEY, or --all-matching with filters")
        if args.all_matching and not filters and not args.all:
            return refuse("cache rm --all-matching needs a filter (or --all to empty the cache)")
    try:
        answer = (_through_gateway if args.gateway else _on_store)(args, filters)
    except LookupError as exc:
        print(f"detgate: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        return refuse(str(exc))
    if answer is None:
        return 2
    _print(args, answer)
    return 0


def _through_gateway(args: argparse.Namespace, filters: dict[str, str]) -> Any:
    token = args.operator_token or os.environ.get("DETGATE_OPERATOR_TOKEN")
    base = args.gateway.rstrip("/") + "/detgate/cache"
    key = getattr(args, "key", None)
    if args.action == "ls":
        url, method = base + "?" + urllib.parse.urlencode({**filters, "limit": args.limit,
                                                           **({"cursor": args.cursor} if args.cursor else {})}), "GET"
    elif key is not None:
        url, method = base + "/" + urllib.parse.quote(key, safe=":"), "GET" if args.action == "show" else "DELETE"
    else:
        url, method = base + "?" + urllib.parse.urlencode({**filters, **({"all": "true"} if args.all else {})}), "DELETE"
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        message = orjson.loads(error.read()).get("error", {}).get("message", str(error))
        if error.code == 404:
            raise LookupError(message) from None
        raise RuntimeError(f"the gateway answered {error.code}: {message}") from None
    except urllib.error.URLError as error:
        raise RuntimeError(f"cannot reach {args.gateway}: {error.reason}") from None


def _on_store(args: argparse.Namespace, filters: dict[str, str]) -> Any:
    from pydantic import ValidationError

    from gateway import config

    flags = {"redis_url": args.redis_url, "secret": args.secret, "log_level": args.log_level or "WARNING"}
    try:
        settings = config.load(args.config, os.environ, flags)
    except (ValidationError, ValueError, OSError) as exc:
        raise RuntimeError(f"invalid settings: {exc}") from None
    if not settings.redis_url:
        raise RuntimeError(f"cache {args.action} needs --redis-url (or redis_url in --config), or --gateway URL: "
                           "an in-process store is reached only through its gateway's API")
    if settings.secret is None:
        raise RuntimeError(f"cache {args.action} needs --secret (or DETGATE_SECRET): the one the gateway signs with")
    return asyncio.run(_admin(args, filters, settings.redis_url, settings.secret.get_secret_value().encode(),
                              settings.store_timeout_s))


async def _admin(args: argparse.Namespace, filters: dict[str, str], url: str, secret: bytes, timeout_s: float) -> Any:
    from gateway.cache.admin import MAX_LIMIT, CacheAdmin, Filters
    from gateway.cache.entry import Sealer
    from gateway.cache.redis_store import RedisStore
    from gateway.cache.store import StoreError

    store = RedisStore(url, timeout_s)
    admin = CacheAdmin(store, Sealer(secret))
    try:
        chosen = Filters.parse(filters)
        if args.action == "ls":
            return await admin.page(chosen, args.cursor, max(1, min(args.limit, MAX_LIMIT)))
        if args.action == "show" or args.key is not None:
            found = await (admin.show(args.key) if args.action == "show" else admin.delete(args.key))
            if found is None:
                raise LookupError(f"No cache entry under {args.key!r}.")
            return found if args.action == "show" else {"key": args.key, "deleted": int(found),
                                                        "changed": int(not found)}
        return vars(await admin.delete_matching(chosen))
    except ValueError as exc:
        raise RuntimeError(str(exc)) from None
    except StoreError as exc:
        raise RuntimeError(f"the store failed: {exc}") from None
    finally:
        await store.close()


def _print(args: argparse.Namespace, answer: dict[str, Any]) -> None:
    if args.action == "show" or (args.action == "ls" and args.json):
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    elif args.action == "ls":
        rows = [[str(entry.get(c) if entry.get(c) is not None else "-") for c in COLUMNS] for entry in answer["entries"]]
        widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(COLUMNS)]
        for row in [[c.upper() for c in COLUMNS], *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        more = f"; next page: --cursor {answer['cursor']}" if answer["cursor"] else ""
        print(f"{len(rows)} entries (scanned {answer['scanned']}, matched {answer['matched']}, "
              f"unreadable {answer['unreadable']}){more}")
    elif "matched" in answer:
        print(f"deleted {answer['deleted']} of {answer['matched']} matching (scanned {answer['scanned']}, "
              f"left alone because refilled meanwhile {answer['changed']}, unreadable {answer['unreadable']})")
    else:
        print(f"deleted {answer['deleted']} ({answer['key']})" if answer["deleted"]
              else f"left alone: {answer['key']} was refilled meanwhile")
