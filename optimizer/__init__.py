"""vLLM parameter optimizer: Optuna studies whose trials boot real vLLM servers as Ray tasks."""

__version__ = "0.1.0"
