"""Creating an actor: its name, its place under its supervisor, its start."""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING, Any

from .actor import Actor
from .cell import ActorCell
from .errors import ActorNameTakenError, InvalidActorNameError
from .props import Props
from .ref import ActorRef

if TYPE_CHECKING:
    from .supervise import Supervisor
    from .system import ActorSystem

__all__ = ["check_name", "spawn_cell"]


MAX_NAME_LENGTH = 255
"""The longest actor name (a path element; errors and logs repeat it)."""


def check_name(name: Any, what: str = "actor name", *, leading_dollar: bool = False) -> str:
    """The rule of a path element: an actor's name, or a system's (``what``,
    for the messages), which may start with '$' (``leading_dollar``; an
    actor's may not: spawn makes up names that do).

    Raises:
        InvalidActorNameError: for a name that is not a str, is empty, '.' or
            '..', longer than ``MAX_NAME_LENGTH``, has '/', '#', '?', control
            or format characters or surrounding spaces, or a leading '$'
            (unless ``leading_dollar``).
    """
    if not isinstance(name, str):
        raise InvalidActorNameError(f"{what} must be a str, got {type(name).__name__}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidActorNameError(
            f"{what} {name[:40]!r}... is {len(name)} characters long; "
            f"at most {MAX_NAME_LENGTH} are allowed"
        )
    generated = not leading_dollar
    if (
        not name
        or name in (".", "..")
        or (generated and name.startswith("$"))
        or name != name.strip()
        or any(c in _PATH_MARKS or unicodedata.category(c)[0] == "C" for c in name)
    ):
        raise InvalidActorNameError(
            f"invalid {what} {name!r}: non-empty, not '.' or '..', no '/', '#' or '?', "
            "no control or format characters (a newline, NUL, a direction mark), no "
            "surrounding spaces"
            + (", no leading '$' (reserved for generated names)" if generated else "")
        )
    return name


_PATH_MARKS = frozenset("/#?")
"""Characters with a meaning in an actor path (`atomr://system/user/a/b`)."""


_CREATING = "raised while creating"


def spawn_cell(
    system: ActorSystem,
    supervisor: Supervisor,
    parent: ActorCell | None,
    props: Props,
    name: str | None,
    base_path: str,
) -> ActorRef:
    """Create, register and start an actor; returns its ref at once.

    Raises:
        TypeError: if ``props`` is not ``Props``.
        InvalidActorNameError, ActorNameTakenError: for a bad or taken name.
    """
    if not isinstance(props, Props):
        hint = ""
        if isinstance(props, type) and issubclass(props, Actor):
            hint = f"; wrap the class: Props({props.__name__})"
        raise TypeError(f"spawn expects Props, got {type(props).__name__}{hint}")
    if name is None:
        system._name_counter += 1
        name = f"${system._name_counter}"
    else:
        check_name(name)
    if name in supervisor.children:
        raise ActorNameTakenError(f"an actor named {name!r} already exists under {base_path}")
    path = f"{base_path}/{name}"
    try:
        cell = ActorCell(system, props, name, path, parent, supervisor)
    except Exception as error:
        notes = getattr(error, "__notes__", ())
        if not any(note.startswith(_CREATING) for note in notes):  # the innermost one names all
            error.add_note(f"{_CREATING} {path} ({props.class_name})")
        raise
    supervisor.children[name] = cell
    cell.start()
    return cell.ref
