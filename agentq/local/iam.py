"""Least privilege on the local stack: each component signs with a user of its own
whose policy is exactly what the CDK templates grant that component's role.

    AGENTQ_LOCAL_IAM=enforce agentq local up      (or LocalStackOptions(iam=True))

1. `synthesized_policies()` synthesizes the app (the `dev` stage, no cdk-nag) in a
   child process (`python -m infra.local_policies`: the ground floor names infra, never
   imports it) and reads, for each component in `COMPONENTS`, every statement of
   every policy attached to its role (the producer and the operator: the
   `ProducerPolicy` and `OperatorPolicy` managed policies). CloudFormation
   intrinsics are resolved to stage-independent tokens: the stage's queues, tables, bus and artifacts bucket become `${agentq:<name>}`,
   region and account `${AWS::Region}`/`${AWS::AccountId}`. A resource that does not
   exist locally (log groups, the failed-event queues, secrets, ECS tasks) becomes an
   ARN naming it under `arn:aws:agentq-local-unresolved:::...`, which matches nothing, so
   such a statement grants nothing locally. Only a literal `*` in a template stays `*`.
   Synthesis costs tens of seconds, so its result is cached by the content of
   `infra/`, `agentq/resources.py`, the settings (`agentq/config*.py`), `app.py` and
   `cdk.json`.
2. `create_component_users()` fills the tokens with the local resources' ARNs and
   creates one IAM user per component in moto (through the operator's admin key),
   with the statements as its inline policy, and returns each user's access key.

moto's server must run with `--iam` (agentq.local.moto_iam) for any of it to be checked.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agentq.errors import ConfigError

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
SYNTH_STAGE: Final = "dev"
# Component -> its role in the synthesized stage (the attribute path in StageStacks).
COMPONENTS: Final = {
    "worker": "worker.task_role",
    "save-event": "events.save_event.role",
    "dlq-processor": "events.dlq_processor.role",
    "dispatcher": "dispatcher.handler.role",
    "health-check": "health_check.handler.role",
    "reconciler": "health_check.reconciler.handler.role",
    "producer-api": "producer_api.handler.role",
    "producer": "infrastructure.producer_policy",
    "operator": "infrastructure.operator_policy",
    # Roles only AWS services assume, proven by their named operations
    # (tests/infra/test_iam_named_operations.py); the loader also runs with IAM enforced.
    "definitions-loader": "definitions.handler.role",
    "provider-framework": "definitions.provider_role",
    "execution-role": "worker.task_definition.execution_role",
}
# ResourceNames attributes that are tokens in the cached statements.
NAMED_RESOURCES: Final = (
    "task_queue",
    "dead_letter_queue",
    "events_table",
    "definitions_table",
    "event_bus",
)
UNRESOLVED: Final = "arn:aws:agentq-local-unresolved::"
_HASHED: Final = (
    "infra",
    "agentq/local/iam.py",
    "infra/local_policies.py",
    "agentq/resources.py",
    # The settings model and its fields, declared by concern (the package's modules).
    "agentq/config",
    "app.py",
    "cdk.json",
)

Statement = dict[str, Any]


@dataclass(frozen=True)
class Credentials:
    user: str
    access_key_id: str
    secret_access_key: str

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
        }


def source_hash() -> str:
    digest = hashlib.sha256()
    for entry in _HASHED:
        path = REPO_ROOT / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(REPO_ROOT)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentq"


def synthesized_policies() -> dict[str, list[Statement]]:
    """Each component's synthesized statements, with tokens for local resources (cached)."""
    cache = _cache_dir() / f"iam-policies-{source_hash()}.json"
    if cache.exists():
        cached: dict[str, list[Statement]] = json.loads(cache.read_text())
        return cached
    cache.parent.mkdir(parents=True, exist_ok=True)
    # One synth (half a minute of CPU) for every process that asks at once: the others
    # wait on the lock, then read what the first wrote. The lock dies with its holder.
    with cache.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cache.exists():
            again: dict[str, list[Statement]] = json.loads(cache.read_text())
            return again
        return _synthesize(cache)


def _synthesize(cache: Path) -> dict[str, list[Statement]]:
    request = {"components": COMPONENTS, "namedResources": NAMED_RESOURCES,
               "stage": SYNTH_STAGE, "unresolved": UNRESOLVED}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "infra.local_policies"], input=json.dumps(request),
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ConfigError(
            "AGENTQ_LOCAL_IAM", f"could not synthesize the policies: {done.stderr[-2000:]}"
        )
    policies: dict[str, list[Statement]] = json.loads(done.stdout)
    # Written whole, then renamed: a concurrent reader sees no file or a complete one.
    with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(policies, tmp)
    os.replace(tmp.name, cache)
    return policies


# -- the local side ---------------------------------------------------------------------
def local_statements(
    statements: list[Statement], resources: Any, *, region: str, account: str
) -> list[Statement]:
    """Tokens replaced by the local stage's names, region and account."""
    values = {f"${{agentq:{attr}}}": getattr(resources.names, attr) for attr in NAMED_RESOURCES}
    values |= {
        f"${{agentq:tier:{tier}}}": queue for tier, queue in resources.names.tier_queues().items()
    }
    values |= {
        "${agentq:bucket}": resources.bucket,
        "${AWS::Region}": region,
        "${AWS::AccountId}": account,
    }
    text = json.dumps(statements)
    for token, value in values.items():
        text = text.replace(token, value)
    result: list[Statement] = json.loads(text)
    return result


def create_component_users(
    iam: Any,
    resources: Any,
    policies: Mapping[str, list[Statement]],
    *,
    region: str,
    account: str,
    without: Mapping[str, str | tuple[str, ...]] | None = None,
) -> dict[str, Credentials]:
    """One IAM user per component holding exactly its statements; `without` maps a
    component to actions, or statements' Sids, its policy must not grant (to prove a
    test notices)."""
    created: dict[str, Credentials] = {}
    for component, statements in policies.items():
        document = local_statements(statements, resources, region=region, account=account)
        removed = (without or {}).get(component, ())
        for action in (removed,) if isinstance(removed, str) else removed:
            document = _remove_action(document, action)
        user = f"{resources.names.prefix}-{component}"
        iam.create_user(UserName=user)
        iam.put_user_policy(
            UserName=user,
            PolicyName="synthesized",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": document}),
        )
        key = iam.create_access_key(UserName=user)["AccessKey"]
        created[component] = Credentials(user, key["AccessKeyId"], key["SecretAccessKey"])
    return created


def _remove_action(statements: list[Statement], action: str) -> list[Statement]:
    """Without `action` wherever it is granted, or without the statement whose Sid it is."""
    if any(statement.get("Sid") == action for statement in statements):
        return [statement for statement in statements if statement.get("Sid") != action]
    kept = []
    found = False
    for statement in statements:
        actions = (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
        remaining = [a for a in actions if a != action]
        found = found or len(remaining) < len(actions)
        if remaining:
            kept.append({**statement, "Action": remaining})
    if not found:
        raise ConfigError("AGENTQ_LOCAL_IAM", f"{action} is not granted, so it cannot be removed")
    return kept
