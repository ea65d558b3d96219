"""Which upstream answers a model: only ever one of the configured ones."""
from __future__ import annotations

from fnmatch import fnmatchcase

from gateway.config import UpstreamConfig


def route(upstreams: tuple[UpstreamConfig, ...], model: str) -> tuple[UpstreamConfig, str]:
    """(upstream, model name it is sent). "NAME/rest" picks upstream NAME and sends "rest";
    otherwise the first upstream whose globs match, else the first upstream."""
    name, sep, rest = model.partition("/")
    if sep and rest:
        for upstream in upstreams:
            if upstream.name == name:
                return upstream, rest
    for upstream in upstreams:
        if any(fnmatchcase(model, glob) for glob in upstream.models):
            return upstream, model
    return upstreams[0], model
