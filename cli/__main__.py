"""``python -m bolide.cli``."""

import sys

from bolide.cli.main import main

sys.exit(main())
