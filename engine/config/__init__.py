"""The experiment configuration: its sections, the schedule union, its building blocks, and pydantic's errors
turned into (field, value, allowed) problems."""

from engine._moved import package_getattr

__getattr__ = package_getattr(__name__)  # the old module engine.config's names, with a DeprecationWarning
