"""``HookLock`` for the facade's modules: it lives in ``bolide.facade.support``."""

from bolide.facade.support import HookLock

__all__ = ["HookLock"]
