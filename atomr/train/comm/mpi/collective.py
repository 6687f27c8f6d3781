"""`MpiCollective`: the `Collective` interface across the processes of an MPI job.

Every operation is one non-blocking MPI collective on raw numeric buffers
(mpi4py's uppercase, buffer API; nothing is pickled), on this rank's
`buffers[0]`, in place (`MPI.IN_PLACE`: no copies):

| operation | MPI call |
|---|---|
| `all_reduce` | `Iallreduce(IN_PLACE, buf, SUM)` |
| `reduce_scatter` | `Ireduce_scatter(IN_PLACE, buf, recvcounts, SUM)` |
| `all_gather` | `Iallgatherv(IN_PLACE, [buf, (counts, displs)])` |
| `broadcast` | `Ibcast(buf, root)` |
| `barrier` | `Ibarrier()` |

The dtypes are every collective's (`comm/collective.py`): float32 and
float64 for the sums, every bool, integer, float or complex dtype for the
copies. The counts of `reduce_scatter` and `all_gather` are the sizes of
`split_bounds(len, world_size)`, so the length need not be a multiple of
the world size. A rank may pass several local buffers: they are summed into
`buffers[0]` before a reduction, and receive `buffers[0]` after a gather or
broadcast (so none may overlap `buffers[0]`).

Operations run one at a time, in submission order, and never block the
event loop (`_driver.py`). Before each, the ranks check that they are all
at the same operation (and mean), for the same purpose (`_order.py`,
`comm/purpose.py`; `check_order=False` turns it off): if not, every rank
raises `CollectiveMismatchError` and none runs it. An operation not
complete `timeout` seconds after it started raises `CollectiveTimeoutError`
naming the ranks that never joined; an MPI error, or a peer's
`report_failure()`, raises `RankFailedError`. After any of
these the collective is broken (later calls raise at once): report the
error and call `abort()`, which ends the job through `MPI_Abort`. Naming
a missing rank needs `MPI_THREAD_MULTIPLE` (the `mpich` wheel gives it).

mpi4py is imported when the first `MpiCollective` is made, not when this
module is imported; without it the constructor raises an `ImportError` that
names the `atomr[mpi]` extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, NoReturn

import numpy as np

from atomr.actor.ref import check_timeout
from atomr.train.comm._checks import check_root
from atomr.train.comm.collective import Collective
from atomr.train.comm.mpi._abort import abort_job
from atomr.train.comm.mpi._buffers import (
    check_buffers,
    check_writable,
    distribution_work,
    reduction_work,
)
from atomr.train.comm.mpi._driver import OperationDriver
from atomr.train.comm.mpi._notes import FailureNotes
from atomr.train.comm.mpi._order import OrderCheck, signature_of
from atomr.train.comm.mpi.errors import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    RankFailedError,
)
from atomr.train.comm.mpi.job import DistributedTrainConfig
from atomr.train.comm.mpi.startup import import_mpi, open_communicators
from atomr.train.comm.mpi.watchdog import watch_launcher
from atomr.train.core.partition import split_bounds

__all__ = [
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "MpiCollective",
    "RankFailedError",
    "import_mpi",
]

_GRACE_S = 5.0  # the longest a failed rank waits for the others' notes


class MpiCollective(Collective):
    """The five collective operations across the processes of an MPI job.

    Every rank of the communicator must create its `MpiCollective` at the
    same point of the program (the constructor duplicates the communicator,
    a collective call) and then issue the same operations in the same order,
    with buffers of the same shape and dtype.

    Args:
        comm: an mpi4py communicator (default: `MPI.COMM_WORLD`).
        timeout: seconds an operation may take, from the moment it starts
            (after the operations queued before it), before it fails with
            `CollectiveTimeoutError` naming the ranks that never joined; None
            waits forever. It also bounds start-up (MPI's init and the
            communicator duplication, which wait for every rank): past it,
            this process writes which ranks never arrived to stderr and exits
            with `STARTUP_TIMEOUT_EXIT_CODE` (`startup.py`).
        check_order: check before each operation that every rank is at the
            same one (see the module docstring); False saves one
            small-message latency a call, and leaves ranks that issue
            different operations to MPI's undefined behaviour (wrong
            results, truncation, a hang). Must be the same on every rank.

    Raises:
        ImportError: mpi4py is not installed (`pip install -e '.[mpi]'`).
        TypeError: `timeout` is not a number of seconds or None (a bool is
            not), or `check_order` is not a bool.
        ValueError: `timeout` is not positive (NaN included) or infinite
            (None waits forever), or the ranks disagree on `check_order`
            (raised on every rank).
        RuntimeError: the MPI library gives less than
            `MPI_THREAD_SERIALIZED` (calls from a worker thread would be unsafe).
    """

    def __init__(
        self, comm: Any = None, *, timeout: float | None = 300.0, check_order: bool = True
    ) -> None:
        timeout = check_timeout(timeout, "timeout", finite=True)
        if not isinstance(check_order, bool):
            raise TypeError(f"check_order must be a bool, got {check_order!r}")
        watch_launcher()  # exit if the `atomr launch` that started this rank dies
        mpi, self._comm, self._ctl, level = open_communicators(comm, timeout, check_order)
        self._mpi = mpi
        self.rank: int = self._comm.Get_rank()
        self.world_size: int = self._comm.Get_size()
        self.timeout = timeout
        self._in_place, self._sum = mpi.IN_PLACE, mpi.SUM
        # a rank past its timeout waits grace_s for the others' notes, which the
        # loop's thread exchanges while the MPI thread waits: MULTIPLE only
        grace_s = _GRACE_S if timeout is None else min(max(timeout, 1.0), _GRACE_S)
        multiple = level >= mpi.THREAD_MULTIPLE
        self._notes = FailureNotes(mpi, self._ctl, enabled=multiple, grace_s=grace_s)
        check = OrderCheck(mpi, self._comm) if check_order and self.world_size > 1 else None
        self._driver = OperationDriver(mpi, self.rank, self.world_size, timeout, self._notes, check)

    @classmethod
    def from_config(
        cls, config: Any, comm: Any = None, *, check_order: bool = True
    ) -> MpiCollective:
        """A collective for a `DistributedTrainConfig`, checked against MPI.

        Args:
            config: the `DistributedTrainConfig` (its `collective_timeout` is used).
            comm: the communicator (default: `MPI.COMM_WORLD`).
            check_order: as for the class (the same on every rank).

        Raises:
            TypeError: `config` is not a `DistributedTrainConfig` (before
                MPI starts); as the class.
            ValueError: the config's rank / world size differ from MPI's; as
                the class (the ranks disagree on `check_order`).
            ImportError, RuntimeError: as the class.
        """
        if not isinstance(config, DistributedTrainConfig):
            raise TypeError(f"config must be a DistributedTrainConfig, got {type(config).__name__}")
        coll = cls(comm, timeout=config.collective_timeout, check_order=check_order)
        if (coll.rank, coll.world_size) != (config.rank, config.world_size):
            raise ValueError(
                f"config says rank {config.rank} of {config.world_size}, MPI says "
                f"rank {coll.rank} of {coll.world_size}"
            )
        return coll

    # -- the Collective interface ---------------------------------------------

    async def all_reduce(self, buffers: Sequence[Any] | np.ndarray, op: str = "sum") -> np.ndarray:
        """Sum (or average) this process's buffers with every other rank's, in place.

        The local buffers are first summed into `buffers[0]`, then one
        `Iallreduce(MPI.IN_PLACE)` sums `buffers[0]` across the ranks. Every
        rank ends with the same bits.

        Args:
            buffers: this process's contributions: a C-contiguous, writable
                float32 or float64 array, or a list of such arrays of one
                shape and dtype (every rank passing the same shape, dtype
                and number of buffers).
            op: "sum", or "mean" (the sum divided by the number of
                contributions, `world_size * len(buffers)`: the same on every rank).

        Returns:
            `buffers[0]` (the array itself when one array was given), holding
            the result.

        Raises:
            TypeError: not numpy arrays, or a dtype other than float32/float64.
            ValueError: no buffers, mixed shapes / dtypes, non-contiguous or
                read-only `buffers[0]`, another buffer overlapping
                `buffers[0]`, or an unknown `op`.
            CollectiveMismatchError: the ranks are at different operations,
                or means (none ran it; the collective is broken).
            CollectiveTimeoutError: the operation did not complete in time;
                names the ranks that never joined.
            RankFailedError: MPI reported a failure, or an earlier operation
                failed (the collective is broken).
        """
        bufs = check_buffers(buffers, sums=True)
        target = bufs[0]
        await self._driver.submit(
            "all_reduce",
            self._start_all_reduce,
            target,
            *reduction_work(bufs, op, self.world_size),
            signature=signature_of(target, mean=len(bufs) if op == "mean" else 0),
        )
        return target

    async def reduce_scatter(
        self, buffers: Sequence[Any] | np.ndarray, op: str = "sum"
    ) -> np.ndarray:
        """Sum (or average) over the ranks, this rank keeping its chunk of the sum.

        The local buffers are first summed into `buffers[0]`; then one
        `Ireduce_scatter(MPI.IN_PLACE)` leaves this rank's chunk of the
        group's sum (chunk `rank` of `split_bounds(len, world_size)`) at its
        own positions `lo:hi` of `buffers[0]`. The rest of `buffers[0]` is
        unspecified afterwards, and the other local buffers are unchanged.

        Args:
            buffers: as `all_reduce`, and flat (1-D).
            op: as `all_reduce` (a mean divides this rank's chunk).

        Returns:
            The view `buffers[0][lo:hi]` holding this rank's reduced chunk.

        Raises:
            TypeError, ValueError: as `all_reduce`; also buffers that are not
                1-D.
            CollectiveMismatchError, CollectiveTimeoutError, RankFailedError: as
                `all_reduce`.
        """
        bufs = check_buffers(buffers, sums=True, flat=True)
        target = bufs[0]
        bounds = split_bounds(target.size, self.world_size)
        lo, hi = bounds[self.rank]
        counts = [b - a for a, b in bounds]
        await self._driver.submit(
            "reduce_scatter",
            partial(self._start_reduce_scatter, counts=counts),
            target,
            *reduction_work(bufs, op, self.world_size, (lo, hi)),
            signature=signature_of(target, mean=len(bufs) if op == "mean" else 0),
        )
        return target[lo:hi]

    async def all_gather(self, buffers: Sequence[Any] | np.ndarray) -> None:
        """Give every rank every other rank's chunk, in place.

        Rank k contributes chunk k (`split_bounds(len, world_size)[k]`) of its
        `buffers[0]`; one `Iallgatherv(MPI.IN_PLACE)` fills the other chunks
        of `buffers[0]` from the other ranks, and the other local buffers
        then receive a copy of `buffers[0]`.

        Args:
            buffers: this process's buffers: a flat, C-contiguous, writable
                array of a bool, integer, float or complex dtype (native byte
                order), or a list of such arrays of one length and dtype.

        Raises:
            TypeError: not numpy arrays, or a dtype that is not copied (see
                `buffers`).
            ValueError: as `reduce_scatter`; also a read-only buffer.
            CollectiveMismatchError, CollectiveTimeoutError, RankFailedError: as
                `all_reduce`.
        """
        bufs = check_buffers(buffers, sums=False, flat=True)
        check_writable(bufs, "all_gather")
        bounds = split_bounds(bufs[0].size, self.world_size)
        layout = ([b - a for a, b in bounds], [a for a, _ in bounds])
        await self._driver.submit(
            "all_gather",
            partial(self._start_all_gather, layout=layout),
            bufs[0],
            *distribution_work(bufs),
            signature=signature_of(bufs[0]),
        )

    async def broadcast(self, buffers: Sequence[Any] | np.ndarray, root: int = 0) -> None:
        """Copy rank `root`'s `buffers[0]` into every buffer of every rank.

        Args:
            buffers: this process's buffers (an array or a list of arrays of
                one shape and dtype; the same shape and dtype on every rank),
                of a dtype `all_gather` takes.
            root: the rank whose `buffers[0]` is copied.

        Raises:
            IndexError: `root` is not a rank of the communicator.
            TypeError: `root` is not an integer (NumPy integers are, bools
                are not), or a dtype `all_gather` does not take.
            ValueError: as `all_reduce`; also a read-only buffer.
            CollectiveMismatchError, CollectiveTimeoutError, RankFailedError: as
                `all_reduce`.
        """
        root = check_root(root, self.world_size)
        bufs = check_buffers(buffers, sums=False)
        check_writable(bufs, "broadcast")
        await self._driver.submit(
            "broadcast",
            partial(self._start_broadcast, root=root),
            bufs[0],
            *distribution_work(bufs),
            signature=signature_of(bufs[0], root),
        )

    async def barrier(self, buffers: Sequence[Any] = ()) -> None:
        """Return once every rank has reached the barrier (`MPI_Ibarrier`).

        Args:
            buffers: ignored.

        Raises:
            CollectiveMismatchError, CollectiveTimeoutError, RankFailedError: as
                `all_reduce`.
        """
        await self._driver.submit(
            "barrier", self._start_barrier, None, signature=signature_of(None)
        )

    # -- lifecycle ----------------------------------------------------------------

    @property
    def broken(self) -> bool:
        """True once an operation has failed (every later call raises)."""
        return self._driver.broken is not None

    def abort(self, errorcode: int = 1, message: str | None = None, grace: float = 0.5) -> NoReturn:
        """End the whole MPI job: report `message`, then `MPI_Abort`.

        Use it after a `CollectiveError`: MPI cannot be finalised cleanly when
        a rank is gone, and a rank that never joined would otherwise keep the
        job alive. Does not return.

        Args:
            errorcode: the job's exit status, 0 to 255.
            message: printed to stderr first, prefixed with this rank.
            grace: seconds (finite, >= 0) to wait before aborting, so the
                other ranks' reports reach the log too.

        Raises:
            TypeError, ValueError: a bad `errorcode` or `grace` (nothing printed).
        """
        abort_job(self._mpi, self.rank, errorcode, message, grace)

    def report_failure(self) -> None:
        """Tell the other ranks that this one failed on its own and will issue
        no more operations: the first operation it did not complete here
        raises `RankFailedError` naming it on the others, within about 0.2 s
        of parking, instead of waiting out `timeout`. Below
        `MPI_THREAD_MULTIPLE` the notes go out from the MPI thread: call it
        from the loop's. Breaks this collective (an earlier error stays its
        error); blocks up to 1.5 s; raises nothing; harmless in a world of
        one, called again, or after a failure the others took part in."""
        broken = self._driver.broken
        if self._notes.will_announce(broken):  # below MULTIPLE: only the MPI thread calls MPI
            announce = partial(self._notes.announce_failure, broken, self._driver.completed)
            announce() if self._notes.enabled else self._driver.worker.call(announce, 1.5)
        if self._driver.broken is None:
            self._driver.broken = RankFailedError(
                f"rank {self.rank} reported a failure of its own", ranks=[self.rank]
            )

    def close(self) -> None:
        """Stop the MPI thread once its current call is done (a later
        operation starts a new one). Does nothing to the communicator."""
        self._driver.close()
        if self._driver.broken is None:
            self._notes.close()

    # -- the MPI calls ---------------------------------------------------------------

    def _start_all_reduce(self, target: np.ndarray) -> Any:
        if self.world_size == 1:
            return None
        return self._comm.Iallreduce(self._in_place, target, op=self._sum)

    def _start_reduce_scatter(self, target: np.ndarray, counts: list[int]) -> Any:
        if self.world_size == 1:
            return None
        return self._comm.Ireduce_scatter(self._in_place, target, counts, op=self._sum)

    def _start_all_gather(self, target: np.ndarray, layout: tuple[list[int], list[int]]) -> Any:
        if self.world_size == 1:
            return None
        return self._comm.Iallgatherv(self._in_place, [target, layout])

    def _start_broadcast(self, buffer: np.ndarray, root: int) -> Any:
        return self._comm.Ibcast(buffer, root=root) if self.world_size > 1 else None

    def _start_barrier(self, _: None) -> Any:
        return self._comm.Ibarrier() if self.world_size > 1 else None
