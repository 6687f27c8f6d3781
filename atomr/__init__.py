"""atomr: an asyncio actor runtime hosting distributed-training actors.

This module re-exports the runtime (``atomr.actor``). The device and training
layers live in ``atomr.accel`` and ``atomr.train`` and are imported explicitly.

``import atomr`` loads nothing else: the runtime (and asyncio under it) is
imported the first time one of its names is used (PEP 562), so a program or
CLI that only asks for ``atomr.__version__`` pays for the package alone.

atomr logs on the ``atomr`` logger tree, which carries a ``NullHandler`` as a
library's should: nothing is printed until the application configures logging.
"""

import importlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .actor import (
        DEFAULT_ASK_TIMEOUT,
        Actor,
        ActorNameTakenError,
        ActorRef,
        ActorStoppedError,
        ActorSystem,
        AllForOneStrategy,
        AskTimeoutError,
        AtomrError,
        BoundedMailbox,
        BroadcastPool,
        Cancellable,
        Context,
        DeadLetter,
        DeadLetters,
        Directive,
        Failure,
        InvalidActorNameError,
        Mailbox,
        MailboxFullError,
        OneForOneStrategy,
        OverflowPolicy,
        PoisonPill,
        Props,
        ReceiveTimeout,
        Reply,
        RoundRobinPool,
        SupervisorStrategy,
        Terminated,
        run,
    )

__version__ = "0.1.0"

logging.getLogger("atomr").addHandler(logging.NullHandler())

__all__ = [
    "Actor",
    "ActorNameTakenError",
    "ActorRef",
    "ActorStoppedError",
    "ActorSystem",
    "AllForOneStrategy",
    "AskTimeoutError",
    "AtomrError",
    "BoundedMailbox",
    "BroadcastPool",
    "Cancellable",
    "Context",
    "DEFAULT_ASK_TIMEOUT",
    "DeadLetter",
    "DeadLetters",
    "Directive",
    "Failure",
    "InvalidActorNameError",
    "Mailbox",
    "MailboxFullError",
    "OneForOneStrategy",
    "OverflowPolicy",
    "PoisonPill",
    "Props",
    "ReceiveTimeout",
    "Reply",
    "RoundRobinPool",
    "SupervisorStrategy",
    "Terminated",
    "__version__",
    "run",
]


def __getattr__(name: str) -> object:
    """Import the runtime on the first use of one of its names.

    Raises:
        AttributeError: ``name`` is not one of atomr's public names.
    """
    if name not in __all__:
        raise AttributeError(f"module 'atomr' has no attribute {name!r}")
    value = getattr(importlib.import_module("atomr.actor"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
