"""Agent sessions: the requests of one agent run, kept in `--mode record` beside their answers
so that `--mode replay` can serve a run whose tool outputs changed (docs/sessions.md).

A session is named by the client: `x-detgate-session` (any client), Claude Code's
`x-claude-code-session-id`, Codex's `session-id` header or `client_metadata.session_id`.
Each request it makes is a *turn*: the request's keyed canonical form (the exact bytes its
key is signed over, so key rules apply to it too), the key of the entry that answered it,
and its *masked key*: the key the same request signs to with every tool output replaced by
one placeholder. A replayed request whose exact key misses looks its masked key up: a turn
found there is the same conversation except for what the tools returned.

Everything here is pure. A turn is stored sealed (`seal`): a MAC under the gateway's secret
binds its bytes to its tenant and session, as an entry's MAC binds it to its key, so a
turn altered in the store or in a golden file is refused.
"""
from __future__ import annotations

import hashlib
import hmac
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import orjson

from gateway.policy.json_diff import item, member
from gateway.policy.keys import KeyParts, sign

# Which request header names a session, first found wins.
SESSION_HEADERS = ("x-detgate-session", "x-claude-code-session-id", "session-id", "session_id")
UNNAMED = ""  # the session of requests recorded without a session header
MAX_NAME = 200
PLACEHOLDER = "\u0000detgate:tool-output"  # what a tool output is in a masked key; no client sends NUL text
MAC_LEN = 64

_TENANT_DOMAIN = b"detgate/session-tenant"
_SESSION_DOMAIN = b"detgate/session"
_TURN_DOMAIN = b"detgate/turn"


