# The gateway image: Python and the gateway's own dependencies, no torch. Only gateway/
# is copied in, so the image cannot import the backend even by accident.
# Build from the repository root: docker build -f deploy/gateway.Dockerfile .
# No `# syntax=` line: the engine's own Dockerfile frontend builds it, so nothing is pulled
# besides the base image. Its RUN --mount needs BuildKit, the default builder of Docker
# Engine 23 and later, whose built-in frontend has it.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
# With the otel extra, so that --otlp-endpoint (DETGATE_OTLP_ENDPOINT) works in the image.
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[otel]'

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels 'detgate[otel]' \
 && useradd --system --uid 10001 detgate
USER detgate
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=2)"]
ENTRYPOINT ["detgate"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
