"""A Medusa decoding engine of our own: Llama-family models, Medusa heads, tree verification."""

from .config import ModelArgs, ModelLoadError
from .engine import Engine, EngineBusy, Result, load
from .generation import GenerationConfig, GenerationError
from .heads import MedusaHeads
from .trace import StepEvent

__all__ = ["Engine", "EngineBusy", "GenerationConfig", "GenerationError", "MedusaHeads", "ModelArgs", "ModelLoadError", "Result",
           "StepEvent", "load"]
