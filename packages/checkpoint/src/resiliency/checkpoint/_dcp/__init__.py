"""What the rank and its writer process share: DCP planning, its JSON codec, the staging arena."""
