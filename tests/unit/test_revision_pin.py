"""`x-llmfleet-model-revision` on a request (apps/gateway/validate.py `pinned_revision`): only an admin
pins a revision (`llmfleet model eval`); a team's key gets 403, a malformed value 400, before any
quota or money is touched (the gateway checks it before admission)."""

from __future__ import annotations

import pytest

from apps.core.errors import InvalidRequest, PermissionDenied
from apps.core.identity.principal import Principal
from apps.core.quota.admission import Limits
from apps.gateway.validate import pinned_revision

pytestmark = pytest.mark.timeout(30)
ADMIN = Principal("jwt", "jwt-ops", 1, "ops", None, (), Limits(), is_admin=True)
TEAM_KEY = Principal("api_key", "key-7", 2, "product", 7, (), Limits())


def test_no_header_is_no_pin_for_anyone() -> None:
    assert pinned_revision(None, TEAM_KEY) is None
    assert pinned_revision(None, ADMIN) is None


def test_an_admin_pins_a_well_formed_revision() -> None:
    assert pinned_revision("r-2026.12_a", ADMIN) == "r-2026.12_a"
    assert pinned_revision(" r2 ", ADMIN) == "r2"


def test_a_teams_key_may_not_pin() -> None:
    with pytest.raises(PermissionDenied) as refused:
        pinned_revision("r2", TEAM_KEY)
    assert (refused.value.status, refused.value.code) == (403, "revision_pin_forbidden")


@pytest.mark.parametrize("value", ["", "  ", "../r1", "r1/x", "r 1", "r" * 129, "r1;drop"])
def test_a_malformed_revision_is_a_400_naming_the_header(value: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        pinned_revision(value, ADMIN)
    assert (refused.value.status, refused.value.code) == (400, "invalid_revision")
    assert refused.value.param == "x-llmfleet-model-revision"
