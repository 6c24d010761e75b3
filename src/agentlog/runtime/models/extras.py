"""The optional extras of the agentlog distribution, and the command that installs a missing one.

A hint must work however agentlog was installed: from a checkout, a git URL or a wheel (it is on
no package index, so `pip install 'agentlog[anthropic]'` would find nothing, or somebody else's
package). So `install_hint` names the extra's own requirements, read from the installed
distribution's metadata: `pip install 'anthropic>=0.40'` installs what the extra would, into
whatever environment runs agentlog.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex

from agentlog.eventlog.errors import AgentlogError

__all__ = ["MissingExtra", "extra_requirements", "install_hint"]

DISTRIBUTION = "agentlog"


def extra_requirements(extra: str) -> list[str]:
    """The requirements the installed agentlog lists for `extra` (`["anthropic>=0.40"]`), in
    the order of its metadata; empty when the distribution or the extra is unknown."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    marker = re.compile(rf"""\bextra\s*==\s*["']{re.escape(extra)}["']""")
    found = []
    for line in requires:
        requirement, _, condition = line.partition(";")
        if marker.search(condition):
            found.append(requirement.strip())
    return found


def install_hint(extra: str) -> str:
    """The command that installs `extra` into the environment agentlog runs from, e.g.
    `pip install 'anthropic>=0.40' (agentlog's "anthropic" extra)`."""
    requirements = extra_requirements(extra)
    if not requirements:  # no metadata (a source tree on sys.path): the extra's own name
        return f"pip install 'agentlog[{extra}]'"
    return f"pip install {' '.join(shlex.quote(r) for r in requirements)} (agentlog's {extra!r} extra)"


class MissingExtra(AgentlogError):
    """A feature needs an extra that is not installed; the message names the command that
    installs it (`install_hint`)."""

    code = "missing_extra"

    def __init__(self, extra: str, feature: str, error: ImportError) -> None:
        self.extra = extra
        super().__init__(f"{feature} needs agentlog's {extra!r} extra ({error}): {install_hint(extra)}")
