"""The version table every engine keeps: current, pinned while in use, retired when unused."""

from __future__ import annotations

import pytest

from clawrl.versions.table import VersionTable


def test_a_version_in_use_outlives_the_swap_and_goes_when_its_last_request_ends() -> None:
    table: VersionTable[str] = VersionTable()
    table.install(0, "base")
    table.install(1, "adapter v1")
    table.pin(1)  # a request admitted on v1
    table.pin(1)  # and a second one
    table.install(2, "adapter v2")  # the swap: new requests get v2
    assert table.current == 2 and table.retire_unused() == []
    table.unpin(1)
    assert table.retire_unused() == []  # one request still runs on v1
    table.unpin(1)
    assert table.retire_unused() == [(1, "adapter v1")]
    assert 1 not in table and [version for version, _ in table.items()] == [0, 2]
    with pytest.raises(ValueError, match="policy version 1 is not loaded"):
        table.pin(1)


def test_the_base_is_never_retired_and_a_held_version_can_become_current_again() -> None:
    table: VersionTable[str] = VersionTable()
    table.install(0, "base")
    table.install(3, "full weights v3")
    table.make_current(0)  # a rollback to the base model
    assert table.retire_unused(also_in_use={3}) == []  # the caller's own queue still holds v3
    table.make_current(3)
    table.install(3, "loaded again")  # the one already held wins
    assert table.get(3) == "full weights v3"
    table.make_current(0)
    assert table.retire_unused() == [(3, "full weights v3")] and table.current == 0
    with pytest.raises(ValueError):
        table.make_current(3)
