"""A Medusa decoding engine of our own: Llama-family models, Medusa heads, tree verification."""

from .config import ModelArgs, ModelLoadError
from .engine import Engine, GenerationError, Result, StepEvent, load
from .heads import MedusaHeads

__all__ = ["Engine", "GenerationError", "MedusaHeads", "ModelArgs", "ModelLoadError", "Result", "StepEvent", "load"]
