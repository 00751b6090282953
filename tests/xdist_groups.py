"""`--dist loadgroup`'s promise on pytest 9.2: the tests that share an `xdist_group` mark
run on one pytest-xdist worker (the Makefile's; the SLURM tests are one group).

pytest-xdist 3.8 tells its scheduler a test's group through the test's id: its worker's
collection hook appends "@<group>" to `item._nodeid`, where pytest kept the id up to 9.1.
pytest 9.2 keeps it in `item._id`, so the suffix never shows and the scheduler spreads a
group's tests over the workers like any others, with no error. This hook, after xdist's,
appends the suffix where pytest keeps the id now; where xdist's own shows (pytest 9.1, a
fixed xdist) it leaves the test be. tests/test_xdist_groups.py checks that a group holds.
"""

from __future__ import annotations

import pytest


def group_of(item: pytest.Item) -> str | None:
    """The scheduler's name for `item`'s groups, as xdist writes it: sorted, joined by "_"."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) or None


@pytest.hookimpl(trylast=True)  # after xdist's hook, which would have added the suffix
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("loadgroup", False):  # set on a worker of --dist loadgroup
        return
    for item in items:
        group = group_of(item)
        if group is not None and not item.nodeid.endswith(f"@{group}"):
            from _pytest.nodeid import NodeId  # pytest 9.2's id; what xdist reads is str(it)

            item._id = NodeId.parse(f"{item.nodeid}@{group}")
