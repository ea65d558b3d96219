"""deploy/docker-compose.yml: valid for the Compose specification, and every service's
image, command, ports, volumes and environment agree with what the gateway, the backend,
Prometheus and Grafana actually read. Docker cannot run here, so each claim the compose
file makes is checked against the file or program on the other side of it."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from gateway import cli

from gateway import config

from . import compose
from .promql import DEPLOY

REPO = DEPLOY.parent
# Vendored (source, version and licence in schemas/README.md): a clone needs nothing beside it.
SCHEMA = Path(__file__).resolve().parent / "schemas" / "compose-spec.json"
# What a user puts in .env: the example with its required secrets filled in.
ENV = {**compose.read_env_file(compose.ENV_EXAMPLE), "DETGATE_SECRET": "test-secret", "GRAFANA_ADMIN_PASSWORD": "test",
       "DETGATE_OPERATOR_TOKEN": "test-operator-token"}


@pytest.fixture(scope="module")
def spec() -> dict:
    return compose.resolved(ENV)


def services(spec) -> dict:
    return spec["services"]


def container_port(service: dict) -> int:
    (mapping,) = service["ports"]
    return int(str(mapping).rsplit(":", 1)[1])


def mounts(service: dict) -> dict[str, Path | str]:
    """Container path -> host path (relative to deploy/) or volume name."""
    out = {}
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2]
        out[target] = DEPLOY / source if source.startswith(".") else source
    return out


def healthcheck_url(service: dict) -> str:
    (url,) = re.findall(r"http://[^'\" ]+", " ".join(service["healthcheck"]["test"]))
    return url


@pytest.mark.parametrize("env", ["raw", "interpolated"])
def test_valid_against_compose_spec(env):
    schema = json.loads(SCHEMA.read_text())
    doc = compose.raw() if env == "raw" else compose.resolved(ENV)
    jsonschema.Draft7Validator(schema).validate(doc)


def test_env_example_declares_exactly_the_variables_used():
    used = compose.referenced_variables(compose.COMPOSE.read_text())
    declared = set(compose.read_env_file(compose.ENV_EXAMPLE))
    assert used == declared


def test_required_secrets_are_refused_when_missing():
    with pytest.raises(compose.MissingVariable, match="DETGATE_SECRET"):
        compose.resolved(compose.read_env_file(compose.ENV_EXAMPLE))


def test_every_service_is_healthchecked_and_restarts(spec):
    for name, s in services(spec).items():
        assert s["healthcheck"]["test"][0] == "CMD", name
        assert s["restart"] == "unless-stopped", name


def test_redis_persists_to_a_volume(spec):
    redis = services(spec)["redis"]
    assert "--appendonly" in redis["command"] and redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert mounts(redis)["/data"] in spec["volumes"]


@pytest.mark.parametrize("name", ["gateway", "backend"])
def test_images_build_from_files_that_exist(spec, name):
    build = services(spec)[name]["build"]
    context = (DEPLOY / build["context"]).resolve()
    dockerfile = context / build["dockerfile"]
    assert context == REPO and dockerfile.is_file()
    ignore = Path(f"{dockerfile}.dockerignore").read_text().splitlines()
    kept = {line[1:] for line in ignore if line.startswith("!")}
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, _ = line.split()[1:]
            for src in sources:
                assert (context / src).exists(), f"{dockerfile.name}: COPY {src} does not exist"
                assert src in kept, f"{dockerfile.name}: COPY {src} is excluded by its .dockerignore"


@pytest.mark.parametrize("name", ["gateway.Dockerfile", "backend.Dockerfile"])
def test_dockerfiles_pull_no_frontend(name):
    """A `# syntax=` line makes BuildKit pull a frontend image, which fails where only the
    base images can be had: the engine's built-in frontend must do."""
    assert not any(line.lower().replace(" ", "").startswith("#syntax=")
                   for line in (DEPLOY / name).read_text().splitlines())


def test_gateway_image_has_no_torch():
    text = (DEPLOY / "gateway.Dockerfile").read_text()
    copied = {src for line in text.splitlines() if line.startswith("COPY ") and "--from" not in line
              for src in line.split()[1:-1]}
    assert copied == {"pyproject.toml", "README.md", "gateway"}
    assert "[backend]" not in text


def dockerfile_directive(name: str, directive: str) -> str:
    (line,) = [l for l in (DEPLOY / name).read_text().splitlines() if l.startswith(directive + " ")]
    return line[len(directive) + 1:]


def gateway_settings(spec) -> tuple[list[str], config.Settings]:
    """Parse the gateway's compose command with the gateway's own parser and load its
    settings exactly as `detgate serve` would inside the container."""
    gw = services(spec)["gateway"]
    args = cli.build_parser().parse_args(gw["command"])
    assert args.command == "serve"
    config_on_host = mounts(gw)[args.config]
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    return gw, config.load(str(config_on_host), gw["environment"], flags)


