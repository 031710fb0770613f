"""Arrival schedules: mean rate and shape (KS test against the intended gamma, fixed seed)."""

import numpy as np
import pytest
from scipy import stats

from pipeline.loadtest.schedule import arrival_offsets, parse_sweep


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 2.0])
def test_gaps_follow_gamma_with_the_right_mean(burstiness):
    rate = 8.0
    offs = arrival_offsets(rate, 5000, burstiness=burstiness, seed=7)
    gaps = np.diff(np.concatenate([[0.0], offs]))
    assert np.all(offs[1:] >= offs[:-1])
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    ks = stats.kstest(gaps, "gamma", args=(burstiness, 0, 1 / (rate * burstiness)))
    assert ks.pvalue > 0.01
    # coefficient of variation of gamma gaps = 1/sqrt(shape): Poisson 1, burstier above 1
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.1)


def test_poisson_counts_per_second():
    offs = arrival_offsets(20.0, 20000, seed=3)
    counts = np.bincount(offs.astype(int))[:-1]
    assert counts.mean() == pytest.approx(20.0, rel=0.03)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.15)  # Poisson: variance = mean


def test_schedule_is_seeded():
    assert np.array_equal(arrival_offsets(5, 10, seed=1), arrival_offsets(5, 10, seed=1))


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 2.0])
def test_different_seeds_give_different_schedules(burstiness):
    schedules = [arrival_offsets(5, 10, burstiness=burstiness, seed=s) for s in range(5)]
    for i in range(len(schedules)):
        for j in range(i + 1, len(schedules)):
            assert not np.array_equal(schedules[i], schedules[j]), (i, j, schedules[i])
            assert not np.any(schedules[i] == schedules[j]), (i, j)  # not even one send time in common


def test_the_seed_alone_decides_the_schedule():
    """Neither numpy's global generator nor the calls made before it change a seeded schedule; the default seed
    is a seed like any other (0)."""
    first = arrival_offsets(5, 10, seed=11)
    np.random.seed(12345)
    np.random.random(100)
    arrival_offsets(5, 10, seed=99)
    assert np.array_equal(arrival_offsets(5, 10, seed=11), first)
    assert np.array_equal(arrival_offsets(5, 10), arrival_offsets(5, 10, seed=0))
    assert not np.array_equal(arrival_offsets(5, 10), first)


@pytest.mark.parametrize("rate,burst", [(-1, 1.0), (0, 1.0), (1, 0)])
def test_bad_schedule_arguments(rate, burst):
    with pytest.raises(ValueError):
        arrival_offsets(rate, 3, burstiness=burst)


def test_parse_sweep():
    assert parse_sweep("1,2,4", int) == [1, 2, 4] and parse_sweep(None) == []
