"""Live capture: the engines' socket, the receiver, its checks, and the Prometheus exporter."""
