# A worker daemon (executor): CPU torch pinned exactly, talks to the service over HTTP.
# Build from the repository root: docker build -f docker/worker.Dockerfile -t recycle-worker .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY planner ./planner
COPY executor ./executor
COPY cli ./cli
# torch first, exactly pinned and from the CPU index: an unpinned torch pulls gigabytes of CUDA.
# The project pins every dependency in pyproject.toml, which hadolint cannot see.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir ".[executor]" \
    && useradd --system --create-home --uid 10001 recycle

USER 10001
ENTRYPOINT ["recycle"]
CMD ["--help"]