def session_name(headers: Mapping[str, str], body: dict) -> str:
    """The session a request belongs to, or UNNAMED."""
    for header in SESSION_HEADERS:
        value = headers.get(header)
        if value:
            return value[:MAX_NAME]
    metadata = body.get("client_metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("session_id"), str) and metadata["session_id"]:
        return metadata["session_id"][:MAX_NAME]
    return UNNAMED


def tool_outputs(route: str, doc: Any) -> Iterator[tuple[str, dict, str]]:
    """(path, the object holding it, member) of each tool output in a keyed form: Messages
    `tool_result` content (and its is_error), Responses `*_call_output` output, Chat
    Completions `tool` message content. What a tool returned is data the agent did not
    choose: a replay may differ there and still be the same conversation."""
    if not isinstance(doc, dict):
        return
    if route == "messages":
        for i, message in _items(doc, "messages"):
            for j, block in _items(message, "content"):
                if block.get("type") == "tool_result":
                    at = item(member(item("messages", i), "content"), j)
                    for name in ("content", "is_error"):
                        if name in block:
                            yield member(at, name), block, name
    elif route == "responses":
        for i, entry in _items(doc, "input"):
            if str(entry.get("type", "")).endswith("_call_output") and "output" in entry:
                yield member(item("input", i), "output"), entry, "output"
    elif route == "chat.completions":
        for i, message in _items(doc, "messages"):
            if message.get("role") == "tool" and "content" in message:
                yield member(item("messages", i), "content"), message, "content"


def _items(doc: dict, name: str) -> Iterator[tuple[int, dict]]:
    values = doc.get(name)
    for i, value in enumerate(values if isinstance(values, list) else ()):
        if isinstance(value, dict):
            yield i, value


def masked(route: str, canonical: bytes) -> bytes | None:
    """The keyed form with every tool output replaced by PLACEHOLDER; None when it has none
    (its exact key is then all there is to match)."""
    doc = orjson.loads(canonical)
    found = False
    for _, holder, name in tool_outputs(route, doc):
        holder[name] = PLACEHOLDER
        found = True
    return orjson.dumps(doc) if found else None


def masked_key(secret: bytes, parts: KeyParts, masked_form: bytes) -> str:
    """The key of a request's masked form; never an entry key (its route says so). Made of
    what the request is keyed on (tenant, upstream, model, strategy, keyed headers) and its
    masked form only: not of which key rules fired, which a tool output may decide."""
    return sign(secret, KeyParts(parts.tenant, parts.upstream, parts.model, parts.route + "+tool-outputs",
                                 parts.strategy, masked_form, parts.headers))


def changed_outputs(route: str, recorded: Any, sent: Any) -> tuple[list[str], int]:
    """The paths of the tool outputs a request changed against a recording of the same
    conversation (whose tool outputs sit at the same paths), and how many words those
    outputs still share: of two recordings that differ in as many outputs, the one whose
    outputs differ only in a timestamp is nearer than one that listed other files."""
    before = {path: holder[name] for path, holder, name in tool_outputs(route, recorded)}
    changed, shared = [], 0
    for path, holder, name in tool_outputs(route, sent):
        was, now = before.get(path), holder[name]
        if path not in before or orjson.dumps(was) != orjson.dumps(now):
            changed.append(path)
            shared += sum((_words(was) & _words(now)).values())
    return changed, shared


def _words(value: Any) -> Counter:
    text = value if isinstance(value, str) else orjson.dumps(value).decode().replace("\\n", " ")
    return Counter(text.split())


def _digest(secret: bytes, domain: bytes, *texts: str) -> str:
    message = domain + b"".join(len(t.encode()).to_bytes(8, "big") + t.encode() for t in texts)
    return hmac.new(secret, message, hashlib.sha256).hexdigest()[:32]


def tenant_tag(secret: bytes, namespace: str) -> str:
    """The tenant's name in the store: where all its sessions live (one Redis Cluster slot)."""
    return _digest(secret, _TENANT_DOMAIN, namespace)


def session_tag(secret: bytes, tenant: str, name: str) -> str:
    return _digest(secret, _SESSION_DOMAIN, tenant, name)


@dataclass(frozen=True)
class Turn:
    """One recorded request of a session."""

    session: str  # the session's name as the client sent it
    n: int  # its number in the session, from 0 (turns recorded at once may share one)
    at_ms: int  # when it was recorded
    route: str
    model: str
    key: str  # the entry that answered it
    masked: str | None  # its masked key (None: it has no tool outputs)
    canonical: bytes  # the keyed form, exactly as signed

    def encode(self) -> bytes:
        # The keyed form is embedded as the JSON it is: orjson reads and writes it unchanged.
        head = orjson.dumps({"at": self.at_ms, "key": self.key, "masked": self.masked, "model": self.model,
                             "n": self.n, "route": self.route, "session": self.session})
        return b'{"canonical":' + self.canonical + b"," + head[1:]

    @classmethod
    def decode(cls, raw: bytes) -> Turn:
        """Raises ValueError for bytes that are not a turn."""
        try:
            doc = orjson.loads(raw)
            return cls(doc["session"], doc["n"], doc["at"], doc["route"], doc["model"], doc["key"], doc["masked"],
                       orjson.dumps(doc["canonical"]))
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"not a session turn: {exc}") from None

    def document(self) -> Any:
        return orjson.loads(self.canonical)


def turn_mac(secret: bytes, tenant: str, session: str, raw: bytes) -> str:
    message = _TURN_DOMAIN + b"".join(len(t).to_bytes(8, "big") + t for t in (tenant.encode(), session.encode()))
    return hmac.new(secret, message + raw, hashlib.sha256).hexdigest()


def seal(secret: bytes, tenant: str, session: str, turn: Turn) -> bytes:
    raw = turn.encode()
    return turn_mac(secret, tenant, session, raw).encode() + raw


def verify_turn(secret: bytes, tenant: str, session: str, raw: bytes, mac: str | bytes) -> bool:
    """Whether `mac` seals `raw` for this tenant and session; constant-time, False for any
    malformed mac."""
    if isinstance(mac, str):
        mac = mac.encode("utf-8", "surrogatepass")
    return isinstance(mac, bytes) and hmac.compare_digest(mac, turn_mac(secret, tenant, session, raw).encode())


def unseal(secret: bytes, tenant: str, session: str, value: bytes) -> Turn | None:
    """The turn in a stored value, or None when its MAC fails or it is no turn."""
    if not verify_turn(secret, tenant, session, value[MAC_LEN:], value[:MAC_LEN]):
        return None
    try:
        return Turn.decode(value[MAC_LEN:])
    except ValueError:
        return None
