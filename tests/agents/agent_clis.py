"""The real agent CLIs, installed from npm into build/agents, and how the tests run them.

Each run gets the same absolute workspace and HOME paths (an agent's prompt holds both, so a
replay needs them unchanged) and only the environment it needs: no telemetry, no update
checks, nothing but the base URL it is pointed at.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREFIX = REPO / "build" / "agents"
# Pinned: a new CLI release changes what it sends, and the fixtures record what these send.
PACKAGES = {"@anthropic-ai/claude-code": "2.1.197", "@openai/codex": "0.171.0"}
CLAUDE = PREFIX / "node_modules" / ".bin" / "claude"
CODEX = PREFIX / "node_modules" / ".bin" / "codex"

SECRET = "agent-tests-secret"  # the gateways' signing secret: a golden file checks it

# Bytes an agent must pass on as they are on disk: a BOM, CRLF line ends, a zero-width space
# and an e-acute in decomposed form (e + U+0301).
TRICKY = b"\xef\xbb\xbfline one\r\nzero\xe2\x80\x8bwidth cafe\xcc\x81\r\n"


def installed() -> bool:
    def version(package: str) -> str | None:
        manifest = PREFIX / "node_modules" / package / "package.json"
        if not manifest.exists():
            return None
        return json.loads(manifest.read_text()).get("version")
    return all(version(p) == v for p, v in PACKAGES.items()) and CLAUDE.exists() and CODEX.exists()


def install() -> subprocess.CompletedProcess:
    """npm install of the pinned CLIs (a no-op when they are there)."""
    PREFIX.mkdir(parents=True, exist_ok=True)
    specs = [f"{p}@{v}" for p, v in PACKAGES.items()]
    return subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(PREFIX), *specs],
                          capture_output=True, text=True, timeout=600)


@dataclass
class Workspace:
    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def project(self) -> Path:
        return self.root / "project"

    @classmethod
    def fresh(cls, root: Path) -> Workspace:
        """The workspace at `root`, emptied: the same paths every run, the same files to start with."""
        shutil.rmtree(root, ignore_errors=True)
        space = cls(Path(root))
        space.home.mkdir(parents=True)
        space.project.mkdir(parents=True)
        (space.project / "data.txt").write_bytes(TRICKY)
        return space

    def files(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.project)): p.read_bytes()
                for p in sorted(self.project.rglob("*")) if p.is_file()}


def _base_env(space: Workspace) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(space.home), "LANG": "C.UTF-8",
            "TERM": "dumb", "TMPDIR": str(space.root / "tmp")}


def claude_command(space: Workspace, base_url: str, prompt: str, *, wrap: list[str] = (),
                   output: str = "json") -> tuple[list[str], dict[str, str]]:
    """The argv and environment of one `claude -p` run (`output`: json, or stream-json)."""
    (space.root / "tmp").mkdir(exist_ok=True)
    env = {**_base_env(space), "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "x",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
           "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1"}
    streamed = ["--verbose", "--include-partial-messages"] if output == "stream-json" else []
    argv = [*wrap, str(CLAUDE), "-p", prompt, "--output-format", output, *streamed,
            "--allowedTools", "Write,Bash,Read"]
    return argv, env


def run_claude(space: Workspace, base_url: str, prompt: str, *, wrap: list[str] = (),
               timeout: float = 180) -> subprocess.CompletedProcess:
    argv, env = claude_command(space, base_url, prompt, wrap=wrap)
    return subprocess.run(argv, cwd=space.project, env=env, capture_output=True, text=True, timeout=timeout)


def codex_config(base_url: str) -> str:
    return ('model_provider = "detgate"\n'
            '[model_providers.detgate]\n'
            'name = "detgate"\n'
            f'base_url = "{base_url}/v1"\n'
            'wire_api = "responses"\n'
            'env_key = "OPENAI_API_KEY"\n')


def run_codex(space: Workspace, base_url: str, prompt: str, *, timeout: float = 180) -> subprocess.CompletedProcess:
    (space.root / "tmp").mkdir(exist_ok=True)
    codex_home = space.home / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url))
    env = {**_base_env(space), "CODEX_HOME": str(codex_home), "OPENAI_API_KEY": "x", "RUST_LOG": "error"}
    argv = [str(CODEX), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--color", "never", prompt]
    return subprocess.run(argv, cwd=space.project, env=env, capture_output=True, text=True, timeout=timeout)