def test_gateway_reads_what_compose_gives_it(spec):
    gw, settings = gateway_settings(spec)
    env_fields = {f"DETGATE_{f.upper()}" for f in config.Settings.model_fields}
    assert {k for k in gw["environment"] if k.startswith("DETGATE_")} <= env_fields
    assert settings.host == "0.0.0.0"
    port = settings.port
    assert container_port(gw) == port
    assert urlsplit(healthcheck_url(gw)).port == port and urlsplit(healthcheck_url(gw)).path == "/readyz"
    assert dockerfile_directive("gateway.Dockerfile", "EXPOSE") == str(port)
    assert settings.secret.get_secret_value() == ENV["DETGATE_SECRET"]
    assert gw["depends_on"]["redis"]["condition"] == "service_healthy"
    redis = urlsplit(settings.redis_url)
    assert redis.hostname == "redis" and (redis.port or 6379) == 6379
    # Every upstream key the config names is passed in from the environment.
    for up in settings.upstreams:
        assert up.api_key is None, "keys belong in .env, not in the committed config"
        assert up.api_key_env is None or up.api_key_env in gw["environment"]


def test_gateway_image_default_command_parses():
    args = cli.build_parser().parse_args(json.loads(dockerfile_directive("gateway.Dockerfile", "CMD")))
    assert args.command == "serve" and args.host == "0.0.0.0"


def test_gateway_reaches_the_backend_where_compose_runs_it(spec):
    _, settings = gateway_settings(spec)
    backend = services(spec)["backend"]
    (local,) = [u for u in settings.upstreams if urlsplit(u.url).hostname == "backend"]
    assert local.profile == "whitebox"
    assert urlsplit(local.url).port == urlsplit(healthcheck_url(backend)).port


def backend_flags(argv: list[str]) -> dict[str, str]:
    it = iter(argv[1:])
    return {flag: next(it) for flag in it}


@pytest.fixture(scope="module")
def backend_help() -> str:
    if not (REPO / "local_backend" / "cli.py").exists():
        pytest.skip("local_backend/cli.py is not written yet")
    done = subprocess.run([sys.executable, "-m", "gateway", "backend", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_backend_command_uses_flags_the_backend_has(spec, backend_help):
    backend = services(spec)["backend"]
    for argv in (backend["command"], json.loads(dockerfile_directive("backend.Dockerfile", "CMD"))):
        assert argv[0] == "backend"
        for flag in backend_flags(argv):
            assert re.search(rf"(^|\s){re.escape(flag)}\b", backend_help), f"detgate backend has no {flag}"


def test_backend_is_a_gpu_profile_with_its_model_mounted(spec):
    backend = services(spec)["backend"]
    assert backend["profiles"] == ["gpu"]
    (device,) = backend["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    flags = backend_flags(backend["command"])
    assert flags["--mode"] in ("invariant", "standard")
    assert flags["--model"] in mounts(backend) and mounts(backend)[flags["--model"]] == DEPLOY / ENV["DETGATE_MODEL_DIR"]
    port = int(flags["--port"])
    assert urlsplit(healthcheck_url(backend)).port == port
    assert dockerfile_directive("backend.Dockerfile", "EXPOSE") == str(port)


def test_prometheus_scrapes_the_services_where_they_listen(spec):
    prom = services(spec)["prometheus"]
    config_file = next(a.split("=", 1)[1] for a in prom["command"] if a.startswith("--config.file="))
    config_dir = mounts(prom)[str(Path(config_file).parent)]
    scrape = yaml.safe_load((config_dir / Path(config_file).name).read_text())
    _, settings = gateway_settings(spec)
    backend_port = int(backend_flags(services(spec)["backend"]["command"])["--port"])
    targets = {job["job_name"]: job["dns_sd_configs"][0] for job in scrape["scrape_configs"]}
    assert targets["detgate-gateway"]["names"] == ["gateway"] and targets["detgate-gateway"]["port"] == settings.port
    assert targets["detgate-backend"]["names"] == ["backend"] and targets["detgate-backend"]["port"] == backend_port
    for rule_file in scrape["rule_files"]:
        assert (config_dir / rule_file).is_file()


def test_prometheus_scrapes_the_gateway_with_its_operator_token(spec):
    _, settings = gateway_settings(spec)
    assert settings.operator_token.get_secret_value() == ENV["DETGATE_OPERATOR_TOKEN"]
    prom = services(spec)["prometheus"]
    (secret,) = prom["secrets"]
    assert spec["secrets"][secret] == {"environment": "DETGATE_OPERATOR_TOKEN"}
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == "detgate-gateway"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": f"/run/secrets/{secret}"}


def test_grafana_is_provisioned_without_clicks(spec):
    grafana = services(spec)["grafana"]
    m = mounts(grafana)
    provisioning = m["/etc/grafana/provisioning"]
    (ds,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    prom_url = urlsplit(ds["url"])
    assert prom_url.hostname == "prometheus" and prom_url.port == container_port(services(spec)["prometheus"])
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "detgate.yml").read_text())["providers"]
    dashboards = m[provider["options"]["path"]]
    assert sorted(p.name for p in dashboards.glob("*.json")) == ["backend.json", "gateway.json"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (m[str(Path(home).parent)] / Path(home).name).is_file()
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
