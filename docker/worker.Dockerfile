# One worker daemon per container (`recycle worker`, executor): CPU torch pinned exactly, talks to the
# service over HTTP. Also runs `recycle rendezvous` and `recycle submit` in docker/compose.yaml.
# Build from the repository root: docker build -f docker/worker.Dockerfile -t recycle-worker .
# For GPUs, build FROM a CUDA base with the matching torch 2.13.0 wheel and pass --device cuda.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY planner ./planner
COPY executor ./executor
COPY cli ./cli
COPY examples ./examples
# torch first, exactly pinned and from the CPU index: an unpinned torch pulls gigabytes of CUDA.
# The project pins every dependency in pyproject.toml, which hadolint cannot see.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir ".[executor]" \
    && useradd --system --create-home --uid 10001 recycle \
    && mkdir -p /run/recycle /checkpoints \
    && chown 10001 /run/recycle /checkpoints

USER 10001
ENTRYPOINT ["recycle"]
CMD ["--help"]
