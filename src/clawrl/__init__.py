"""clawrl: an agent that improves by being used."""

__version__ = "0.1.0"
