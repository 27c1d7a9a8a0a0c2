"""``python -m resiliency.goodput`` is ``resiliency-goodput``."""

import sys

from resiliency.goodput.cli import main

sys.exit(main())
