import gc
from collections.abc import Iterator

import pytest

from shoal.router import heap


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restore_gc")
def test_settle_freezes_startup_objects_and_raises_thresholds() -> None:
    survivor: list[object] = [object()]
    heap.settle()
    assert gc.get_threshold() == heap.THRESHOLDS
    assert gc.get_freeze_count() > 0
    # Frozen: no later collection considers what existed at startup.
    assert not any(o is survivor for o in gc.get_objects())
