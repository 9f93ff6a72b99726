"""batchlab.integrations.metrics: the callbacks' shared option checks."""

from __future__ import annotations

import pytest

from batchlab.errors import BatchlabError
from batchlab.integrations.metrics import check_resumed_settings


def test_resuming_with_other_settings_is_refused_in_one_line():
    check_resumed_settings("NoiseScaleCallback", {"beta": 0.99, "every": 2}, 0.99, 2)  # the same: accepted
    for beta, every in ((0.9, 2), (0.99, 1), (None, 2)):
        with pytest.raises(BatchlabError, match="measured with beta=0.99, every=2") as info:
            check_resumed_settings("NoiseScaleCallback", {"beta": 0.99, "every": 2}, beta, every)
        assert "\n" not in str(info.value) and f"beta={beta!r}, every={every!r}" in str(info.value)
