"""The settings model: every environment variable of agentq as one typed class.

`Settings.from_env()` parses everything once; components then `require()` the AWS
resource names they need, which raises `ConfigError` naming the variable when it is
missing. There are no silent defaults for resource names: the local stack exports
real names and URLs into the environment like a deployment would.

Each setting is a pydantic field: its type, its allowed range or choices, and the
variable it is read from. A bad value fails with `ConfigError` naming the variable
and what it allows. `python -m agentq.config.doc` writes the reference table of
docs/configuration.md from these fields; `python -m agentq.config` prints it.
The fields are declared by concern in the package's `places`, `worker` and `services`;
`Settings` joins them and checks them together.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from pydantic import ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agentq.config.fields import Environment, allowed, config_error
from agentq.config.light import clock_offset_ms
from agentq.config.places import Places
from agentq.config.services import Events, Health, LogLevel, ProducerApi, Reconciler, Runtime
from agentq.config.worker import Child, Receiving, SchedulerMode, WarmAgent
from agentq.errors import ConfigError

__all__ = [
    "LogLevel",
    "SchedulerMode",
    "Settings",
    "WarmAgent",
    "clock_offset_ms",
    "env_name",
    "env_names",
    "reference_table",
]


# The groups are listed last-first: pydantic gathers fields from the bases in reverse
# method resolution order, so this keeps the declaration order (Places first), which is
# the order of docs/configuration.md's table.
class Settings(Runtime, ProducerApi, Reconciler, Health, Events, Child, Receiving, Places):
    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        case_sensitive=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # `Settings(...)` is the defaults plus what the caller passes, as it always was;
        # the environment is read only by `from_env`, from the mapping it is given.
        return (init_settings,)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values = Environment(cls, env)()
        if "region" not in values:
            values["region"] = _fallback_region(env)
        try:
            return cls(**values)
        except ValidationError as exc:
            raise config_error(cls, exc, values) from None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.extension_interval_ms >= self.extension_amount_s * 1000:
            raise ConfigError(
                "VISIBILITY_EXTENSION_INTERVAL",
                "must be shorter than VISIBILITY_EXTENSION_AMOUNT, or a lease expires "
                "between two heartbeats",
            )
        if self.extension_interval_ms >= self.visibility_timeout * 1000 > 0:
            raise ConfigError(
                "VISIBILITY_EXTENSION_INTERVAL",
                "must be shorter than VISIBILITY_TIMEOUT, or a running task's message "
                "becomes visible between two heartbeats",
            )
        if self.default_priority not in self.priorities:
            raise ConfigError(
                "DEFAULT_PRIORITY", f"must be one of PRIORITIES ({self.priorities_list})"
            )
        for tier in (*_pairs(self.queue_urls), *_pairs(self.priority_weights)):
            if tier not in self.priorities:
                raise ConfigError(
                    "SQS_QUEUE_URLS" if tier in _pairs(self.queue_urls) else "PRIORITY_WEIGHTS",
                    f"names tier {tier!r}, not one of PRIORITIES ({self.priorities_list})",
                )
        for name, weight in _pairs(self.priority_weights).items():
            try:
                if not 0 < float(weight) <= 1000:
                    raise ValueError(weight)
            except ValueError:
                raise ConfigError(
                    "PRIORITY_WEIGHTS", f"{name}: a weight is a number in (0, 1000]"
                ) from None
        if self.retry_backoff_base_s > self.retry_backoff_max_s:
            raise ConfigError("RETRY_BACKOFF_BASE", "must not exceed RETRY_BACKOFF_MAX")
        return self

    def require(self, *attributes: str) -> Settings:
        """Fail fast, naming the environment variable, when a needed setting is absent."""
        missing = [env_name(a) for a in attributes if getattr(self, a) in (None, "")]
        if missing:
            raise ConfigError(
                missing[0],
                "is required"
                + (f" (also missing: {', '.join(missing[1:])})" if missing[1:] else ""),
            )
        return self

    def required(self, attribute: str) -> str:
        value = getattr(self.require(attribute), attribute)
        assert isinstance(value, str)
        return value

    @property
    def priorities(self) -> tuple[str, ...]:
        """Priority tiers, highest first."""
        return tuple(self.priorities_list.split(","))

    def tier_queue_urls(self) -> dict[str, str]:
        """Each tier's queue URL, highest first; tiers without one of their own share
        SQS_QUEUE_URL (which is the default tier's when SQS_QUEUE_URLS leaves it out)."""
        named = _pairs(self.queue_urls)
        fallback = self.queue_url or named.get(self.default_priority)
        urls = {tier: named.get(tier) or fallback for tier in self.priorities}
        return {tier: url for tier, url in urls.items() if url}

    @property
    def metric_tenants(self) -> tuple[str, ...]:
        """Tenants with their own worker metrics (METRIC_TENANTS)."""
        return tuple(self.metric_tenants_list.split(",")) if self.metric_tenants_list else ()

    def tier_weights(self) -> dict[str, float]:
        return {tier: float(weight) for tier, weight in _pairs(self.priority_weights).items()}

    @property
    def definitions_dirs(self) -> list[Path]:
        """TASK_DEFINITIONS_DIR may list several directories, separated like PATH."""
        return [Path(p) for p in (self.definitions_dir or "").split(os.pathsep) if p]

    @property
    def lease_seconds(self) -> float:
        """How long a lock or heartbeat keeps a task: 1.5x the extension, so a message that
        reappears after a crash still finds the lease live. The clock-skew budget is
        worker/child/leasefile.py's `skew_budget` (2 s at the defaults), not this margin."""
        return self.extension_amount_s * 1.5


def _fallback_region(env: Mapping[str, str]) -> str:
    """Without AWS_REGION, the region boto3 itself would use: AWS_DEFAULT_REGION, then
    the profile's; eu-west-1 only when neither names one."""
    if env.get("AWS_DEFAULT_REGION"):
        return env["AWS_DEFAULT_REGION"]
    import botocore.session

    profile = env.get("AWS_PROFILE")
    try:
        region = botocore.session.Session(profile=profile).get_config_variable("region")
    except Exception:  # a broken or missing profile: the variables decide, as before
        region = None
    return str(region) if region else "eu-west-1"


def env_names() -> frozenset[str]:
    """Every variable a setting is read from."""
    return frozenset(str(field.validation_alias) for field in Settings.model_fields.values())


def _pairs(value: str | None) -> dict[str, str]:
    """`a=x,b=y` (already checked against its pattern) as a mapping."""
    if not value:
        return {}
    return dict(pair.split("=", 1) for pair in value.split(","))


def env_name(attribute: str) -> str:
    field = Settings.model_fields.get(attribute)
    if field is None:
        raise KeyError(attribute)
    return str(field.validation_alias)


def reference_table() -> str:
    """The Markdown table of docs/configuration.md."""
    lines = [
        "| variable | default | allowed | used by | meaning |",
        "|---|---|---|---|---|",
    ]
    for field in Settings.model_fields.values():
        extra = field.json_schema_extra
        assert isinstance(extra, dict)
        default = "—" if field.default is None else f"`{field.default}`"
        lines.append(
            f"| `{field.validation_alias}` | {default} | {allowed(field)} "
            f"| {extra['readers']} | {field.description} |"
        )
    return "\n".join(lines) + "\n"
