"""Requests shaped like those Claude Code 2.1 and Codex 0.171 send (read off captures of the
real CLIs: headers, top-level members, item and block types, where the volatile values sit),
cut down to what the tests need. Each call makes one run's volatile values afresh."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid

# The file both agents read in the captures: a BOM, CRLF line ends, a zero-width space and a
# decomposed e-acute, which must reach the model as they are on disk.
DATA = "\ufeffline one\r\nzero\u200bwidth cafe\u0301\r\n"
TODAY = dt.datetime.now(dt.timezone.utc).date()
TOMORROW = TODAY + dt.timedelta(days=1)

CLAUDE_UA = "claude-cli/2.1.197 (external, sdk-cli)"
CLAUDE_MODEL = "claude-opus-4-8"
CLAUDE_BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27",
                "mid-conversation-system-2026-04-07", "effort-2025-11-24"]
BASH = {"name": "Bash", "description": "Executes a bash command and returns its output.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                                                          "description": {"type": "string"}},
                         "required": ["command"], "additionalProperties": False}}
READ = {"name": "Read", "description": "Reads a file from the local filesystem.",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                         "required": ["file_path"], "additionalProperties": False}}


def claude_run() -> tuple[dict, str]:
    """(the headers, the session id) of one Claude Code run."""
    session = str(uuid.uuid4())
    return {"user-agent": CLAUDE_UA, "x-claude-code-session-id": session, "x-app": "cli"}, session


def claude_request(day: dt.date, session: str, tool_output: str | None = None) -> dict:
    """The arguments of `client.beta.messages.create` for a turn: the first one, or the one
    after a Read whose tool_result holds `tool_output`."""
    messages = [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use the following "
                                     f"context:\n# currentDate\nToday's date is {day.isoformat()}.\n</system-reminder>\n\n"},
            {"type": "text", "text": "Read data.txt."}]},
        {"role": "system", "content": "Available agent types for the Agent tool:\n- Explore: Read-only search agent."},
    ]
    if tool_output is not None:
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": "Reading it."},
                                              {"type": "tool_use", "id": "toolu_01", "name": "Read",
                                               "input": {"file_path": "/ws/project/data.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": tool_output,
                                          "cache_control": {"type": "ephemeral"}}]},
        ]
    device = hashlib.sha256(session.encode()).hexdigest()
    return {
        "model": CLAUDE_MODEL, "max_tokens": 64000, "betas": CLAUDE_BETAS,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;"},
                   {"type": "text", "text": "You are a Claude agent.\nPrimary working directory: /ws/project",
                    "cache_control": {"type": "ephemeral"}}],
        "messages": messages, "tools": [BASH, READ],
        "metadata": {"user_id": json.dumps({"device_id": device, "account_uuid": "", "session_id": session})},
        "thinking": {"type": "adaptive"},
        "extra_body": {"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                       "output_config": {"effort": "high"}},
    }


CODEX_UA = "codex_exec/0.171.0 (Debian 12.0.0; x86_64) dumb (codex_exec; 0.171.0)"
CODEX_MODEL = "fake/gpt-6.2-sol"


def _uuid7() -> str:
    """A UUIDv7 as Codex mints them: the time first, then random bits."""
    raw = bytearray(int(dt.datetime.now().timestamp() * 1000).to_bytes(6, "big") + uuid.uuid4().bytes[6:])
    raw[6] = 0x70 | (raw[6] & 0x0F)
    return str(uuid.UUID(bytes=bytes(raw)))


def codex_run() -> dict:
    """The ids one Codex run mints: session, turn, installation."""
    return {"session": _uuid7(), "turn": _uuid7(), "installation": str(uuid.uuid4())}


def codex_request(day: dt.date, run: dict, wall_time: str = "0.1", output: str | None = None) -> dict:
    """The arguments of `client.responses.create` for a turn: the first one, or the one after
    an exec call whose output is `output` (its report says `wall_time`)."""
    def item_id(prefix: str) -> str:
        return f"{prefix}_{_uuid7()}"

    items = [
        {"type": "additional_tools", "id": item_id("at"), "role": "developer", "tools": [
            {"type": "namespace", "name": "functions", "description": "", "tools": [
                {"type": "custom", "name": "exec", "description": "Run JavaScript code to orchestrate tool calls.",
                 "format": {"type": "grammar", "syntax": "lark", "definition": "start: /[\\s\\S]+/"}}]}]},
        {"type": "message", "id": item_id("msg"), "role": "developer",
         "content": [{"type": "input_text", "text": "You are Codex, an agent based on GPT-6."}]},
        {"type": "message", "id": item_id("msg"), "role": "user", "content": [{"type": "input_text", "text": (
            "<environment_context>\n  <cwd>/ws/project</cwd>\n  <shell>bash</shell>\n"
            f"  <current_date>{day.isoformat()}</current_date>\n  <timezone>Etc/UTC</timezone>\n"
            "</environment_context>")}]},
        {"type": "message", "id": item_id("msg"), "role": "user",
         "content": [{"type": "input_text", "text": "Read data.txt."}]},
    ]
    if output is not None:
        items += [
            {"type": "custom_tool_call", "id": "ctc_9e5f6a9a", "status": "completed", "call_id": "call_2707f6b1",
             "name": "exec", "input": "const r = await tools.exec_command({cmd: 'cat data.txt'});\ntext(r.output);\n"},
            {"type": "custom_tool_call_output", "id": item_id("ctco"), "call_id": "call_2707f6b1", "output": [
                {"type": "input_text", "text": f"Script completed\nWall time {wall_time} seconds\nOutput:\n"},
                {"type": "input_text", "text": output}]},
        ]
    turn_metadata = {"installation_id": run["installation"], "session_id": run["session"], "turn_id": run["turn"],
                     "turn_started_at_unix_ms": int(dt.datetime.now().timestamp() * 1000)}
    return {
        "model": CODEX_MODEL, "input": items, "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "low", "context": "all_turns"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": run["session"], "text": {"verbosity": "low"},
        "extra_body": {"client_metadata": {
            "turn_id": run["turn"], "x-codex-installation-id": run["installation"], "session_id": run["session"],
            "thread_id": run["session"], "x-codex-turn-metadata": json.dumps(turn_metadata)}},
        "extra_headers": {"user-agent": CODEX_UA, "session-id": run["session"], "originator": "codex_exec"},
    }
