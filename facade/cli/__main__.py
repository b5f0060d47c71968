"""``python -m bolide.facade.cli``."""

import sys

from bolide.facade.cli.main import main

sys.exit(main())
