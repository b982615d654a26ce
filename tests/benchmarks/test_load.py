"""benchmarks/load.py's percentiles of hey's times, which it writes to 0.1 ms."""

import numpy as np
import pytest

from benchmarks.load import RESOLUTION_MS, percentile


@pytest.mark.parametrize("spread", [0.06, 0.12, 0.3])
def test_the_median_of_written_times_is_found_within_their_step(spread):
    """Times as hey writes them (to the nearest 0.1 ms), spread over one to a few steps as a lone client's
    are: the grouped median is within a tenth of a step of the true one at every centre, where the median of
    the written values is off by up to half a step."""
    rng = np.random.default_rng(7)
    grouped, plain = [], []
    for centre in np.linspace(2.9, 3.1, 21):
        times = rng.normal(centre, spread, 100_000)
        written = np.round(times / RESOLUTION_MS) * RESOLUTION_MS
        true = float(np.median(times))
        grouped.append(abs(percentile(written, 50) - true))
        plain.append(abs(float(np.median(written)) - true))
    assert max(grouped) < 0.1 * RESOLUTION_MS
    assert max(plain) > 0.4 * RESOLUTION_MS


def test_times_in_one_step_have_their_step_centre_as_median():
    assert percentile(np.full(101, 3.1), 50) == pytest.approx(3.1)
    assert percentile(np.array([3.0, 3.1]), 50) == pytest.approx(3.05)  # the first step's top, the second's bottom
    assert percentile(np.array([3.0, 3.0, 3.0, 3.1]), 50) == pytest.approx(2.95 + 2 / 3 * 0.1)


def test_a_percentile_stays_within_the_times_and_asks_for_one():
    assert percentile(np.zeros(10), 10) == 0.0  # not the step's bottom, -0.05 ms
    assert percentile(np.array([3.0, 3.1]), 100) == pytest.approx(3.15)
    for q, times in ((101, np.ones(3)), (-1, np.ones(3)), (50, np.array([]))):
        with pytest.raises(ValueError, match="percentile"):
            percentile(times, q)
