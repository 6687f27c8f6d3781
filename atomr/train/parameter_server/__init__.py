"""The parameter server: server shards hold the weights and the optimizer,
workers pull, compute and push gradients, and the trainer actor
(`AsyncParameterServer`) spawns and drives them (see docs/parameter_server.md).

The protocol between them (`PushGradient`, `PullWeights`, `TrainBatch`, ...)
is in `atomr.train.parameter_server.messages`; `protocols.py` has
`ServerShardProtocol`, what a server shard answers, and
`ParameterServerWorkerProtocol`, what a worker answers.
"""

from atomr.train.parameter_server._round import RoundDroppedError, RoundFailedError
from atomr.train.parameter_server.consistency import Consistency
from atomr.train.parameter_server.messages import (
    EpochReport,
    GetServerStats,
    ParameterServerStats,
    StaleGradientError,
    TrainEpochs,
)
from atomr.train.parameter_server.options import ParameterServerOptions
from atomr.train.parameter_server.protocols import (
    ParameterServerWorkerProtocol,
    ServerShardProtocol,
)
from atomr.train.parameter_server.server import ServerShard
from atomr.train.parameter_server.trainer import AsyncParameterServer
from atomr.train.parameter_server.worker import ParameterServerWorker

__all__ = [
    "AsyncParameterServer",
    "Consistency",
    "EpochReport",
    "GetServerStats",
    "ParameterServerOptions",
    "ParameterServerStats",
    "ParameterServerWorker",
    "ParameterServerWorkerProtocol",
    "RoundDroppedError",
    "RoundFailedError",
    "ServerShard",
    "ServerShardProtocol",
    "StaleGradientError",
    "TrainEpochs",
]
