# agentq worker image: `agentq worker` on CPython 3.13. claude-agent-sdk's wheel brings
# the Claude Code CLI, so no Node.js or npm step is needed.
FROM python:3.13-slim

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
COPY requirements.txt ./
RUN pip install -r requirements.txt

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
