"""``python -m resiliency.launcher``: the same as the ``ft-launcher`` command."""

from resiliency.launcher.cli import run

run()
