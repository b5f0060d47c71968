"""``Closing`` for the facade's modules: it lives in ``bolide.facade.support``."""

from bolide.facade.support import Closing

__all__ = ["Closing"]
