"""`ShardLossStrategy`: how the parameter-server trainer supervises its
children, recording a server shard's restart (its state lost)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from atomr.actor import ActorRef, Directive, OneForOneStrategy
from atomr.train._recovery import StateLossWatch, state_keeping_decider

__all__ = ["ShardLossStrategy"]


class ShardLossStrategy(OneForOneStrategy):
    """`state_keeping_decider` for every child; a server shard's failure goes
    through `watch.decide` too, which records its restart (the shard's index
    named), so that the trainer refuses to train on its reset state. A
    worker's restart is not recorded: it keeps no state between batches.

    Args:
        watch: the trainer's watch.
        servers: gives the server shards' refs, in range order.
    """

    def __init__(self, watch: StateLossWatch, servers: Callable[[], Sequence[ActorRef]]) -> None:
        super().__init__(decider=state_keeping_decider)
        self._watch = watch
        self._servers = servers

    def directive_for(self, child: ActorRef, error: BaseException) -> Directive:
        """The directive for `child`'s failure (`state_keeping_decider`)."""
        for k, server in enumerate(self._servers()):
            if server is child:
                return self._watch.decide(error, k)
        return self.decide(error)
