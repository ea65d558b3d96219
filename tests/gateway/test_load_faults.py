"""A small load + fault run (bench/load_faults.py) through two real gateway processes, over
all five routes (Responses and Messages with tools and chained turns), streamed and not:
Redis is killed -9 and restarted while the upstream fails in every way it can, each wire in
its own shapes.
Nothing may be lost and no stored entry may be partial, an error, or change under a reader."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_nothing_lost_and_nothing_corrupt_under_faults(tmp_path):
    out = tmp_path / "run"
    subprocess.run([sys.executable, str(REPO / "bench" / "load_faults.py"), "--requests", "600",
                    "--gateways", "2", "--concurrency", "24", "--hot-keys", "50", "--kill-every", "150",
                    "--down-for", "0.5", "--stall-s", "0.5", "--max-seconds", "60", "--out", str(out)],
                   check=True, timeout=180, cwd=REPO, capture_output=True)
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["requests_sent"] == 600 and report["redis_kills"] >= 1
    assert report["lost"] == 0, report["outcomes"]
    assert report["corrupt_entries"] == 0, report["corrupt_examples"]
    assert report["processes_died"] == []
    # The faults really happened, and were absorbed by retries or passed on as errors.
    assert sum(report["upstream_retries_by_reason"].values()) > 0
    assert report["answered_ok"] > 0 and report["outcomes"].get("ok:hit", 0) > 0
    # Answers given while Redis was down say so, and only those: every other answer came from the store.
    assert report["bypass"] > 0 and report["first_fill_differs_from_entry"] == 0
    # A live stream differs from its entry only where the gateway knew it sent an answer the cache lacks.
    assert report["live_stream_differs_from_entry"] <= report["live_streams_unstored"]
    routes = report["outcomes_by_route"]
    assert all(routes.get(f"{route} ok", 0) > 0 for route in ("chat", "text", "embed", "resp", "msg"))
