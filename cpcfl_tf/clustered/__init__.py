"""Clustered federated learning: the algorithm, training backends, the simulator, metrics."""
