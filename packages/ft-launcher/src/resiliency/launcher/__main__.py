"""``python -m resiliency.launcher``: the same as the ``ft-launcher`` command."""

import sys

from resiliency.launcher.cli import main

sys.exit(main())
