"""What the fake model asks each agent to do: its own tools, with paths in the workspace."""
from __future__ import annotations

from pathlib import Path

HELLO = "hello from the fake model\n"


def claude_script(project: Path) -> list[tuple[str, dict]]:
    return [("Write", {"file_path": str(project / "hello.txt"), "content": HELLO}),
            ("Bash", {"command": "cat hello.txt && date +%s%N", "description": "Show the file and the time"}),
            ("Read", {"file_path": str(project / "data.txt")})]


def codex_script(project: Path) -> list[tuple[str, str]]:
    """Codex's default model runs commands through `exec`, a freeform tool taking JavaScript
    that calls the nested `exec_command`."""
    def run(command: str) -> str:
        return f"const r = await tools.exec_command({{cmd: {command!r}, workdir: {str(project)!r}}});\ntext(r.output);\n"
    return [("exec", run(f"printf '{HELLO[:-1]}\\n' > hello.txt")),
            ("exec", run("cat hello.txt && date +%s%N")),
            ("exec", run("cat data.txt"))]
