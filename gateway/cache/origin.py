"""What an entry records about its own filling, for the operator's cache API: which tenant's
request filled it, on which upstream, surface and model, when, on which replica, and a short
summary of the request with the fields its key was signed over.

The key itself is an HMAC and says none of this, so without it a cache could be neither
filtered nor explained. Kept small (a preview, not the prompt): it is stored with every entry.
"""
from __future__ import annotations

import hashlib
import os
import socket
from typing import Any

from gateway.policy.canonical import canonical_json
from gateway.policy.keys import KEY_SCHEMA_VERSION

PREVIEW_CHARS = 160
# Request fields shown in the summary: what changes an answer's shape or randomness.
SUMMARY_FIELDS = ("temperature", "top_p", "top_k", "seed", "n", "max_tokens", "max_completion_tokens",
                  "max_output_tokens", "stop", "reasoning_effort")
REPLICA = f"{socket.gethostname()}:{os.getpid()}"


def fill_origin(prepared: Any, call: Any, mode: str) -> dict[str, Any]:
    """The origin of an entry `call` (of `prepared`) would fill, less the time, stamped when the
    answer lands."""
    body, tenant, pinned_model = call.body, prepared.tenant, prepared.model
    texts = [text for _, text in call.surface.texts(body)]
    last = texts[-1] if texts else ""
    summary: dict[str, Any] = {k: body[k] for k in SUMMARY_FIELDS if k in body}
    summary.update(stream=call.stream, texts=len(texts),
                   preview=last[:PREVIEW_CHARS] + ("…" if len(last) > PREVIEW_CHARS else ""))
    if body.get("tools"):
        summary["tools"] = len(body["tools"])
    return {
        "tenant": tenant.name,
        "upstream": call.upstream.name,
        "surface": call.surface.name,
        "model": pinned_model,
        "sent_model": body.get("model"),
        "request": summary,
        "key_fields": {"key_schema": KEY_SCHEMA_VERSION, "namespace": tenant.namespace, "upstream": call.upstream.name,
                       "model": pinned_model, "route": call.surface.name, "strategy": call.spec.name,
                       "seed": call.seed,
                       "sent_body_sha256": hashlib.sha256(canonical_json(body)).hexdigest()},
        "filled_by": {"replica": REPLICA, "tenant": tenant.name, "mode": mode},
    }
