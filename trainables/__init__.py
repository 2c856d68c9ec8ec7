"""Ray Tune adapters around the engine (thin: no model, data or search code here)."""
