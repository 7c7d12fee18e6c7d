"""The version table every engine keeps: current, pinned while in use, retired when unused."""

from __future__ import annotations

import pytest

from clawrl.versions.table import LineageNotLoadedError, VersionTable


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


def test_each_lineage_has_its_current_version_and_the_least_recently_used_goes_first() -> None:
    table: VersionTable[str] = VersionTable()
    table.install(0, "base")
    table.install(1, "alice v1", "alice")
    table.install(2, "bob v2", "bob")
    table.install(3, "carol v3", "carol")
    assert (table.current, table.current_of("alice"), table.current_of("dave")) == (0, 1, None)
    assert table.use("alice") == 1  # alice asked last: bob is now the least recently used
    table.pin(2)  # but a request of bob's is running
    assert table.retire_unused(max_loaded=2) == [(3, "carol v3")]  # so carol goes instead
    assert table.current_of("carol") is None and table.current_of("bob") == 2
    with pytest.raises(LineageNotLoadedError, match="carol"):
        table.use("carol")
    table.unpin(2)
    table.install(4, "alice v4", "alice")  # a publish: alice's v1 is nobody's current any more
    assert table.retire_unused(max_loaded=2) == [(1, "alice v1")]
    table.make_current(0, "erin")  # a lineage at the base holds nothing and is never evicted
    table.install(5, "frank v5", "frank")
    assert table.retire_unused(max_loaded=2) == [(2, "bob v2")]
    assert table.current == 0 and table.current_of("erin") == 0 and table.current_of("alice") == 4
