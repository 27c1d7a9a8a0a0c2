"""resiliency.ptl: see packages/ptl-resiliency/README.md."""

__all__: list[str] = []
