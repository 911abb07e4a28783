"""An agent with Bash cannot reach the worker: its environment, memory, files, or the
task role's credentials endpoint.

The end-to-end test runs a real agent task (the real Claude Code CLI against the offline
model server) whose model calls Bash on a probe script: it dumps every /proc/*/environ
it can read, the worker's /proc entries and log, and fetches every container-credentials
URI it finds from a local stand-in of the ECS endpoint. The worker runs as root here, so
the child runs as `CHILD_USER` (nobody); the kernel tests below cover a non-root worker
(the container image), where non-dumpability is what protects it.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Stack
from security_support import launched_worker
from support import EventLog, wait_for

from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import ModelServer
from agentq.local.workers import REPO_ROOT
from worker.child import isolation

pytestmark = pytest.mark.timeout(300)

CHILD_USER = "nobody"
WORKER_SECRET = "worker-only-" + uuid.uuid4().hex
CREDENTIAL_SECRET = "PlantedSecretAccessKey" + uuid.uuid4().hex
CREDENTIAL_PATH = f"/v2/credentials/{uuid.uuid4()}"


class CredentialsEndpoint(BaseHTTPRequestHandler):
    """The ECS container-credentials endpoint, on loopback: answers the secret path only."""

    hits: list[str] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        if self.path != CREDENTIAL_PATH:
            self.send_error(404)
            return
        body = json.dumps({"AccessKeyId": "ASIAPLANTEDKEY000001", "Token": "planted-token",
                           "SecretAccessKey": CREDENTIAL_SECRET,
                           "Expiration": "2099-01-01T00:00:00Z"}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def credentials_url() -> Iterator[str]:
    CredentialsEndpoint.hits.clear()  # an earlier test's control fetch is not this one's
    server = ThreadingHTTPServer(("127.0.0.1", 0), CredentialsEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{CREDENTIAL_PATH}"
    finally:
        server.shutdown()
        server.server_close()


def _interpreter_for(user: pwd.struct_passwd) -> str | None:
    """A Python of this version the child user may execute (the worker image's is
    /usr/local/bin/python; here the project's may sit under a private /root)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        try:
            probe = subprocess.run([candidate, "-c", "pass"], user=user.pw_uid,
                                   group=user.pw_gid, extra_groups=[], capture_output=True,
                                   check=False, cwd="/")  # fmt: skip
        except OSError:  # not executable by that user, or absent
            continue
        if probe.returncode == 0:
            return candidate
    return None


PROBE = """#!/bin/bash
{{
echo "PROBE-RAN uid=$(id -u)"
for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < "$f"; done
echo "== worker environ"; tr '\\0' '\\n' < /proc/{pid}/environ
echo "== worker memory"; head -c 4096 /proc/{pid}/mem | od -c | head -5
echo "== worker fds"; ls -l /proc/{pid}/fd/
echo "== worker cwd"; ls /proc/{pid}/cwd/
echo "== worker log"; cat {log}
echo "== signal"; kill -0 {pid} && echo "CAN-SIGNAL-WORKER"
echo "== credentials"
for u in $(cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' \\
           | sed -n 's/^AWS_CONTAINER_CREDENTIALS_FULL_URI=//p' | sort -u); do
  echo "fetching $u"
  python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$u"
done
echo "== own environment"; env
echo PROBE-END
}} > {out} 2>&1
"""

SCHEMA = {"type": "object", "required": ["title"], "additionalProperties": False,
          "properties": {"title": {"type": "string", "maxLength": 80}}}  # fmt: skip


@pytest.mark.parametrize("mode", ["child_user", "same_user"])
def test_an_agent_with_bash_cannot_reach_the_worker_or_its_credentials(
    stack: Stack, credentials_url: str, tmp_path: Path, mode: str
) -> None:
    """child_user: a root worker, CHILD_USER=nobody. same_user: the worker image's case,
    worker and child both run as one non-root user (nobody) and only the worker's
    non-dumpability stands between them."""
    if os.geteuid() != 0:
        pytest.skip("switching the child's user needs a root worker (see the kernel tests)")
    user = pwd.getpwnam(CHILD_USER)
    interpreter = _interpreter_for(user)
    assert interpreter is not None, f"no Python that {CHILD_USER} may run"

    # What the child user must reach: its probe dir, the work dir (task dirs), its config.
    shared = Path(tempfile.mkdtemp(prefix="agentq-isolation-"))
    os.chmod(shared, 0o755)
    for name in ("work", "probe", "home"):
        (shared / name).mkdir()
        os.chown(shared / name, user.pw_uid, user.pw_gid)
    out = shared / "probe" / "out.txt"
    log_dir = tmp_path / "private"  # the worker's log: root's, 0700
    log_dir.mkdir(mode=0o700)
    log_path = log_dir / "worker.log"
    definitions = shared / "definitions"
    definitions.mkdir()
    (definitions / "isolation.yaml").write_text(yaml.safe_dump([{
        "name": "probe", "kind": "agent", "timeout_s": 150,
        "settings": {"prompt": "Look at this.\n\n{text}", "output_schema": SCHEMA,
                     "max_turns": 4, "allowed_tools": ["Bash"], "step_timeout_s": 90},
    }]))  # fmt: skip

    model = ModelServer().start()
    claude_env = offline_claude_env(model.url, shared / "home")
    shutil.chown(shared / "home" / ".claude", user.pw_uid, user.pw_gid)
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    env = {
        "TASK_DEFINITIONS_DIR": str(definitions),
        **claude_env,
        "HOME": str(shared / "home"),
        "AGENTQ_WORK_DIR": str(shared / "work"),
        **({"CHILD_USER": CHILD_USER} if mode == "child_user" else {}),
        "PYTHONPATH": f"{REPO_ROOT}:{site / 'site-packages'}",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": credentials_url,
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": CREDENTIAL_PATH,
        "WORKER_ONLY_SECRET": WORKER_SECRET,
    }  # fmt: skip
    events = EventLog(stack)
    try:
        with launched_worker(stack, "worker", env, log_dir=log_dir, interpreter=interpreter,
                             user=user if mode == "same_user" else None) as worker:  # fmt: skip
            probe = shared / "probe" / "probe.sh"
            probe.write_text(PROBE.format(pid=worker.pid, log=log_path, out=out))
            probe.chmod(0o755)
            command = json.dumps({"command": f"bash {probe}"})
            request_id = "iso-" + uuid.uuid4().hex[:10]
            body = {"requestId": request_id, "tenant": "acme", "definition": "probe",
                    "input": {"text": f"Please check. [[model: key iso; tool Bash {command}]]"}}  # fmt: skip
            stack.sqs.send_message(
                QueueUrl=stack.resources.queue_url, MessageBody=json.dumps(body),
                MessageAttributes={"requestId": {"DataType": "String", "StringValue": request_id}},
            )  # fmt: skip
            ended = wait_for(
                lambda: [e for e in events.of(request_id)
                         if e["detail-type"] in ("Task Completed", "Task Failed")],
                timeout=180, message="the agent task ended",
            )  # fmt: skip
            worker.send(signal.SIGTERM)
            worker.wait(timeout=60)
    finally:
        model.stop()
    worker_log = log_path.read_text(errors="replace")
    assert ended[0]["detail-type"] == "Task Completed", (ended, worker_log[-4000:])

    # The probe ran, as the child user, and saw its own environment.
    seen = out.read_text(errors="replace")
    assert f"PROBE-RAN uid={user.pw_uid}" in seen and "PROBE-END" in seen, seen
    assert "ANTHROPIC_BASE_URL=" in seen  # its own environment is readable
    # ...and nothing of the worker's: environment, memory, files, signals, credentials.
    assert "Permission denied" in seen.split("== worker environ")[1].split("== worker memory")[0]
    # One user can signal its own processes: only another user for the child stops that.
    assert ("CAN-SIGNAL-WORKER" in seen) is (mode == "same_user"), seen
    assert "fetching" not in seen, "a credentials URI was found"
    assert CREDENTIAL_PATH not in CredentialsEndpoint.hits
    sinks = {
        "probe output": seen,
        "worker log": worker_log,
        "events": "\n".join(events.raw),
        **{f"s3 {o['Key']}": stack.s3.get_object(Bucket=stack.resources.bucket, Key=o["Key"])[
            "Body"].read().decode(errors="replace")
           for o in stack.s3.list_objects_v2(Bucket=stack.resources.bucket).get("Contents", [])},
    }  # fmt: skip
    assert any(name.startswith("s3 ") for name in sinks)
    for secret in (WORKER_SECRET, CREDENTIAL_SECRET, CREDENTIAL_PATH):
        leaked = [name for name, text in sinks.items() if secret in text]
        assert not leaked, f"{secret} reached {leaked}"
    # The stand-in does serve the secret: the probe did not reach it, it was not blind.
    import urllib.request

    with urllib.request.urlopen(credentials_url, timeout=5) as answer:
        assert CREDENTIAL_SECRET in answer.read().decode()
    shutil.rmtree(shared, ignore_errors=True)


def _as(uid: int, gid: int, work: Any) -> int:
    """Fork, drop to uid/gid without exec (the interpreter is already loaded), run `work`;
    returns the child's exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the fork
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            code = int(work())
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("forbid", [True, False])
def test_a_non_dumpable_worker_hides_its_environment_from_its_own_user(forbid: bool) -> None:
    """The container case: worker and child share one non-root user. Changing uid makes
    a process non-dumpable by itself, so the control re-enables it (as exec would)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to a test user")
    user = pwd.getpwnam(CHILD_USER)
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    holder = os.fork()
    if holder == 0:  # pragma: no cover - runs in the fork
        code = 1
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0)  # dumpable, as after exec
            if forbid and isolation.forbid_inspection() and not isolation.is_dumpable():
                os.write(ready_w, b"n")
            else:
                os.write(ready_w, b"d")
            os.read(hold_r, 1)  # hold still until the reader is done
            code = 0
        finally:
            os._exit(code)
    try:
        assert os.read(ready_r, 1) == (b"n" if forbid else b"d")

        def reader() -> int:
            try:
                data = Path(f"/proc/{holder}/environ").read_bytes()
            except PermissionError:
                return 3
            return 4 if b"PATH=" in data else 5

        assert _as(user.pw_uid, user.pw_gid, reader) == (3 if forbid else 4)
    finally:
        os.write(hold_w, b"x")
        os.waitpid(holder, 0)
        for fd in (ready_r, ready_w, hold_r, hold_w):
            os.close(fd)
