"""fedclock — federated learning on slow, busy and unreliable devices, on a virtual clock."""

__version__ = "0.7.0"
