"""The words of a gated run's settings, defined once and free of torch (methods.md §6.3, §6.4): the config
(engine.config.gated_schedule) takes its Literal types from these without importing the gated model, so reading and
checking a config or a sweep spec never loads torch; the gated model and the cost bases hold their arguments to
the same tuples."""

EXECUTIONS = ("masked", "routed", "conv")
ROUTED_ESTIMATORS = ("skip", "sampled", "grouped", "exact")
ROUTED_STATISTICS = ("computed", "batch")
OPTION_STATES = ("shared", "skip_apart", "per_option")

COST_BASES = ("gated", "model")
BASIS_WORDS = {"gated": "over the gated blocks", "model": "over the whole model (every layer and the gate)"}
