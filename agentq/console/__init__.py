"""`agentq console`: a loopback web page to see and steer agentq work.

Jobs (a live, filterable list), a job's DAG and timeline, tasks submitted on their own,
a task's input, result, attempts, agent trace and logs, the dead-letter archive, queues
and workers. It reads the configured stage with the operator's own credentials and
deploys nothing. See docs/console.md.

| module | what it does |
|---|---|
| `server.py` | builds the parts from `Settings`, runs uvicorn on 127.0.0.1 |
| `app.py` | routes: page shells with embedded data, JSON with ETags, actions |
| `security.py` | the printed token, session cookie, CSRF, loopback Host, headers |
| `reads.py` | jobs, a job, a task: through `AgentqClient` and the stores |
| `jobhead.py` | a job's item per refresh: its progress, its spec read once |
| `jobtasks.py` | a job's tasks as summary rows (projected reads, final rows kept) |
| `standalone.py` | the Tasks page: a tenant's newest tasks outside jobs, from its events |
| `cursor.py` | the jobs list's page cursor (validated: it comes from the browser) |
| `artifacts.py` | a task's S3 objects: logs, trace, result, raw downloads |
| `deadletters.py` | the DLQ archive listing (ETag-cached) |
| `operations.py` | queue depths, workers from leases, event rates |
| `actions.py` | redrive, discard, cancel, resubmit, each recorded as an event |
| `record.py` | an action stored as requested before it runs, its outcome after |
| `static/`, `templates/` | the front end: hand-written JS and CSS, no build step |
"""

from agentq.console.server import ConsoleOptions, ConsoleServer, serving

__all__ = ["ConsoleOptions", "ConsoleServer", "serving"]
