"""What the fake model asks each agent to do, with each agent's own tools: write hello.txt,
show it, show data.txt (the file of tricky bytes). `volatile` adds the time in nanoseconds to
the second command's output, a tool output that differs on every run."""
from __future__ import annotations

from pathlib import Path

HELLO = "hello from the fake model\n"
PROMPT = "Create hello.txt, then show it and data.txt."


def _show(volatile: bool) -> str:
    return "cat hello.txt && date +%s%N" if volatile else "cat hello.txt"


def claude_script(project: Path, volatile: bool = False) -> list[tuple[str, dict]]:
    # Bash, not Read, shows data.txt: Claude Code's Read tool itself drops a BOM and CRLF
    # before anything leaves the CLI, which would hide what the gateway does.
    return [("Write", {"file_path": str(project / "hello.txt"), "content": HELLO}),
            ("Bash", {"command": _show(volatile), "description": "Show hello.txt"}),
            ("Bash", {"command": "cat data.txt", "description": "Show data.txt"})]


def codex_script(project: Path, volatile: bool = False) -> list[tuple[str, str]]:
    """Codex's default model runs commands through `exec`, a freeform tool taking JavaScript
    that calls the nested `exec_command`."""
    def run(command: str) -> str:
        return f"const r = await tools.exec_command({{cmd: {command!r}, workdir: {str(project)!r}}});\ntext(r.output);\n"
    return [("exec", run(f"printf '{HELLO[:-1]}\\n' > hello.txt")),
            ("exec", run(_show(volatile))),
            ("exec", run("cat data.txt"))]
