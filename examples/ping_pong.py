"""Two actors play ping-pong; the game ends after a number of rounds.

Run: python examples/ping_pong.py   (prints "pong 1" ... and "done after 5 rounds")
"""

from __future__ import annotations

import argparse
from typing import Any

import atomr
from atomr import Actor, ActorRef, ActorSystem, Props


class Ponger(Actor):
    def receive(self, message: Any) -> Any:
        kind, n = message
        sender = self.context.sender
        if sender is not None:
            sender.tell(("pong", n), sender=self.context.self_ref)


class Pinger(Actor):
    def __init__(self, ponger: ActorRef, rounds: int) -> None:
        super().__init__()
        self.ponger = ponger
        self.rounds = rounds

    def receive(self, message: Any) -> Any:
        if message == "start":
            self.finished = self.context.defer()  # answered when the game ends
            self.ponger.tell(("ping", 1), sender=self.context.self_ref)
            return None
        _, n = message
        print(f"pong {n}")
        if n == self.rounds:
            self.finished.set_result(n)
        else:
            self.ponger.tell(("ping", n + 1), sender=self.context.self_ref)
        return None


async def main(rounds: int = 5) -> int:
    async with ActorSystem("ping-pong") as system:
        ponger = system.spawn(Props(Ponger), name="ponger")
        pinger = system.spawn(Props(Pinger, ponger, rounds), name="pinger")
        played: int = await pinger.ask("start", timeout=5)
    print(f"done after {played} rounds")
    return played


if __name__ == "__main__":
    argparse.ArgumentParser(  # --help prints the docstring; it takes no options
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    atomr.run(main())
