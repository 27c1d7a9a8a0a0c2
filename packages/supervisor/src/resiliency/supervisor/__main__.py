"""``python -m resiliency.supervisor`` runs ``resiliency-supervisor``."""

import sys

from resiliency.supervisor.cli import main

sys.exit(main())
