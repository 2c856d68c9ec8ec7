"""The experiment configuration: its sections, the schedule union, its building blocks, and pydantic's errors
turned into (field, value, allowed) problems."""

from engine.config.experiment import ExperimentConfig, load_config, parse_config

__all__ = ["ExperimentConfig", "load_config", "parse_config"]
