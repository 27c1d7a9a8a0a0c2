"""resiliency.launcher: see packages/ft-launcher/README.md."""

__all__: list[str] = []
