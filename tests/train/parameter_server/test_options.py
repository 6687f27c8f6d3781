"""`ParameterServerOptions` checks every setting once, when it is built."""

from __future__ import annotations

import numpy as np
import pytest

from atomr.accel import Device
from atomr.train.parameter_server import (
    Consistency,
    ParameterServerOptions,
    ParameterServerWorker,
    ServerShard,
)


def test_the_defaults() -> None:
    options = ParameterServerOptions()
    assert (options.workers, options.shards, options.server_devices) == (None, 1, None)
    assert options.consistency == Consistency.asynchronous()
    assert (options.max_staleness, options.max_retries) == (None, 3)
    assert options.worker_class is ParameterServerWorker
    assert options.server_class is ServerShard


def test_server_devices_are_parsed() -> None:
    options = ParameterServerOptions(server_devices=["cpu:1", Device.parse("cpu:2")])
    assert options.server_devices == (Device("cpu", 1), Device("cpu", 2))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"workers": 0}, ValueError, "workers"),
        ({"workers": True}, TypeError, "workers must be an int"),
        ({"workers": 2.0}, TypeError, "workers must be an int"),
        ({"shards": True}, TypeError, "shards must be an int"),
        ({"max_retries": "3"}, TypeError, "max_retries must be an int"),
        ({"shards": 0}, ValueError, "shards"),
        ({"max_retries": -1}, ValueError, "max_retries"),
        (
            {"consistency": "sync"},
            TypeError,
            r"consistency must be a Consistency \(Consistency.asynchronous\(\), .bounded\(s\) "
            r"or .synchronous\(\), from atomr.train.parameter_server\), got 'sync'",
        ),
        ({"max_staleness": -1}, ValueError, "max_staleness"),
        ({"max_staleness": 2, "consistency": Consistency.synchronous()}, ValueError, "synchron"),
        ({"worker_class": object}, TypeError, "worker_class"),
        ({"server_class": ParameterServerWorker}, TypeError, "server_class"),
        ({"server_class": "ServerShard"}, TypeError, "server_class"),
        ({"server_devices": "cpu:0"}, TypeError, "server_devices must be a sequence"),
        ({"server_devices": []}, ValueError, "server_devices"),
        ({"server_devices": ["gpu:0"]}, ValueError, "unknown device"),
        ({"server_devices": [0]}, TypeError, "server_devices"),
    ],
)
def test_a_bad_setting_is_refused(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        ParameterServerOptions(**kwargs)


def test_numpy_counts_are_kept_as_ints() -> None:
    """As every options class keeps them (`ShardedOptions`): `int_at_least`'s int."""
    options = ParameterServerOptions(
        workers=np.int32(2), shards=np.int64(3), max_retries=np.int8(0)
    )
    assert (options.workers, options.shards, options.max_retries) == (2, 3, 0)
    assert all(type(n) is int for n in (options.workers, options.shards, options.max_retries))


def test_max_staleness_is_kept_for_the_asynchronous_models() -> None:
    assert ParameterServerOptions(max_staleness=0).max_staleness == 0
    bounded = ParameterServerOptions(max_staleness=4, consistency=Consistency.bounded(2))
    assert bounded.max_staleness == 4
