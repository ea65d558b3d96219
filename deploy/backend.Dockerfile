# The backend image: CUDA PyTorch (which brings Triton) plus the backend's other
# dependencies. Build from the repository root: docker build -f deploy/backend.Dockerfile .
# TORCH_IMAGE picks the CUDA/PyTorch pair; the driver on the host must support its CUDA.
# It also picks the Triton that compiles the kernels, and with it their bits: another image
# serves under another system_fingerprint (kernels/toolchain.py).
ARG TORCH_IMAGE=pytorch/pytorch:2.8.0-cuda12.9-cudnn9-runtime
FROM ${TORCH_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Triton compiles a small C launcher for each kernel at first use, so a C compiler must be
# in the runtime image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY local_backend ./local_backend
COPY kernels ./kernels
# torch already satisfies the [backend] extra's requirement, so pip keeps the image's CUDA build.
RUN pip install --no-cache-dir '.[backend]'
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["detgate"]
CMD ["backend", "--model", "/models/current", "--host", "0.0.0.0", "--port", "8000"]
