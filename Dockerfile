# CapsNet service images: `api` (FastAPI + ONNX Runtime, the shipped model) and `frontend` (Gradio demo).
#
#   docker build --target api -t capsnet-api .                                         # GPU or CPU
#   docker build --target api --build-arg ORT_PACKAGE=onnxruntime -t capsnet-api:cpu .  # CPU only, small
#   docker build --target frontend -t capsnet-frontend .
#
# GPU: onnxruntime-gpu with its pip CUDA 13 / cuDNN 9 libraries (the `cuda,cudnn` extras), loaded by
# `onnxruntime.preload_dlls()`; the host's driver comes in through the NVIDIA container toolkit. The
# same image falls back to the CPU where there is no GPU (the provider in use is shown by /model).
# Works with the legacy builder (no RUN --mount, no heredocs). BASE_IMAGE lets CI build on a local
# stand-in of the same name (tests/docker/base_image.sh): the stages only rely on `python3 -m venv`.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- builder: one venv per image, holding the `serve` or `demo` extra of pyproject.toml ---------
# Stage order matters to the legacy builder, which builds every stage above its --target: the
# small frontend comes first, the api (the default target) last.
FROM ${BASE_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# constraints.txt: the serve and demo extras and all they require, at the versions the tests run (deploy/constraints.py)
COPY pyproject.toml deploy/constraints.txt ./
# requirements-<extra>.txt: the extra's requirement lines, read with tomllib (no project install,
# so neither training code nor torch can come along)
RUN python3 -c "import sys, tomllib; extras = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']; [open(f'requirements-{name}.txt', 'w').write(chr(10).join(extras[name]) + chr(10)) for name in sys.argv[1:]]" serve demo

FROM builder AS builder-frontend
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --upgrade pip \
    && /opt/venv/bin/pip install -r requirements-demo.txt -c constraints.txt

# ---- runtime base: non-root user, no build tools -------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# the user the services run as (USER 10001:10001: numeric, so hosts and Kubernetes can check it)
RUN useradd --create-home --uid 10001 --user-group capsnet
WORKDIR /app

# ---- frontend: the Gradio demo, an HTTP client of the api ----------------------------------------
FROM runtime AS frontend
COPY --from=builder-frontend /opt/venv /opt/venv
COPY model/__init__.py model/contract.py ./model/
COPY frontend/ ./frontend/
ENV CAPSNET_DEMO_HOST=0.0.0.0 CAPSNET_DEMO_PORT=7860 CAPSNET_DEMO_API_URL=http://api:8000 \
    CAPSNET_DEMO_PUBLIC_API_URL=http://localhost:8000 \
    GRADIO_ANALYTICS_ENABLED=False GRADIO_TEMP_DIR=/tmp/gradio
USER 10001:10001
EXPOSE 7860
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/' % os.environ.get('CAPSNET_DEMO_PORT', '7860'), timeout=4)"]
# python as PID 1 has a SIGINT handler (KeyboardInterrupt) but none for SIGTERM, which PID 1 ignores
STOPSIGNAL SIGINT
CMD ["python", "-m", "frontend"]

# ---- api: uvicorn as PID 1 (`python -m app`: the server, or with several workers their supervisor) -----
FROM builder AS builder-api
# onnxruntime-gpu[cuda,cudnn] (about 3 GB with CUDA and cuDNN) or onnxruntime (CPU only)
ARG ORT_PACKAGE="onnxruntime-gpu[cuda,cudnn]"
RUN sed -E "s/^onnxruntime-gpu([<>=!~; ]|$)/${ORT_PACKAGE}\1/" requirements-serve.txt > requirements.txt \
    && cat requirements.txt \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --upgrade pip \
    && /opt/venv/bin/pip install -r requirements.txt -c constraints.txt \
    && /opt/venv/bin/python -c "import onnxruntime as ort; print('onnxruntime', ort.__version__, ort.get_available_providers())"

FROM runtime AS api
COPY --from=builder-api /opt/venv /opt/venv
COPY model/__init__.py model/contract.py model/card.py ./model/
COPY models/ ./models/
COPY app/ ./app/
# every CAPSNET_* setting of app/settings.py can be given with `docker run -e` or in compose;
# CAPSNET_WORKERS worker processes (default: from the cores the container may use, its --cpus quota
# included), each with every model; scale out further with more containers
ENV CAPSNET_HOST=0.0.0.0 CAPSNET_PORT=8000
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('CAPSNET_PORT', '8000'), timeout=4)"]
CMD ["python", "-m", "app"]
