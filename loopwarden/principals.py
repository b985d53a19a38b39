"""Who calls: an authenticated agent, operator or host observer. Identity never comes from a
tool argument: over HTTP it is the bearer token's, over stdio the launch configuration's."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from loopwarden.errors import InvalidInput, clip

Role = Literal["agent", "operator", "observer"]
"""`observer`: a host's hooks reporting for one agent (its `id` is that agent's)."""
ROLES: tuple[Role, ...] = ("agent", "operator", "observer")
PRINCIPAL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$"


def principal(agent: str, role: str, roles: tuple[str, ...] = ROLES) -> Principal:
    """A principal from a name and a role given by a person (a flag, an environment variable):
    `InvalidInput` that says what is allowed, for either."""
    if role not in roles:
        raise InvalidInput(f"role must be one of {', '.join(roles)} (got {clip(repr(role))})")
    try:
        return Principal.model_validate({"id": agent, "role": role})
    except ValueError:
        raise InvalidInput(
            f"invalid agent name {clip(repr(agent))}: 1-64 letters, digits and '_.@:-', "
            "starting with a letter or digit"
        ) from None


class Principal(BaseModel):
    """An authenticated caller. Built by the server from a bearer token or the launch configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=PRINCIPAL_ID_PATTERN, description="Agent or operator id.")
    role: Role = "agent"

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"
