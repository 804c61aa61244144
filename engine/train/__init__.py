"""Tools that train models and heads (tools import the runtime, never the reverse)."""
