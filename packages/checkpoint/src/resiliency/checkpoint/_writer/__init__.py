"""The persistent writer process of each rank, its client, and the protocol between them."""
