"""The tiered engine: a node-local tier replicated to a peer node, over a persistent engine."""
