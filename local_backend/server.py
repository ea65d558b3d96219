"""The OpenAI-compatible HTTP face of the engine (aiohttp): routes, validation, errors.

Handlers validate, tokenize and fix the sampling parameters, then hand the request to
responses.py, which submits it to the engine (engine/client.py). A request without a seed is given
one here; every response names it (the `seed` field and the x-detgate-seed header), so
any answer can be replayed.
"""
from __future__ import annotations

import asyncio
import logging
import os

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from local_backend import grammar, tool_calls
from local_backend.engine.client import EngineClient
from local_backend.protocol import APIError, ChatRequest, CompletionRequest, NamedToolChoice, parse
from local_backend.responses import ChatHandler, CompletionHandler, json_response, respond
from local_backend.sampling_params import SamplingParams
from local_backend.tokenizer import TemplateError

log = logging.getLogger(__name__)

ENGINE = web.AppKey("engine", EngineClient)
MODEL_NAME = web.AppKey("model_name", str)
MAX_BODY_BYTES = 16 << 20
BACKEND_HEADER = "x-detgate-backend"   # on every response: this server is detgate's whitebox backend


def new_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1   # non-negative and fits int64


@web.middleware
async def errors(request: web.Request, handler):
    """Every failure leaves as an OpenAI-shaped error, and every request is counted."""
    metrics = request.app[ENGINE].metrics
    try:
        response = await handler(request)
    except APIError as e:
        response = json_response(e.body(), e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = "invalid_request_error" if e.status < 500 else "server_error"
        response = json_response(APIError(e.status, e.reason, type=kind).body(), e.status)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        response = json_response(APIError(500, "internal server error", type="server_error").body(), 500)
    if request.path.startswith("/v1/"):
        metrics.requests.labels(status=str(response.status)).inc()
    return response


async def read_body(request: web.Request):
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None


def check_model(request: web.Request, model: str) -> None:
    served = request.app[MODEL_NAME]
    if model != served:
        raise APIError(404, f"the model '{model}' does not exist; this server serves '{served}'",
                       param="model", code="model_not_found")


def sampling_params(req, engine: EngineClient, prompt_len: int, max_tokens: int | None, logprobs: int | None,
                    prompt_logprobs: int | None = None, constraint: str | None = None):
    if max_tokens is None:
        max_tokens = engine.info.max_model_len - prompt_len
    problem = engine.info.capacity_error(prompt_len, max_tokens)
    if problem:
        raise APIError(400, problem, param="messages" if isinstance(req, ChatRequest) else "prompt",
                       code="context_length_exceeded")
    # generation_config.json's defaults fill what the request leaves unset; the response names them.
    defaults = {name: value for name, value in engine.model_config.generation.defaults if getattr(req, name) is None}
    return SamplingParams(
        seed=new_seed() if req.seed is None else req.seed,
        max_tokens=max_tokens,
        temperature=defaults.get("temperature", 1.0) if req.temperature is None else req.temperature,
        top_p=defaults.get("top_p", 1.0) if req.top_p is None else req.top_p,
        top_k=defaults.get("top_k", 0) if req.top_k is None else max(req.top_k, 0),
        defaults=tuple(defaults.items()),
        logprobs=logprobs,
        ignore_eos=bool(req.ignore_eos),
        prompt_logprobs=prompt_logprobs,
        min_tokens=req.min_tokens or 0,
        min_p=float(req.min_p or 0.0),
        repetition_penalty=float(req.repetition_penalty or 1.0),
        grammar=constraint)


# Template variables a request's chat_template_kwargs may not set: the server sets them.
RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token")


def render_args(req: ChatRequest, engine: EngineClient) -> dict:
    """What the chat template is rendered with, as transformers' apply_chat_template passes it."""
    variables = dict(req.chat_template_kwargs or {})
    reserved = sorted(set(variables) & set(RESERVED_TEMPLATE_VARIABLES))
    if reserved:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(reserved)}", param="chat_template_kwargs")
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    if req.calls_tools() and "tools" not in engine.tokenizer.renders:
        raise APIError(400, "this model's chat template does not render tools, so the model would not know them; "
                       "serve it with --chat-template naming one that does", param="tools")
    return dict(tools=tools, documents=req.documents, add_generation_prompt=req.add_generation_prompt is not False,
                variables=variables, continue_final=bool(req.continue_final_message))


def guided(req, engine: EngineClient) -> str | None:
    """The grammar of vLLM's guided_json / guided_regex / guided_choice / structured_outputs, if asked."""
    asked = req.guided()
    if asked is None:
        return None
    field, kind, value = asked
    try:
        if kind == "json":
            made = grammar.json_schema(orjson.loads(value) if isinstance(value, str) else value)
        else:
            made = {"json_object": grammar.json_object, "regex": grammar.regex, "choice": grammar.choice}[kind](
                *([] if kind == "json_object" else [value]))
        return engine.grammar_checked(made)
    except (grammar.GrammarError, orjson.JSONDecodeError) as e:
        raise APIError(400, f"{field} cannot be compiled to a grammar: {e}", param=field) from None


