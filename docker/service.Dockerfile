# The plan service: `recycle serve` on port 8000 (FastAPI + uvicorn), no torch.
# Build from the repository root: docker build -f docker/service.Dockerfile -t recycle-service .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    RECYCLE_HOST=0.0.0.0 \
    RECYCLE_PORT=8000 \
    RECYCLE_DATABASE_URL=sqlite:////data/recycle.db

WORKDIR /app
COPY pyproject.toml README.md ./
COPY planner ./planner
COPY api ./api
COPY cli ./cli
# The project pins every dependency in pyproject.toml, which hadolint cannot see.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[api]" \
    && useradd --system --create-home --uid 10001 recycle \
    && mkdir /data && chown recycle /data

USER 10001
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["recycle", "serve"]
