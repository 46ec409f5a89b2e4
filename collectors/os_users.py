"""Names of this machine's users and groups, where the OS has POSIX ones (``pwd``/``grp``; Windows has neither).

Each function says "unknown" (None, or the number as text) rather than fail where the module is missing, so
every caller works on every OS; the modules are imported where used, so that this one imports everywhere.
"""

from __future__ import annotations

import os


def user_name(uid: int | None) -> str:
    """The login name of ``uid``; "uid N" when it has none or the OS keeps no such table; "an unknown user" for None."""
    if uid is None:
        return "an unknown user"
    try:
        import pwd
    except ImportError:
        return f"uid {uid}"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def group_name(gid: int) -> str | None:
    """The name of group ``gid``; None when it has none or the OS has no group table."""
    try:
        import grp
    except ImportError:
        return None
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


def group_members(gid: int) -> list[str] | None:
    """The users listed as members of group ``gid``; None when unknown."""
    try:
        import grp
    except ImportError:
        return None
    try:
        return list(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return None


def group_id(name: str) -> int | None:
    """The number of group ``name``; None when there is none (or no group table)."""
    try:
        import grp
    except ImportError:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def effective_uid() -> int | None:
    """This process's effective uid; None where the OS has no uids (Windows)."""
    geteuid = getattr(os, "geteuid", None)
    return geteuid() if geteuid is not None else None
