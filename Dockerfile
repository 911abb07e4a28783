# agentq worker image: `agentq worker` on CPython 3.13. claude-agent-sdk's wheel brings
# the Claude Code CLI, so no Node.js or npm step is needed.
# The base is pinned by digest (Docker Hub's python:3.13-slim index, amd64 and arm64), so
# a rebuild gets the same OS and interpreter; the tag stays for readers. Bump both together:
#   docker buildx imagetools inspect python:3.13-slim --format '{{json .Manifest.Digest}}'
FROM python:3.13-slim@sha256:7c61056e61ac89e852de05f3dc6fa51a6dd2181797bceed46aa725dd7cb2cd3b

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/agentq \
    LIVENESS_FILE=/tmp/agentq-worker.alive

# The CLI needs a writable HOME; the worker runs as an unprivileged user, and makes
# itself non-dumpable so its task children (same user) cannot read its environment or
# memory. agentq-task is for a worker run as root (`--user root -e CHILD_USER=agentq-task`):
# it then runs every child as that user instead (docs/security.md says what each gives).
RUN useradd --create-home --home-dir /home/agentq --uid 10001 agentq \
 && useradd --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
            --uid 10002 agentq-task

WORKDIR /opt/agentq
# Every dependency, transitive ones too, at the version and hash the lock names
# (`make image-lock` regenerates it from requirements.txt): a changed or substituted
# package on the index fails the build instead of entering the image.
COPY requirements-image.lock ./
RUN pip install --require-hashes --no-deps -r requirements-image.lock

COPY pyproject.toml README.md ./
COPY agentq ./agentq
COPY worker ./worker
COPY lambdas ./lambdas
COPY infra/__init__.py ./infra/__init__.py
RUN pip install --no-deps . && python -c "import agentq, worker"

USER agentq
# Unhealthy only when the heartbeat loop stops touching LIVENESS_FILE (worker/liveness.py):
# a worker busy with long tasks keeps beating, a hung one does not. The ECS task
# definition carries the same check (infra/stacks/worker.py).
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["python", "-m", "worker.liveness"]
# ECS sends SIGTERM on stop (stopTimeout later SIGKILL); the worker drains in between.
STOPSIGNAL SIGTERM
ENTRYPOINT ["agentq"]
CMD ["worker"]