def constraint(req: ChatRequest, engine: EngineClient, kind: str | None) -> str | None:
    """The grammar the answer is held to, if any; a 400 naming the field for one that does not compile."""
    if req.guided() is not None:
        return guided(req, engine)
    choice, fmt = req.tool_choice, req.response_format
    tools = None
    if req.tools and (choice == "required" or isinstance(choice, NamedToolChoice)):
        tools = req.tools if choice == "required" else [t for t in req.tools if t.function.name == choice.function.name]
    elif req.calls_tools() and any(t.function.strict for t in req.tools):
        tools = req.tools   # auto: strict tools' arguments held to their schemas
    if tools is not None:
        parallel = not isinstance(choice, NamedToolChoice) and req.parallel_tool_calls is not False
        try:
            return engine.grammar_checked(tool_calls.call_grammar(kind, tools, parallel,
                                                                  optional=tools is req.tools and choice != "required"))
        except grammar.GrammarError as e:
            raise APIError(400, f"a tool's parameters cannot be compiled to a grammar: {e}", param="tools") from None
    if fmt is None or fmt.type == "text":
        return None
    schema = fmt.json_schema.schema_ if fmt.type == "json_schema" else None
    field = "response_format.json_schema.schema" if fmt.type == "json_schema" else "response_format"
    try:
        return engine.grammar_checked(grammar.json_object() if schema is None else grammar.json_schema(schema))
    except grammar.GrammarError as e:
        raise APIError(400, f"the schema cannot be compiled to a grammar: {e}", param=field) from None


async def chat_completions(request: web.Request):
    engine = request.app[ENGINE]
    req: ChatRequest = parse(ChatRequest, await read_body(request))
    check_model(request, req.model)
    kind = tool_calls.family(engine.tokenizer.template_source) if req.calls_tools() else None
    if req.calls_tools() and kind is None:
        raise APIError(400, "this model's chat template teaches no tool-call form this backend parses "
                       "(<tool_call> blocks, or Llama 3's JSON calls)", param="tools")
    args = render_args(req, engine)
    try:
        prompt = engine.tokenizer.encode_chat([m.for_template() for m in req.messages], **args)
    except TemplateError as e:
        raise APIError(400, str(e), param="messages") from None
    max_tokens = req.max_completion_tokens or req.max_tokens
    top = req.top_logprobs or 0
    params = sampling_params(req, engine, len(prompt), max_tokens, top if req.logprobs else None, req.prompt_logprobs,
                             constraint(req, engine, kind))
    return await respond(ChatHandler(request, engine, request.app[MODEL_NAME], req, prompt, params, tool_kind=kind))


async def completions(request: web.Request):
    engine = request.app[ENGINE]
    req: CompletionRequest = parse(CompletionRequest, await read_body(request))
    check_model(request, req.model)
    if isinstance(req.prompt, str):
        prompt = engine.tokenizer.encode(req.prompt, add_special_tokens=True)
    else:
        vocab = engine.model_config.vocab_size
        if any(not 0 <= t < vocab for t in req.prompt):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        prompt = list(req.prompt)
    if not prompt:
        raise APIError(400, "the prompt is empty after tokenization", param="prompt")
    params = sampling_params(req, engine, len(prompt), 16 if req.max_tokens is None else req.max_tokens,
                             req.logprobs, req.scored_prompt_logprobs(), guided(req, engine))
    return await respond(CompletionHandler(request, engine, request.app[MODEL_NAME], req, prompt, params))


def announcement(engine: EngineClient) -> dict:
    """What this backend tells a gateway about itself, so that it picks the matching profile
    unconfigured: `whitebox` where answers replay bit for bit (invariant mode); the vendor
    kernels of standard mode do not, so there it asks to be treated as any other server."""
    return {"profile": "whitebox" if engine.config.mode == "invariant" else "generic-openai-compatible",
            "mode": engine.config.mode, "system_fingerprint": engine.info.fingerprint,
            "kernel_version": engine.info.kernel_version, "features": features(engine)}


def features(engine: EngineClient) -> list[str]:
    """What a gateway may rely on: `strict_json` means a strict schema is enforced by the decoder,
    so an answer that finished by stopping is valid JSON of its schema (no retries needed)."""
    out = ["structured_outputs", "strict_json", "guided_decoding", "min_tokens", "min_p", "repetition_penalty"]
    if tool_calls.family(engine.tokenizer.template_source) and "tools" in engine.tokenizer.renders:
        out.append("tools")
    return sorted(out)


async def models(request: web.Request):
    name, engine = request.app[MODEL_NAME], request.app[ENGINE]
    return json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "detgate",
         "system_fingerprint": engine.info.fingerprint, "detgate": announcement(engine)}]})


async def name_the_backend(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[BACKEND_HEADER] = "whitebox"


async def healthz(request: web.Request):
    engine = request.app[ENGINE]
    alive, info = engine.alive, engine.info
    body = {"status": "ok" if alive else "engine stopped", "model": request.app[MODEL_NAME],
            "system_fingerprint": info.fingerprint, "toolchain": info.toolchain, "mode": engine.config.mode,
            "dtype": info.dtype, "checkpoint_dtype": engine.model_config.dtype,
            "prefix_caching": info.prefix_caching, "max_batch": info.max_batch, "last_error": engine.last_error}
    return json_response(body, 200 if alive else 503)


async def metrics(request: web.Request):
    body = generate_latest(request.app[ENGINE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def engine_running(app: web.Application):
    engine = app[ENGINE]
    engine.start()
    yield
    await asyncio.get_running_loop().run_in_executor(None, engine.stop)


def make_app(engine: EngineClient, model_name: str) -> web.Application:
    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY_BYTES)
    app[ENGINE] = engine
    app[MODEL_NAME] = model_name
    app.cleanup_ctx.append(engine_running)
    app.on_response_prepare.append(name_the_backend)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app
