"""The x-detgate-warnings header, gathered as a request is answered."""
from __future__ import annotations


def warn(headers: dict[str, str], warning: str) -> None:
    headers["x-detgate-warnings"] = "; ".join(filter(None, (headers.get("x-detgate-warnings"), warning)))
