"""resiliency.ft: see packages/ft-core/README.md."""

__all__: list[str] = []
