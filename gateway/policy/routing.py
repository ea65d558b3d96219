"""Which upstream answers a request: only ever one of the configured ones, and only one
that serves the request's surface.

An upstream serves the surfaces its config lists (`surfaces`), else every surface of its
profile's wire: an OpenAI-compatible upstream the OpenAI routes, an `anthropic` one
/v1/messages. A model sent, by its "NAME/" prefix or a glob, to an upstream that does not
serve the surface is the client's 400, never a call in a wire the upstream does not speak.
"""
from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Mapping

from gateway.apis.surface import Surface
from gateway.config import UpstreamConfig
from gateway.errors import ApiError
from gateway.policy.profiles import Profile


def serves(upstream: UpstreamConfig, surface: Surface, profiles: Mapping[str, Profile]) -> bool:
    if upstream.surfaces is not None:
        return surface.name in upstream.surfaces
    return profiles[upstream.profile].wire == surface.wire


def route(upstreams: tuple[UpstreamConfig, ...], profiles: Mapping[str, Profile], surface: Surface,
          model: str) -> tuple[UpstreamConfig, str]:
    """(upstream, model name it is sent). "NAME/rest" picks upstream NAME and sends "rest";
    otherwise the first upstream serving the surface whose globs match, else the first one
    serving it. Raises ApiError when the model's upstream does not serve the surface (400)
    or none does (404)."""
    name, sep, rest = model.partition("/")
    if sep and rest:
        for upstream in upstreams:
            if upstream.name == name:
                if not serves(upstream, surface, profiles):
                    raise _unserved(model, upstream, surface, profiles)
                return upstream, rest
    matched = [u for u in upstreams if any(fnmatchcase(model, glob) for glob in u.models)]
    for upstream in matched:
        if serves(upstream, surface, profiles):
            return upstream, model
    if matched:
        raise _unserved(model, matched[0], surface, profiles)
    for upstream in upstreams:
        if serves(upstream, surface, profiles):
            return upstream, model
    raise ApiError(404, f"No upstream of this gateway serves /v1{surface.path}: give one the profile of that wire, "
                        f"or list {surface.name!r} in its `surfaces`.", param="model", code="no_upstream_for_route")


def _unserved(model: str, upstream: UpstreamConfig, surface: Surface, profiles: Mapping[str, Profile]) -> ApiError:
    speaks = (f"it serves {', '.join(upstream.surfaces) or 'no cached route'}" if upstream.surfaces is not None
              else f"its profile {upstream.profile!r} speaks the {profiles[upstream.profile].wire} wire")
    return ApiError(400, f"Model {model!r} is routed to upstream {upstream.name!r}, which does not serve "
                         f"/v1{surface.path} ({speaks}); route the model to an upstream that does.",
                    param="model", code="upstream_does_not_serve_route")
