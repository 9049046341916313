"""A sandbox for model-written code: bubblewrap namespaces, rlimits (prlimit) and a libseccomp filter.

- :mod:`~hybridflow.sandbox.limits`: :class:`SandboxLimits`, :class:`SandboxResult`, :class:`Outcome`,
  :class:`SandboxUnavailableError`;
- :mod:`~hybridflow.sandbox.runner`: :class:`Sandbox`, which runs code;
- :mod:`~hybridflow.sandbox.seccomp`: the system-call filter;

See docs/sandbox.md.
"""

from hybridflow.sandbox.limits import Outcome, SandboxLimits, SandboxResult, SandboxUnavailableError
from hybridflow.sandbox.runner import Sandbox

__all__ = ["Outcome", "Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailableError"]
