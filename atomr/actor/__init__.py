"""The actor runtime: actors, refs, props, supervision, mailboxes, timers, routers.

The runtime logs on the ``atomr`` logger tree (its ``NullHandler`` is added
by the ``atomr`` package).
"""

from .actor import Actor
from .context import Context
from .dead_letters import DeadLetters
from .errors import (
    ActorNameTakenError,
    ActorStoppedError,
    AskTimeoutError,
    AtomrError,
    InvalidActorNameError,
    MailboxFullError,
)
from .mailbox import BoundedMailbox, Mailbox, OverflowPolicy
from .messages import DeadLetter, PoisonPill, ReceiveTimeout, Terminated
from .props import Props
from .ref import DEFAULT_ASK_TIMEOUT, ActorRef
from .reply import Failure, Reply, actor_failed, not_handled
from .router import BroadcastPool, RoundRobinPool
from .runner import run
from .supervision import (
    AllForOneStrategy,
    Directive,
    OneForOneStrategy,
    SupervisorStrategy,
)
from .system import ActorSystem
from .timers import Cancellable

__all__ = [
    "DEFAULT_ASK_TIMEOUT",
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
    "actor_failed",
    "not_handled",
    "run",
]
