"""Collectives: the five operations (all_reduce, reduce_scatter, all_gather,
broadcast, barrier) on the host (`HostCollective`), in a ring of actors
(`RingCollective`, `comm/ring/`), and across processes through MPI
(`MpiCollective`, `atomr.train.comm.mpi`); `purpose.py`, what the
operations issued in a block are for; and `agreement.py`, where a job's
processes agree that a shared task (a save) succeeded everywhere.
Nothing here knows a model. See docs/collectives.md."""

from atomr.train.comm.collective import Collective, HostCollective
from atomr.train.comm.ring import RingCollective

__all__ = ["Collective", "HostCollective", "RingCollective"]
