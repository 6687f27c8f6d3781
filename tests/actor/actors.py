"""Small actors shared by the runtime tests."""

from __future__ import annotations

from typing import Any

from atomr import Actor, ActorRef


class Echo(Actor):
    """Answers with the message; raises it if it is an exception."""

    def receive(self, message: Any) -> Any:
        if isinstance(message, BaseException):
            raise message
        return message


class Forwarder(Actor):
    """Tells every message (and lifecycle events, as tuples) to ``target``."""

    def __init__(self, target: ActorRef, tag: str = "") -> None:
        super().__init__()
        self.target = target
        self.tag = tag

    def pre_start(self) -> None:
        self.target.tell(("pre_start", self.tag))

    def post_stop(self) -> None:
        self.target.tell(("post_stop", self.tag))

    def receive(self, message: Any) -> Any:
        if isinstance(message, BaseException):
            raise message
        self.target.tell(message)
        return message
