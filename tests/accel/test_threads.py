"""BlasThreadShare: BLAS threads = max(1, cores // live CPU devices), restored when none is left."""

from __future__ import annotations

from atomr.accel.threads import BlasThreadShare, available_cores, blas_threads


def test_share_recomputes_on_acquire_and_release():
    original = blas_threads()
    share = BlasThreadShare(cores=4)
    assert share.acquire() == 4
    assert blas_threads() == 4
    assert share.acquire() == 2
    assert blas_threads() == 2
    assert share.acquire() == 1  # 4 // 3
    share.release()
    assert blas_threads() == 2 and share.live == 2
    share.release()
    share.release()
    assert share.live == 0
    assert blas_threads() == original  # BLAS's own setting is back
    share.release()  # an extra release never goes below zero
    assert share.live == 0


def test_never_less_than_one_thread():
    share = BlasThreadShare(cores=1)
    try:
        assert share.acquire() == 1
        assert share.acquire() == 1
    finally:
        share.release()
        share.release()


def test_available_cores_is_positive():
    assert available_cores() >= 1
