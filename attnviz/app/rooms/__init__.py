"""Rooms: a presenter drives one view, any number of screens follow it, across replicas and machines.

The app's pages use only the functions here; none of them talks to a store. The store is the one
the operator's configuration names (`attnviz.app.rooms.settings`): a SQLite file in WAL mode on
one machine (the default), Redis where ``ATTNVIZ_ROOMS_URL=redis://...`` is set.

- `open_room` (presenter): a `Room`, its code to show and the secret to keep in the session;
- `publish` (presenter, with the secret): the view's new version;
- `unwritten` (presenter): None, or one line while a change of the presenter's waits to be written again;
- `resume` (presenter, with the secret): the `Room` again, in a new session of the same tab;
- `read` (follower): a `RoomView`, the presenter's latest view and how many screens follow;
- `follow` (follower, about once a second): the heartbeat that counts a screen;
- `end` (presenter, with the secret);
- `store_status`: None when rooms work, else one line to show.

Every failure a visitor can meet is a `RoomError` (an `attnviz.errors.InputError`) whose
message is one line: a malformed, unknown, ended or expired code, a wrong secret, a bound reached,
or a store that does not answer.
"""

from __future__ import annotations

from attnviz.app.rooms.room import Room, RoomError, Rooms, RoomView, check_state, normal_code
from attnviz.app.rooms.settings import FOLLOW_WINDOW_S, Limits, store

__all__ = [
    "FOLLOW_WINDOW_S",
    "Limits",
    "Room",
    "RoomError",
    "RoomView",
    "Rooms",
    "check_state",
    "end",
    "follow",
    "normal_code",
    "open_room",
    "publish",
    "read",
    "resume",
    "store_status",
    "unwritten",
]

ROOMS = Rooms(store)  # the server's rooms, in the store its configuration names


def open_room(state: dict) -> Room:
    """A new room showing ``state`` (its code and the presenter's secret); `RoomError` at the operator's bounds."""
    return ROOMS.open_room(state)


def publish(code: str, secret: str, state: dict) -> int:
    """The room's version once ``state`` is its view; `RoomError` on a wrong secret, an ended or unknown room."""
    return ROOMS.publish(code, secret, state)


def unwritten(code: str) -> str | None:
    """None, or one line for the presenter while a change of theirs to room ``code`` failed to be written and waits
    to be tried again (in this process: the replica that holds the presenter's session)."""
    return ROOMS.unwritten(code)


def resume(code: str, secret: str) -> Room:
    """The presenter's `Room` in a new session (a reload, a restarted replica); `RoomError` as `publish`."""
    return ROOMS.resume(code, secret)


def read(code: str) -> RoomView:
    """The room's latest view; `RoomError` for a malformed, unknown, ended or expired code."""
    return ROOMS.read(code)


def follow(code: str, follower: str) -> None:
    """Count ``follower`` (an opaque session id) as following ``code``; `RoomError` as `read` does, or if full."""
    ROOMS.follow(code, follower)


def end(code: str, secret: str) -> None:
    """End the room; `RoomError` on a wrong secret or an unknown room."""
    ROOMS.end(code, secret)


def store_status() -> str | None:
    """None when the rooms' store answers; else one line saying rooms are unavailable now."""
    return ROOMS.store_status()
